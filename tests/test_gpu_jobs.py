"""M8: with gpu_jobs > 1, a request whose minimum working set does not fit waits for another
request to release its components (threads on the simulated device)."""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from conftest import make_manager
from models import TinyLM
from mizuoto_runtime import CancelledError, ModelManager


def setup(gpu_jobs: int, wait_s: float = 5.0) -> tuple[ModelManager, object, object]:
    m = make_manager(20, gpu_jobs=gpu_jobs)
    m.wait_timeout_s = wait_s
    first = m.register(TinyLM(layers=5), engine="a", name="first", kind="sequence")  # 16.3 MB
    second = m.register(TinyLM(layers=4), engine="b", name="second", kind="sequence")  # min set 3.5 MB
    return m, first, second


def hold(m: ModelManager, handle: object, entered: threading.Event, release: threading.Event) -> None:
    with m.request().use([handle], 0, "hold"):  # type: ignore[list-item]
        entered.set()
        release.wait(5)


@contextlib.contextmanager
def held_by_another_request(m: ModelManager, handle: object) -> Iterator[threading.Event]:
    """Another request holds `handle` in use until the yielded event is set (or the block ends)."""
    entered, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold, args=(m, handle, entered, release))
    holder.start()
    entered.wait(5)
    try:
        yield release
    finally:
        release.set()
        holder.join(5)


def test_second_request_waits_for_the_first_to_release() -> None:
    m, first, second = setup(gpu_jobs=2)
    order: list[str] = []
    with held_by_another_request(m, first) as release:
        threading.Timer(0.4, lambda: (order.append("released"), release.set())).start()
        with m.request().use([second], 2 << 20, "p"):
            order.append("placed")
            assert first.in_use == 0  # it got room only after the first request let go
    assert order == ["released", "placed"]
    assert second.is_whole


def test_single_job_does_not_wait() -> None:
    m, first, second = setup(gpu_jobs=1)
    with held_by_another_request(m, first):
        started = time.monotonic()
        with m.request().use([second], 2 << 20, "p"):  # tried at once, at the minimum working set (M7)
            assert len(second.streamed_units) == len(second.units)
        assert time.monotonic() - started < 2.0  # a wait would last until the holder lets go (5 s)


def test_waiting_checks_for_cancellation() -> None:
    m, first, second = setup(gpu_jobs=2)
    deadline = time.monotonic() + 0.3

    def cancel() -> None:
        if time.monotonic() > deadline:
            raise CancelledError("interrupted")

    with held_by_another_request(m, first), pytest.raises(CancelledError):
        with m.request(cancel_check=cancel).use([second], 2 << 20, "p"):
            pass
    assert second.in_use == 0


def test_waiting_gives_up_after_the_timeout_and_tries() -> None:
    m, first, second = setup(gpu_jobs=2, wait_s=0.3)
    with held_by_another_request(m, first):
        started = time.monotonic()
        with m.request().use([second], 2 << 20, "p"):  # after 0.3 s it tries, at the minimum
            assert first.in_use == 1 and len(second.streamed_units) == len(second.units)
        assert 0.25 < time.monotonic() - started < 3
