"""M8, M60: `compute.gpu_jobs = N` — at most N requests hold a device at once, the next waits
(cancellably, within the bound) for a slot; with gpu_jobs > 1, a request whose minimum working
set does not fit waits for another request to release its components; `exclusive` takes every
slot (threads on the simulated device)."""
from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from mizuoto_runtime import CancelledError, MizuotoError, ModelHandle, ModelManager

from conftest import make_manager
from support.models import TinyLM
from support.threads import run_on_threads

CPU = torch.device("cpu")


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


def test_single_job_means_one_request_holds_the_device() -> None:
    """gpu_jobs = 1: the second request waits for the first's phase to end, then places whole."""
    m, first, second = setup(gpu_jobs=1)
    order: list[str] = []
    with held_by_another_request(m, first) as release:
        threading.Timer(0.4, lambda: (order.append("released"), release.set())).start()
        with m.request().use([second], 2 << 20, "p"):
            order.append("placed")
            assert m.slots(CPU).holders() == 1
    assert order == ["released", "placed"] and second.is_whole


def test_gpu_jobs_slots_admit_n_requests_at_once() -> None:
    m, first, second = setup(gpu_jobs=2)
    third = m.register(TinyLM(layers=1), engine="c", name="third", kind="sequence")
    with held_by_another_request(m, first), held_by_another_request(m, second) as release:
        assert m.slots(CPU).holders() == 2
        threading.Timer(0.4, release.set).start()
        started = time.monotonic()
        with m.request().use([third], 0, "p"):  # a third request waits for a slot
            assert time.monotonic() - started > 0.3
    assert m.slots(CPU).holders() == 0


def test_waiting_for_a_slot_checks_for_cancellation() -> None:
    m, first, second = setup(gpu_jobs=1)
    deadline = time.monotonic() + 0.3

    def cancel() -> None:
        if time.monotonic() > deadline:
            raise CancelledError("interrupted")

    with held_by_another_request(m, first), pytest.raises(CancelledError):
        with m.request(cancel_check=cancel).use([second], 0, "p"):
            pass
    assert second.in_use == 0 and second.loaded_bytes == 0 and m.slots(CPU).holders() == 0


def test_phases_nested_on_one_thread_share_its_slot() -> None:
    """A request started inside another's phase on the same thread never waits on itself."""
    m, first, second = setup(gpu_jobs=1)
    with m.request().use([first], 0, "outer"), m.request().use([second], 0, "inner"):
        assert m.slots(CPU).holders() == 1
    assert m.slots(CPU).holders() == 0


def test_two_threads_with_one_job_never_run_out_of_memory() -> None:
    """Two threads on a device that fits one of their models at a time: with gpu_jobs = 1
    they take turns, so nothing runs out of memory and nothing is retried (issue 10, item 4)."""
    m = make_manager(14, gpu_jobs=1)
    plain = TinyLM(layers=4)  # 13 MB: whole, it leaves no room for the other's minimum
    prompt = torch.tensor([[1, 2]])
    expected = plain.generate(prompt, 3, torch.Generator().manual_seed(0))
    handles = [m.register(copy.deepcopy(plain), engine=f"e{i}", name="lm", kind="sequence") for i in range(2)]
    outcomes: list[tuple[bool, int]] = []

    def run(h: ModelHandle) -> None:
        for _ in range(6):
            ctx = m.request()
            got = ctx.run("gen", [h], lambda: h.module.generate(prompt, 3, torch.Generator().manual_seed(0)))
            outcomes.append((torch.equal(got, expected), ctx.meta["applied"]["oom_retries"]))

    assert run_on_threads([lambda h=h: run(h) for h in handles]) == []
    assert outcomes == [(True, 0)] * 12
    assert m.devices.peak_counted_bytes(CPU) <= 14 << 20


def test_exclusive_takes_every_slot_and_moves_idle_components_off() -> None:
    """M60: `exclusive` waits for the running requests, keeps new ones out, and moves every
    idle component off the device; requests run again once it ends."""
    m, first, second = setup(gpu_jobs=2)
    with m.request().use([second], 0, "p"):
        pass
    assert second.loaded_bytes > 0
    order: list[str] = []
    with held_by_another_request(m, first) as release:
        threading.Timer(0.3, lambda: (order.append("released"), release.set())).start()
        with m.exclusive(CPU, who="a training job"):
            order.append("exclusive")
            assert m.devices.counted_bytes(CPU) == 0  # every idle component moved off (M34)
            waiter = threading.Thread(target=lambda: hold_once(m, second, order))
            waiter.start()
            time.sleep(0.3)
            assert order == ["released", "exclusive"]  # the request waits for the job
            order.append("job done")
        waiter.join(5)
    assert order == ["released", "exclusive", "job done", "request ran"]


def hold_once(m: ModelManager, handle: ModelHandle, order: list[str]) -> None:
    with m.request().use([handle], 0, "after"):
        order.append("request ran")


def test_exclusive_gives_up_with_an_error_naming_the_holders() -> None:
    m, first, _ = setup(gpu_jobs=2)
    with held_by_another_request(m, first):
        with pytest.raises(MizuotoError, match="still used by 1 request"):
            with m.exclusive(CPU, timeout_s=0.3):
                pass
    m.wait_timeout_s = 0.3
    with m.exclusive(CPU):  # nothing runs now: taken at once; a request gives up, naming the job
        raised = run_on_threads([lambda: hold_once(m, first, [])])
        assert len(raised) == 1 and isinstance(raised[0], MizuotoError)


def test_exclusive_is_refused_inside_a_phase_and_is_cancellable() -> None:
    m, first, second = setup(gpu_jobs=2)
    with m.request().use([first], 0, "p"), pytest.raises(MizuotoError, match="from inside a phase"):
        with m.exclusive(CPU):
            pass
    deadline = time.monotonic() + 0.3

    def cancel() -> None:
        if time.monotonic() > deadline:
            raise CancelledError("interrupted")

    with held_by_another_request(m, first), pytest.raises(CancelledError):
        with m.exclusive(CPU, cancel_check=cancel):
            pass
    with m.request().use([second], 0, "p"):  # a cancelled wait keeps nobody out
        pass


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


def test_a_nested_phase_never_waits_for_its_own_thread() -> None:
    """gpu_jobs > 1: a phase nested in another on the same thread, whose component does not fit
    beside what the outer phase holds, is placed at once (at its minimum) — the request holding
    the device is itself, so there is nobody to wait for."""
    m, first, second = setup(gpu_jobs=2, wait_s=30)
    started = time.monotonic()
    with m.request().use([first], 0, "outer"):
        assert first.is_whole
        with m.request().use([second], 1 << 20, "inner"):
            assert second.loaded_bytes > 0 and time.monotonic() - started < 10
    assert first.in_use == second.in_use == 0


def test_a_phase_still_waits_for_another_threads_phase_when_nested_in_its_own() -> None:
    """What another request holds is still waited for, also from inside a phase of one's own."""
    m, first, second = setup(gpu_jobs=2)
    third = m.register(TinyLM(layers=1), engine="c", name="third", kind="sequence")
    order: list[str] = []
    with held_by_another_request(m, first) as release:
        threading.Timer(0.4, lambda: (order.append("released"), release.set())).start()
        with m.request().use([third], 0, "outer"), m.request().use([second], 2 << 20, "inner"):
            order.append("placed")
    assert order == ["released", "placed"]
