"""What a request is charged lives in the request (issue 9, item 2; M23, M40, M50): its cancel
check, the bytes streamed for it and its retries — never another request's — and the
manager's placement log stays bounded."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from mizuoto_runtime import CancelledError
from mizuoto_runtime.memory.manager import EVENTS_KEPT

from conftest import make_manager
from support.models import TinyLM

PROMPT = torch.tensor([[3, 4]])


def generate(h: object) -> torch.Tensor:
    return h.module.generate(PROMPT, 2, torch.Generator().manual_seed(0))  # type: ignore[attr-defined]


def test_each_request_reports_only_its_own_streamed_bytes() -> None:
    m = make_manager(64, vram_mode="none")
    a = m.register(TinyLM(layers=4), engine="a", name="lm", kind="sequence")
    b = m.register(TinyLM(layers=2), engine="b", name="lm", kind="sequence")
    first, second = m.request(), m.request()
    first.run("gen", [a], lambda: generate(a))
    alone = first.meta["memory"]["streamed_mb"]
    second.run("gen", [b], lambda: generate(b))  # streamed on the same device, after `first` began
    assert alone > 0 and first.meta["memory"]["streamed_mb"] == alone
    assert 0 < second.meta["memory"]["streamed_mb"] < alone  # two layers of the same size, not four


def test_one_requests_cancel_check_never_cancels_another_requests_copies() -> None:
    m = make_manager(64, vram_mode="none")
    a = m.register(TinyLM(layers=2), engine="a", name="lm", kind="sequence")
    b = m.register(TinyLM(layers=2), engine="b", name="lm", kind="sequence")
    interrupted = [False]

    def check() -> None:
        if interrupted[0]:
            raise CancelledError("the first request was interrupted")

    running = m.request()
    with running.use([b], 0, "gen"):
        with m.request(cancel_check=check).use([a], 0, "gen"):
            generate(a)
        interrupted[0] = True  # the first request is interrupted from now on
        generate(b)  # the running request's copies do not check the first request's flag
    assert running.meta["memory"]["streamed_mb"] > 0


def test_oom_retries_add_up_over_the_phases_of_a_request() -> None:
    m = make_manager(64)
    h = m.register(TinyLM(layers=2), engine="a", name="lm", kind="sequence")
    ctx = m.request()

    def failing_once(phase: str) -> Callable[[], torch.Tensor]:
        failures = [1]

        def fn() -> torch.Tensor:
            if failures:
                failures.pop()
                raise torch.OutOfMemoryError(f"one failure in {phase}")
            return generate(h)

        return fn

    for phase in ("voice prompt", "talker"):
        ctx.run(phase, [h], failing_once(phase))
    assert ctx.meta["applied"]["oom_retries"] == 2


def test_the_placement_log_is_bounded() -> None:
    m = make_manager(64)
    h = m.register(TinyLM(layers=1), engine="a", name="lm", kind="sequence")
    for _ in range(EVENTS_KEPT + 50):
        with m.request().use([h], 0, "p"):
            pass
    assert len(m.events) == EVENTS_KEPT
    assert m.events[-1] == ("place", "a:lm", 0)


@pytest.mark.parametrize("mode", ["none", "normal"])
def test_every_streamed_byte_of_a_request_is_counted_once(mode: str) -> None:
    """The request's figure equals what its handle's units were copied for it."""
    m = make_manager(8, vram_mode=mode)
    h = m.register(TinyLM(layers=4), engine="a", name="lm", kind="sequence")
    ctx = m.request()
    before = h.streamer.streamed_bytes_of(h)
    ctx.run("gen", [h], lambda: generate(h))
    copied = h.streamer.streamed_bytes_of(h) - before
    assert copied > 0 and ctx.charge.streamed_bytes == copied
