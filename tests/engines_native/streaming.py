"""M57: every small model and engine, streamed, half placed and whole, equals the plain CPU run.

Placements (on the simulated strict device, M55–M56):
- ``none``: every unit streamed (`compute.vram_mode = none`, budget = minimum working set);
- ``half``: budget half-way between the minimum working set and the full size;
- ``whole``: the whole component resident (no hooks, M17).
Each output is compared with `torch.equal` to the plain CPU run: not close — identical.
"""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from models import BufferModel, ConvVocoder, LegacyWeightNormVocoder, TinyDiT, TinyGPT2, TinyLM, WeightNormVocoder
from mizuoto_runtime import DeviceService, ModelHandle, Runtime, VramPolicy
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines import Sampling

PLACEMENTS = ("none", "half", "whole")
MB = 1 << 20


def _budget(handle: ModelHandle, placement: str) -> int | None:
    if placement == "none":
        return 0  # below the minimum working set: placed at the minimum (M7)
    if placement == "half":
        return (handle.min_working_set + handle.size_bytes) // 2
    return None


def _lm_run(m: nn.Module) -> torch.Tensor:
    return m.generate(torch.tensor([[5, 7, 11, 13]]), steps=12, generator=torch.Generator().manual_seed(3))


def _vocoder_run(m: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return m(torch.randn(2, 80, 24, generator=torch.Generator().manual_seed(4)))


def _dit_run(m: nn.Module) -> torch.Tensor:
    noise = torch.randn(2, 6, 192, generator=torch.Generator().manual_seed(5))
    return m.sample(noise, torch.tensor([1, 3]))


def _gpt2_run(m: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return m(torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]))


def _buffer_run(m: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        x = torch.randn(4, 512, generator=torch.Generator().manual_seed(6))
        return torch.stack([m(x), m(x + 1)])  # two calls: buffers advance in place


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], torch.Tensor], str]] = {
    "tied_lm": (TinyLM, _lm_run, "sequence"),
    "conv_vocoder": (ConvVocoder, _vocoder_run, "oneshot"),
    "dit_cfg": (TinyDiT, _dit_run, "oneshot"),
    "gpt2_conv1d": (TinyGPT2, _gpt2_run, "oneshot"),
    "inplace_buffers": (BufferModel, _buffer_run, "oneshot"),
    "weightnorm_vocoder": (WeightNormVocoder, _vocoder_run, "oneshot"),  # parametrizations.weight_norm
    "legacy_weightnorm_vocoder": (LegacyWeightNormVocoder, _vocoder_run, "oneshot"),  # nn.utils.weight_norm
}


def _twins(factory: Callable[[], nn.Module]) -> tuple[nn.Module, nn.Module]:
    """Two identical models (not `deepcopy`: a legacy weight-normed model cannot be copied)."""
    torch.manual_seed(0)
    plain = factory().eval()
    torch.manual_seed(0)
    placed = factory().eval()
    return plain, placed


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_streams_exactly(name: str, placement: str) -> None:
    factory, run, kind = MODELS[name]
    plain, placed = _twins(factory)
    expected = run(plain)

    devices = DeviceService(simulate={"cpu": 256 * MB}, strict=True)
    handle = ModelHandle(placed, devices=devices, kind=kind, name=name)  # type: ignore[arg-type]
    assert len(handle.units) >= 2, f"{name}: the test model must have streamable units"
    handle.load(_budget(handle, placement))
    streamed = len(handle.streamed_units)
    if placement == "whole":
        assert streamed == 0 and not handle.has_hooks()  # M17: no hooks on the resident path
    elif placement == "none":
        assert streamed == len(handle.units)
    else:
        assert 0 < streamed < len(handle.units)

    got = run(placed)
    assert torch.equal(got, expected), f"{name} ({placement}) differs from the plain CPU run"
    if streamed:
        assert handle.streamer.streamed_bytes > 0
    if name == "inplace_buffers":
        handle.offload()  # buffers updated in place come back to the host (M25)
        hosts = {s.name: s.host for s in handle.plan.fixed if s.is_buffer}
        for key, value in plain.named_buffers():
            assert torch.equal(hosts[key], value), f"buffer {key} was not copied back"


def _demo_say(placement: str) -> torch.Tensor:
    settings: dict[str, object] = {}
    if placement != "plain":
        settings["compute.simulate_vram_mb"] = 256
        settings["compute.vram_mode"] = "none" if placement == "none" else "normal"
    rt = Runtime(settings)
    engine = rt.engine("demo")
    if placement == "half":
        # Cap each component half-way between its minimum working set and its size.
        for h in engine.handles():
            h.cap_bytes = (h.min_working_set + h.size_bytes) // 2
    reference = Audio(torch.sin(torch.arange(8000) / 7.0).unsqueeze(0) * 0.3, 16000)
    audio, meta = rt.say(engine, "streaming is exact", reference=reference, sampling=Sampling(seed=11))
    if placement == "none":
        assert meta["memory"]["streamed_mb"] > 0
        assert set(meta["memory"]["partial"]) == {"demo:speaker_encoder", "demo:talker", "demo:decoder"}
    if placement == "whole":
        assert meta["memory"]["partial"] == {} and meta["memory"]["streamed_mb"] == 0
    return audio.waveform


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_demo_engine_streams_exactly(placement: str) -> None:
    assert torch.equal(_demo_say(placement), _demo_say("plain"))


