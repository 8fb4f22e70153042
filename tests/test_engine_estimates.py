"""M45: each engine phase's working-memory estimate, made from the request before the phase runs,
covers what the phase really allocates — for F5-TTS, OmniVoice and VoxCPM 2, on the plain CPU with
tiny checkpoints in the published layouts, at two request sizes (issue 11, issue 12).

Measured with `PeakTracker` from `bench/voxcpm2.py` (the benchmarks print the same comparison
at more sizes): the peak of CPU tensor storages created while the phase runs, each counted until
it is freed. On the plain CPU nothing is placed or streamed, so that peak is the phase's own
working memory plus what it returns. Estimates may be generous (the benchmarks show the
margins); they must not be short, or a phase on a nearly full device would run out of memory.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mizuoto_runtime import Runtime
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines import Sampling

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_voxcpm2", REPO / "bench" / "voxcpm2.py")
assert spec is not None and spec.loader is not None
bench_voxcpm2 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_voxcpm2)
PeakTracker = bench_voxcpm2.PeakTracker

TEXT = "The estimate is made before the phase runs."
TRANSCRIPT = "a reference sentence."
STEPS = 4


def reference(seconds: int) -> Audio:
    return Audio(0.3 * torch.sin(torch.arange(seconds * 24000) / 6.0).unsqueeze(0), 24000)


def measured(fn: Callable[[], Any]) -> tuple[Any, int]:
    with PeakTracker() as tracker:
        out = fn()
    return out, tracker.peak


def check(rows: list[tuple[str, int, int]]) -> None:
    short = [f"{phase}: estimate {estimate / 2**20:.2f} MB < measured {peak / 2**20:.2f} MB"
             for phase, estimate, peak in rows if estimate < peak]
    assert all(peak > 0 for _, _, peak in rows), rows  # each phase really allocated something
    assert not short, "\n".join(short)


@pytest.mark.usefixtures("one_torch_thread")
def test_f5tts_estimates_cover_each_phase(f5tts_checkpoint: Callable[[], Path]) -> None:
    engine = Runtime().engine("f5tts", f5tts_checkpoint())
    engine.steps = STEPS
    rows = []
    for seconds in (1, 3):
        engine.voices.clear()
        ctx = Runtime().request(seed=1)
        voice = engine.voice_prompt(ctx, reference(seconds), TRANSCRIPT)
        _, total = engine.durations(voice, TEXT)
        flow = engine.flow_memory(total, len(voice.data["ref_text"] + TEXT), STEPS)
        codes, flow_peak = measured(lambda: engine.generate(ctx, TEXT, voice, Sampling(seed=1)))
        vocoder = engine.vocoder_memory(codes.tokens.shape[-1])
        _, vocoder_peak = measured(lambda: engine.decode(ctx, codes))
        rows += [(f"flow, {seconds} s reference", flow, flow_peak), (f"vocoder, {seconds} s", vocoder, vocoder_peak)]
    check(rows)


@pytest.mark.usefixtures("one_torch_thread")
def test_omnivoice_estimates_cover_each_phase(omnivoice_checkpoint: Callable[[], Path]) -> None:
    rt = Runtime()
    engine = rt.engine("omnivoice", omnivoice_checkpoint())
    engine.steps = STEPS
    rows = []
    for seconds in (1, 3):
        engine.voices.clear()
        ctx = rt.request(seed=1)
        prompt = engine.encoder_memory(seconds * 24000)
        voice, prompt_peak = measured(lambda: engine.voice_prompt(ctx, reference(seconds), TRANSCRIPT))
        sampling = Sampling(seed=1, language="English")
        llm = engine.llm_memory(engine.sequence_length(engine._task(TEXT, voice, sampling)))
        codes, llm_peak = measured(lambda: engine.generate(ctx, TEXT, voice, sampling))
        decoder = engine.decoder_memory(codes.tokens.shape[-1])
        _, decoder_peak = measured(lambda: engine.decode(ctx, codes))
        rows += [(f"voice prompt, {seconds} s", prompt, prompt_peak), (f"llm, {seconds} s reference", llm, llm_peak),
                 (f"decoder, {seconds} s", decoder, decoder_peak)]
    check(rows)


@pytest.mark.usefixtures("one_torch_thread")
def test_voxcpm2_estimates_cover_each_phase(voxcpm2_checkpoint: Callable[[], Path]) -> None:
    """The generate phase's estimate holds the KV caches sized from the request (M46)."""
    rt = Runtime()
    engine = rt.engine("voxcpm2", voxcpm2_checkpoint())
    rows = []
    for seconds, text, patches in ((1, TEXT, 4), (2, TEXT * 3, 8)):
        engine.voices.clear()
        ctx = rt.request(seed=5)
        voice_in = reference(seconds)
        samples = voice_in.waveform.shape[-1]
        prompt = engine.encoder_memory(samples, samples)
        voice, prompt_peak = measured(lambda: engine.voice_prompt(ctx, voice_in, TRANSCRIPT))
        plan = engine.plan(engine.target_text(text, voice), voice.data["prompt"], patches)
        generate = sum(engine.generation_memory(plan).values())
        codes, generate_peak = measured(
            lambda: engine.generate(ctx, text, voice, Sampling(seed=5, max_new_tokens=patches)))
        decoder = engine.decoder_memory(codes.tokens.shape[-1])
        _, decoder_peak = measured(lambda: engine.decode(ctx, codes))
        rows += [(f"voice prompt, {seconds} s", prompt, prompt_peak),
                 (f"generate, {patches} patches", generate, generate_peak), (f"decoder, {patches} patches", decoder, decoder_peak)]
    check(rows)
