"""Profiler labels (issue 32): a standard PyTorch profiler trace shows what the runtime did —
its phases, its placements and every streamed unit's copy — and outside a profiler the
runtime makes no `record_function` at all."""
from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from conftest import make_manager
from support.models import TinyLM

STEPS = 3
LAYERS = 4


def streamed_request() -> tuple[torch.Tensor, int, int]:
    """Every unit of a TinyLM streams (`vram_mode = none`) through one request, then the model
    is moved off the device: the tokens, the bytes streamed and a unit's bytes."""
    manager = make_manager(64, vram_mode="none")
    lm = TinyLM(layers=LAYERS).eval()
    talker = manager.register(lm, engine="demo", name="talker", kind="sequence")
    ctx = manager.request()
    prompt = torch.tensor([[1, 2, 3]])
    tokens = ctx.run("talker", [talker], lambda: lm.generate(prompt, STEPS, torch.Generator().manual_seed(0)))
    assert talker.loaded_bytes and len(talker.streamed_units) == LAYERS
    manager.offload_idle()
    return tokens, ctx.charge.streamed_bytes, talker.units[0].nbytes


def test_a_streamed_request_is_labelled_in_a_profiler_trace() -> None:
    expected, _, _ = streamed_request()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        tokens, streamed, unit_bytes = streamed_request()
    assert torch.equal(tokens, expected)  # labels change nothing
    events = [e for e in prof.events() if e.name.startswith("mizuoto::")]
    names = {e.name for e in events}
    assert {"mizuoto::phase (talker)", "mizuoto::load (demo:talker)", "mizuoto::offload (demo:talker)"} <= names
    assert {f"mizuoto::copy (talker.layers.{i})" for i in range(LAYERS)} <= names
    copies = [e for e in events if e.name.startswith("mizuoto::copy")]
    assert len(copies) * unit_bytes == streamed  # one label per copy the request was charged
    phase = next(e for e in events if e.name == "mizuoto::phase (talker)")
    inside = [e for e in events if e is not phase and phase.time_range.start <= e.time_range.start
              and e.time_range.end <= phase.time_range.end]
    assert set(copies) <= set(inside) and any(e.name.startswith("mizuoto::load") for e in inside)


def test_outside_a_profiler_the_runtime_makes_no_record_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """The labels cost one check per copy when no profiler runs: nothing is recorded."""
    expected, _, _ = streamed_request()

    def refuse(name: str, *_args: object) -> None:
        raise AssertionError(f"record_function({name!r}) outside a profiler")

    monkeypatch.setattr(torch.profiler, "record_function", refuse)
    tokens, streamed, _ = streamed_request()
    assert torch.equal(tokens, expected) and streamed > 0
