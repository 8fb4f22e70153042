"""Run test bodies on threads of their own (M8 tests: requests at once) and collect what they raised.

Every thread here runs with the intra-op thread count of the test's thread (`computing_thread`):
a reference computed there and a request computed here round alike (issue 31)."""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence

from mizuoto_runtime.memory.intra_op import computing_thread
from mizuoto_runtime.memory.slots import DeviceSlots


def run_on_threads(bodies: Sequence[Callable[[], None]], timeout_s: float = 300.0) -> list[BaseException]:
    """Start every body on its own thread, wait for all; what they raised (none hangs)."""
    raised: list[BaseException] = []

    def guarded(body: Callable[[], None]) -> None:
        try:
            body()
        except BaseException as exc:  # noqa: BLE001 - handed to the test, which reports it
            raised.append(exc)

    workers = [computing_thread(guarded, body) for body in bodies]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout_s)
    assert not any(w.is_alive() for w in workers), "a thread did not finish"
    return raised


@contextlib.contextmanager
def another_request_holding(slots: DeviceSlots, timeout_s: float = 60.0) -> Iterator[None]:
    """For the block, another request (a thread of its own) holds one of the device's slots."""
    holding, done = threading.Event(), threading.Event()

    def other_request() -> None:
        slots.take(None, timeout_s)
        holding.set()
        done.wait(timeout_s)
        slots.give()

    other = computing_thread(other_request)
    other.start()
    assert holding.wait(timeout_s), "the other request got no slot"
    try:
        yield
    finally:
        done.set()
        other.join(timeout_s)