@pytest.mark.parametrize("host_copies", ["on", "off"])
@pytest.mark.parametrize("mode", ["high", "shared", "normal", "low", "none"])
def test_every_vram_mode_and_host_copy_setting_is_exact(mode: str, host_copies: str) -> None:
    """M9, M25: each mode on a small device — components yield, stream, copy back when they kept
    no host copy — and two requests in a row still give the plain run's audio."""
    rt = Runtime({"compute.simulate_vram_mb": 14, "compute.vram_mode": mode, "compute.host_copies": host_copies})
    engine = rt.engine("demo")
    reference = Audio(torch.sin(torch.arange(8000) / 7.0).unsqueeze(0) * 0.3, 16000)
    expected = _demo_say("plain")
    for _ in range(2):
        audio, _ = rt.say(engine, "streaming is exact", reference=reference, sampling=Sampling(seed=11))
        assert torch.equal(audio.waveform, expected)
        engine.voices.clear()  # the voice prompt runs (and its encoder is placed) again


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_dummy_engine_streams_exactly(placement: str) -> None:
    def say(settings: dict[str, object]) -> torch.Tensor:
        rt = Runtime(settings)
        engine = rt.engine("dummy")
        if placement == "half":
            h = engine.handles()[0]
            h.cap_bytes = (h.min_working_set + h.size_bytes) // 2
        return rt.say(engine, "dummy text")[0].waveform

    sim = {"compute.simulate_vram_mb": 256, "compute.vram_mode": "none" if placement == "none" else "normal"}
    assert torch.equal(say(sim), say({}))


def test_policy_is_what_the_runtime_reads() -> None:
    assert VramPolicy({"compute.vram_mode": "none"}).vram_mode == "none"


# ---- Qwen3-TTS (issue 6): every voice mode, every placement, sample by sample ------------------
# Tiny random checkpoints in the official layout (conftest `qwen3tts_checkpoint`; skipped where
# `qwen_tts` is not installed). Each mode runs its phases (voice prompt, talker, codec decoder)
# on the plain CPU and on the strict simulated device: codes and audio must be identical.

QWEN_REFERENCE = Audio(0.3 * torch.sin(torch.arange(16000) / 6.0).unsqueeze(0), 16000)  # resampled to 24 kHz
QWEN_TEXT = "Streaming is exact."
QWEN_MODES: dict[str, tuple[str, dict[str, object]]] = {
    "xvector_clone": ("base", {"reference": QWEN_REFERENCE}),
    "icl_clone": ("base", {"reference": QWEN_REFERENCE, "transcript": "a reference sentence"}),
    "custom_voice": ("custom_voice", {"speaker": "dylan", "instruct": "cheerful"}),
    "voice_design": ("voice_design", {"instruct": "A calm low voice."}),
}
QWEN_COMPONENTS = {
    "xvector_clone": {"speaker_encoder", "talker", "codec_decoder"},
    "icl_clone": {"codec_encoder", "speaker_encoder", "talker", "codec_decoder"},
    "custom_voice": {"talker", "codec_decoder"},
    "voice_design": {"talker", "codec_decoder"},
}
_qwen_plain: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


def _qwen_say(folder: object, mode: str, placement: str) -> tuple[torch.Tensor, torch.Tensor, dict]:
    settings: dict[str, object] = {}
    if placement != "plain":
        settings["compute.simulate_vram_mb"] = 256
        settings["compute.vram_mode"] = "none" if placement == "none" else "normal"
    rt = Runtime(settings)
    engine = rt.engine("qwen3tts", folder)  # type: ignore[arg-type]
    if placement == "half":
        # Cap each component half-way between its minimum working set and its size.
        for h in engine.handles():
            h.cap_bytes = (h.min_working_set + h.size_bytes) // 2
    ctx = rt.request(seed=11)
    voice = engine.voice_prompt(ctx, **QWEN_MODES[mode][1])  # type: ignore[arg-type]
    sampling = Sampling(seed=11, max_new_tokens=4, language="chinese" if mode == "custom_voice" else "english")
    codes = engine.generate(ctx, QWEN_TEXT, voice, sampling)
    audio = engine.decode(ctx, codes)
    return codes.tokens, audio.waveform, ctx.meta


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("mode", sorted(QWEN_MODES))
def test_qwen3tts_streams_exactly(qwen3tts_checkpoint: Callable[[str], object], mode: str, placement: str) -> None:
    """M57 (M1, M15, M20): none / half / whole on the strict device equal the plain CPU run."""
    folder = qwen3tts_checkpoint(QWEN_MODES[mode][0])
    if mode not in _qwen_plain:
        codes, wav, _ = _qwen_say(folder, mode, "plain")
        _qwen_plain[mode] = (codes, wav)
    expected_codes, expected_wav = _qwen_plain[mode]
    codes, wav, meta = _qwen_say(folder, mode, placement)
    assert codes.shape == (3, 16) and wav.shape[-1] == 3 * 1920  # max_new_tokens N gives N-1 frames
    assert torch.equal(codes, expected_codes), f"qwen3tts {mode} ({placement}): codes differ from the plain CPU run"
    assert torch.equal(wav, expected_wav), f"qwen3tts {mode} ({placement}): audio differs from the plain CPU run"
    memory = meta["memory"]
    components = {key.split(":", 1)[1] for key in memory["components"]}
    assert components == QWEN_COMPONENTS[mode]  # M1: only each phase's components were placed
    if placement == "whole":
        assert memory["partial"] == {} and memory["streamed_mb"] == 0
    else:
        assert {key.split(":", 1)[1] for key in memory["partial"]} == components
        assert memory["streamed_mb"] > 0
