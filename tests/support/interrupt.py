"""A host that interrupts a request: the (cancel_check, on_progress) pair an engine is given."""
from __future__ import annotations

from collections.abc import Callable

from mizuoto_runtime import CancelledError


def interrupt_at(step: int) -> tuple[Callable[[], None], Callable[[int, int], None]]:
    """`cancel_check` raises `CancelledError` once `on_progress` has reported `step` done."""
    stop = {"now": False}

    def cancel_check() -> None:
        if stop["now"]:
            raise CancelledError("interrupted")

    def progress(done: int, _total: int) -> None:
        stop["now"] = done >= step

    return cancel_check, progress
