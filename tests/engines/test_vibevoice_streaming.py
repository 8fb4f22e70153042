"""VibeVoice under streaming (issue 34; M55-M57, M15, M18, M40) on the tiny checkpoint: every
placement — all units streamed (`none`), each handle capped half-way, whole — on the strict
simulated device gives the plain CPU run's audio sample for sample, one voice and a two-voice
dialogue; an OOM in the middle of the talker phase reruns it exactly; the diffusion head is hot
and CFG's two halves share each copy of its units.

Skipped where diffusers (requirements/vibevoice.txt) is not installed.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from mizuoto_runtime import OomInjector, Runtime
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines import Sampling
from mizuoto_runtime.engines.base import Turn

from support.oom import allocations_during

pytestmark = pytest.mark.usefixtures("one_torch_thread")

Checkpoint = Callable[..., Path]
PLACEMENTS = ("none", "half", "whole")
_noise = torch.Generator().manual_seed(2)
REFERENCES = (Audio(0.1 * torch.randn(1, 20000, generator=_noise), 24000),
              Audio(0.1 * torch.randn(1, 16000, generator=_noise), 24000))
CASES: dict[str, tuple[list[Turn], Sequence[Audio]]] = {
    "one voice": ([Turn(0, "Streaming is exact, every frame.")], REFERENCES[:1]),
    "dialogue": ([Turn(0, "Is it exact?"), Turn(1, "Every sample."), Turn(0, "Good.")], REFERENCES),
}
COMPONENTS = {"acoustic_encoder", "talker", "acoustic_decoder", "semantic_encoder"}
STEPS = 3
FRAMES = 4
SEED = 11
_plain: dict[str, torch.Tensor] = {}


def runtime(placement: str) -> Runtime:
    """The plain CPU run, or the strict simulated device with every unit streamed or not."""
    if placement == "plain":
        return Runtime()
    return Runtime({"compute.simulate_vram_mb": 256, "compute.vram_mode": "none" if placement == "none" else "normal"})


def speak(rt: Runtime, folder: Path, case: str, placement: str = "plain", steps: int = STEPS,
          seed: int = SEED, weights: str | None = None) -> tuple[torch.Tensor, dict[str, Any], Any]:
    """A voice prompt per reference, one talker pass, decode: (audio, the request's meta, engine)."""
    turns, references = CASES[case]
    engine = rt.engine("vibevoice", folder, weights=weights)
    engine.steps = steps
    if placement == "half":
        for h in engine.handles():
            h.cap_bytes = (h.min_working_set + h.size_bytes) // 2
    ctx = rt.request(seed)
    voices = [engine.voice_prompt(ctx, ref) for ref in references]
    codes = engine.generate_dialogue(ctx, turns, voices, Sampling(seed=seed, max_new_tokens=FRAMES))
    return engine.decode(ctx, codes).waveform, ctx.meta, engine


def plain(folder: Path, case: str) -> torch.Tensor:
    if case not in _plain:
        _plain[case] = speak(runtime("plain"), folder, case)[0]
    return _plain[case]


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_placement_equals_the_plain_run(vibevoice_checkpoint: Checkpoint, case: str, placement: str) -> None:
    """M57 (M1, M15): none / half / whole on the strict device equal the plain CPU run."""
    folder = vibevoice_checkpoint()
    expected = plain(folder, case)
    wav, meta, engine = speak(runtime(placement), folder, case, placement)
    assert wav.shape[-1] == FRAMES * 3200 and wav.abs().max() > 0
    assert torch.equal(wav, expected), f"{case} ({placement}): audio differs from the plain CPU run"
    memory = meta["memory"]
    assert {key.split(":", 1)[1] for key in memory["components"]} == COMPONENTS  # M1
    if placement == "whole":
        assert memory["partial"] == {} and memory["streamed_mb"] == 0
    else:
        partial = {key.split(":", 1)[1] for key in memory["partial"]}
        assert "talker" in partial and memory["streamed_mb"] > 0
        if placement == "none":
            assert partial == {h.name for h in engine.handles() if h.units}


def test_same_seed_same_audio(vibevoice_checkpoint: Checkpoint) -> None:
    folder = vibevoice_checkpoint()
    first = speak(runtime("none"), folder, "one voice")[0]
    other = speak(runtime("none"), folder, "one voice", seed=SEED + 1)[0]
    assert torch.equal(first, plain(folder, "one voice")) and not torch.equal(first, other)


def test_oom_mid_talker_reruns_exactly(vibevoice_checkpoint: Checkpoint) -> None:
    """M40: an OOM in the middle of the talker phase (a streamed copy) reruns the phase with the
    same σ-VAE and diffusion noise: the audio is the plain run's."""
    folder = vibevoice_checkpoint()
    probe = runtime("none")
    engine = probe.engine("vibevoice", folder)
    with allocations_during(probe, engine, "generate_dialogue") as inside:
        assert torch.equal(speak(probe, folder, "dialogue")[0], plain(folder, "dialogue"))
    assert len(inside) > FRAMES * STEPS  # copies happen at every diffusion step
    rt = runtime("none")
    injector = OomInjector(at=inside[len(inside) // 2])
    rt.devices.fault_hook = injector
    wav, meta, _ = speak(rt, folder, "dialogue")
    assert injector.raised == 1 and meta["applied"]["oom_retries"] == 1
    assert torch.equal(wav, plain(folder, "dialogue"))


def test_the_diffusion_head_is_hot_and_cfg_halves_share_its_copies(vibevoice_checkpoint: Checkpoint) -> None:
    """M15: capped half-way, the talker keeps the diffusion head's layers resident (they run
    every diffusion step) and streams LM layers instead. M18: with everything streamed, each
    extra diffusion step costs exactly one copy of the head's units per frame — CFG's
    conditional and unconditional rows go through each head layer in one batch."""
    folder = vibevoice_checkpoint()
    _, _, engine = speak(runtime("half"), folder, "one voice", "half")
    talker = engine.talker
    head = {id(m) for m in engine.model.model.diffusion_head.layers}
    streamed = {id(u.module) for u in talker.streamed_units}
    assert streamed and not head & streamed  # LM layers stream, the head's stay

    bytes_per_steps: dict[int, int] = {}
    for steps in (2, 5):
        _, _, engine = speak(runtime("none"), folder, "one voice", "none", steps=steps)
        talker = engine.talker
        head = {id(m) for m in engine.model.model.diffusion_head.layers}
        head_units = [u for u in talker.units if id(u.module) in head]
        assert len(head_units) == len(head) and all(u in talker.streamed_units for u in head_units)
        per_step = sum(u.nbytes for u in head_units)
        bytes_per_steps[steps] = talker.streamer.streamed_bytes_of(talker)
    assert bytes_per_steps[5] - bytes_per_steps[2] == 3 * FRAMES * per_step


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("weights", ["fp8_e4m3fn", "int8"])
def test_talker_stored_small_streams_exactly(vibevoice_checkpoint: Checkpoint, weights: str, placement: str) -> None:
    """Issue 36 (M57 with the option on): the talker stored in fp8 / int8, every placement equals
    the plain run with the same choice, streams the smaller bytes, and says the choice."""
    folder = vibevoice_checkpoint()
    expected, plain_meta, _ = speak(runtime("plain"), folder, "one voice", weights=weights)
    assert not torch.equal(expected, plain(folder, "one voice"))  # the choice changes the numbers
    assert plain_meta["applied"]["weights"] == {"generate": weights}
    wav, meta, engine = speak(runtime(placement), folder, "one voice", placement, weights=weights)
    assert torch.equal(wav, expected), f"{weights} ({placement}): audio differs from the plain run with it"
    talker = next(h for h in engine.handles() if h.name == "talker")
    assert talker.weights == weights
    if placement != "whole":
        assert meta["memory"]["streamed_mb"] > 0
