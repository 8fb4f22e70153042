"""Issue 3 acceptance: two engines share one small simulated device (M1, M4, M30–M32)."""
from __future__ import annotations

import torch

from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines import Sampling
from mizuoto_runtime.engines.demo.engine import DemoEngine
from mizuoto_runtime.memory.manager import ModelManager

from conftest import make_manager

REFERENCE = Audio(torch.sin(torch.arange(6000) / 3.0).unsqueeze(0) * 0.3, 16000)


class LoggedEngine(DemoEngine):
    """The demo engine, recording which handles each phase listed."""

    phases: list[tuple[str, set[str]]]

    def __init__(self, manager: ModelManager, seed: int, tag: str) -> None:
        self.id = tag  # type: ignore[misc]  # two engines, two ids in the placement log
        super().__init__(manager, seed=seed)
        self.phases = []


def say(manager: ModelManager, engine: DemoEngine, text: str) -> tuple[torch.Tensor, dict]:
    ctx = manager.request(generator=torch.Generator().manual_seed(1))
    run = ctx.run

    def logged_run(name, handles, fn, memory=0, **kw):  # type: ignore[no-untyped-def]
        before = len(manager.events)
        out = run(name, handles, fn, memory, **kw)
        placed = {n for a, n, _ in manager.events[before:] if a == "place"}
        assert placed == {manager.key(h) for h in handles}, f"{name} placed {placed}"  # M1: only its own
        return out

    ctx.run = logged_run  # type: ignore[method-assign]
    voice = engine.voice_prompt(ctx, REFERENCE)
    audio = engine.synthesize(ctx, text, voice, Sampling(seed=1))
    return audio.waveform, ctx.meta


def test_two_engines_share_a_small_device_and_stay_exact() -> None:
    alone = {}
    for tag, seed in (("left", 1), ("right", 2)):
        m = make_manager(256)
        alone[tag] = say(m, LoggedEngine(m, seed, tag), f"{tag} alone")[0]

    m = make_manager(24)
    left, right = LoggedEngine(m, 1, "left"), LoggedEngine(m, 2, "right")
    got_left, _ = say(m, left, "left alone")
    m.events.clear()
    got_right, meta = say(m, right, "right alone")
    assert torch.equal(got_left, alone["left"]) and torch.equal(got_right, alone["right"])

    yielded = [n for a, n, _ in m.events if a == "yield"]
    assert yielded and all(n.startswith("left:") or n.startswith("right:") for n in yielded)
    # the left engine's components were idle: they gave VRAM to the right engine's phases
    assert any(n.startswith("left:") for n in yielded)
    assert set(meta["memory"]["components"]) == {"right:speaker_encoder", "right:talker", "right:decoder"}
    assert m.devices.peak_counted_bytes(torch.device("cpu")) <= 24 << 20


def test_a_running_phase_keeps_its_component_while_the_other_engine_loads() -> None:
    m = make_manager(24)
    left, right = LoggedEngine(m, 1, "left"), LoggedEngine(m, 2, "right")
    ctx = m.request()
    with ctx.use([left.talker], 0, "left talker"):
        say(m, right, "the other engine runs meanwhile")
        assert left.talker.is_whole  # M31: in use, never yields
    assert not any(n == "left:talker" for a, n, _ in m.events if a == "yield")
