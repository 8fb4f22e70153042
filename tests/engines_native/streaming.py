"""M57: every small model and engine, streamed, half placed and whole, equals the plain CPU run.

Placements (on the simulated strict device, M55–M56):
- ``none``: every unit streamed (`compute.vram_mode = none`, budget = minimum working set);
- ``half``: budget half-way between the minimum working set and the full size;
- ``whole``: the whole component resident (no hooks, M17).
Each output is compared with `torch.equal` to the plain CPU run: not close — identical. With a
smaller `weights` choice (issue 36: fp8 or int8 storage) each placement equals the plain run
with the same choice, and the choice is said in `meta.applied.weights`.
"""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from mizuoto_runtime import DeviceService, ModelHandle, OomInjector, Runtime, VramPolicy
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines import Engine, Sampling
from mizuoto_runtime.memory.pinning import PinnedBudget, Pinner, RecordingRegistrar
from mizuoto_runtime.memory.small_weights import PUBLISHED, store_small
from mizuoto_runtime.memory.streamer import Streamer
from mizuoto_runtime.memory.transfer import BufferedCopyEngine, Lease, SimulatedStreams
from mizuoto_runtime.memory.units import Unit

from support.models import (
    BufferModel,
    ConvVocoder,
    LegacyWeightNormVocoder,
    TinyDiT,
    TinyGPT2,
    TinyLM,
    WeightNormVocoder,
)
from support.oom import allocations_during

PLACEMENTS = ("none", "half", "whole")
# The weights choices every engine that takes them is run with (fp8_e5m2 takes fp8_e4m3fn's path;
# the small models run it too).
WEIGHTS = (PUBLISHED, "fp8_e4m3fn", "int8")
MB = 1 << 20


def _budget(handle: ModelHandle, placement: str) -> int | None:
    if placement == "none":
        return 0  # below the minimum working set: placed at the minimum (M7)
    if placement == "half":
        # At least one unit beyond the minimum: with equal units the copies' alignment (M16) puts
        # the exact midpoint a few hundred bytes short of one.
        return max((handle.min_working_set + handle.size_bytes) // 2,
                   handle.min_working_set + min(u.nbytes for u in handle.units))
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


@pytest.mark.parametrize("weights", [*WEIGHTS, "fp8_e5m2"])
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_streams_exactly(name: str, placement: str, weights: str) -> None:
    factory, run, kind = MODELS[name]
    plain, placed = _twins(factory)
    for model in (plain, placed):
        store_small(model, weights)
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


def _placed(engine_id: str, placement: str, folder: object = None, weights: str = PUBLISHED) -> tuple[Runtime, Engine]:
    """A runtime for `placement` (plain CPU, or the strict 256 MB device streaming everything,
    half-way or nothing) and its engine."""
    settings: dict[str, object] = {}
    if placement != "plain":
        settings["compute.simulate_vram_mb"] = 256
        settings["compute.vram_mode"] = "none" if placement == "none" else "normal"
    rt = Runtime(settings)
    engine = rt.engine(engine_id, folder, weights=weights)  # type: ignore[arg-type]
    if placement == "half":
        # Cap each component half-way between its minimum working set and its size.
        for h in engine.handles():
            h.cap_bytes = (h.min_working_set + h.size_bytes) // 2
    return rt, engine


def _demo_say(placement: str, weights: str = PUBLISHED) -> torch.Tensor:
    rt, engine = _placed("demo", placement, weights=weights)
    reference = Audio(torch.sin(torch.arange(8000) / 7.0).unsqueeze(0) * 0.3, 16000)
    audio, meta = rt.say(engine, "streaming is exact", reference=reference, sampling=Sampling(seed=11))
    assert_weights_said(meta, weights)
    if placement == "none":
        assert meta["memory"]["streamed_mb"] > 0
        assert set(meta["memory"]["partial"]) == {"demo:speaker_encoder", "demo:talker", "demo:decoder"}
    if placement == "whole":
        assert meta["memory"]["partial"] == {} and meta["memory"]["streamed_mb"] == 0
    return audio.waveform


def assert_weights_said(meta: dict, weights: str) -> None:
    """`meta.applied.weights`: absent as published; else the choice, for every phase that ran
    and takes it (a phase that refuses it says it stayed as published)."""
    said = meta["applied"].get("weights")
    if weights == PUBLISHED:
        assert said is None
    else:
        assert said and weights in said.values() and set(said.values()) <= {weights, PUBLISHED}, said


@pytest.mark.parametrize("weights", [*WEIGHTS, "fp8_e5m2"])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_demo_engine_streams_exactly(placement: str, weights: str) -> None:
    assert torch.equal(_demo_say(placement, weights), _demo_say("plain", weights))


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
# a package of requirements/qwen3tts.txt is not installed). Each mode runs its phases (voice
# prompt, talker, codec decoder) on the plain CPU and on the strict simulated device: codes and
# audio must be identical.

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
_qwen_plain: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}


def _qwen_say(folder: object, mode: str, placement: str,
              weights: str = PUBLISHED) -> tuple[torch.Tensor, torch.Tensor, dict]:
    rt, engine = _placed("qwen3tts", placement, folder, weights)
    ctx = rt.request(seed=11)
    voice = engine.voice_prompt(ctx, **QWEN_MODES[mode][1])  # type: ignore[arg-type]
    sampling = Sampling(seed=11, max_new_tokens=4, language="chinese" if mode == "custom_voice" else "english")
    codes = engine.generate(ctx, QWEN_TEXT, voice, sampling)
    audio = engine.decode(ctx, codes)
    return codes.tokens, audio.waveform, ctx.meta


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("mode", sorted(QWEN_MODES))
def test_qwen3tts_streams_exactly(qwen3tts_checkpoint: Callable[[str], object], mode: str, placement: str,
                                  weights: str) -> None:
    """M57 (M1, M15, M20): none / half / whole on the strict device equal the plain CPU run."""
    folder = qwen3tts_checkpoint(QWEN_MODES[mode][0])
    if (mode, weights) not in _qwen_plain:
        codes, wav, _ = _qwen_say(folder, mode, "plain", weights)
        _qwen_plain[mode, weights] = (codes, wav)
    expected_codes, expected_wav = _qwen_plain[mode, weights]
    codes, wav, meta = _qwen_say(folder, mode, placement, weights)
    assert_weights_said(meta, weights)
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


# ---- VoxCPM 2 (issue 12): every voice mode, every placement, sample by sample ------------------
# A tiny random checkpoint in the official layout (conftest `voxcpm2_checkpoint`; skipped where
# a package of requirements/voxcpm2.txt is not installed). Each mode runs its phases (voice
# prompt, generate, decoder) on the plain CPU and on the strict simulated device: latents and
# audio must be identical. The VAE's
# encoder and decoder have two streamable units each and `oneshot` handles keep two copies in
# flight, so their minimum working set is their size: half-way is whole for them.

VOX_REFERENCE = Audio(0.3 * torch.sin(torch.arange(16000) / 6.0).unsqueeze(0), 22050)  # resampled to 16 kHz
VOX_TEXT = "Streaming is exact."
VOX_PATCHES = 4
VOX_MODES: dict[str, dict[str, object]] = {
    "zero_shot": {"instruct": "a calm voice"},
    "reference": {"reference": VOX_REFERENCE},
    "reference_continuation": {"reference": VOX_REFERENCE, "transcript": "a reference sentence"},
}
_vox_plain: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}


def _vox_say(folder: object, mode: str, placement: str, seed: int = 11,
             weights: str = PUBLISHED) -> tuple[torch.Tensor, torch.Tensor, dict]:
    rt, engine = _placed("voxcpm2", placement, folder, weights)
    ctx = rt.request(seed=seed)
    voice = engine.voice_prompt(ctx, **VOX_MODES[mode])  # type: ignore[arg-type]
    codes = engine.generate(ctx, VOX_TEXT, voice, Sampling(seed=seed, max_new_tokens=VOX_PATCHES))
    audio = engine.decode(ctx, codes)
    return codes.tokens, audio.waveform, ctx.meta


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("mode", sorted(VOX_MODES))
def test_voxcpm2_streams_exactly(voxcpm2_checkpoint: Callable[..., object], mode: str, placement: str,
                                 weights: str) -> None:
    """M57 (M1, M15, M20): none / half / whole on the strict device equal the plain CPU run."""
    folder = voxcpm2_checkpoint()
    if (mode, weights) not in _vox_plain:
        latents, wav, _ = _vox_say(folder, mode, "plain", weights=weights)
        _vox_plain[mode, weights] = (latents, wav)
    expected_latents, expected_wav = _vox_plain[mode, weights]
    latents, wav, meta = _vox_say(folder, mode, placement, weights=weights)
    assert_weights_said(meta, weights)
    assert wav.shape[-1] == VOX_PATCHES * 4 * 1920
    assert torch.equal(latents, expected_latents), f"voxcpm2 {mode} ({placement}): latents differ from the plain run"
    assert torch.equal(wav, expected_wav), f"voxcpm2 {mode} ({placement}): audio differs from the plain CPU run"
    memory = meta["memory"]
    components = {key.split(":", 1)[1] for key in memory["components"]}
    expected = {"generator", "vae_decoder"} | ({"vae_encoder"} if "reference" in VOX_MODES[mode] else set())
    assert components == expected  # M1: only each phase's components were placed
    partial = {key.split(":", 1)[1] for key in memory["partial"]}
    if placement == "whole":
        assert partial == set() and memory["streamed_mb"] == 0
    else:
        assert partial == (components if placement == "none" else {"generator"})
        assert memory["streamed_mb"] > 0


@pytest.mark.usefixtures("one_torch_thread")
def test_voxcpm2_same_seed_same_audio(voxcpm2_checkpoint: Callable[..., object]) -> None:
    """The same seed gives the same audio in a fresh runtime, streamed or not; another seed does not."""
    folder = voxcpm2_checkpoint()
    first = _vox_say(folder, "reference", "none", seed=3)[1]
    assert torch.equal(first, _vox_say(folder, "reference", "none", seed=3)[1])
    assert torch.equal(first, _vox_say(folder, "reference", "plain", seed=3)[1])
    assert not torch.equal(first, _vox_say(folder, "reference", "plain", seed=4)[1])


@pytest.mark.usefixtures("one_torch_thread")
def test_voxcpm2_oom_in_generate_reruns_exactly(voxcpm2_checkpoint: Callable[..., object]) -> None:
    """M40: an OOM mid-generation (a streamed copy) reruns the generate phase exactly, slower,
    and leaves no KV cache behind."""
    folder = voxcpm2_checkpoint()
    expected = _vox_plain.get(("reference", PUBLISHED)) or _vox_say(folder, "reference", "plain")[:2]
    probe = Runtime({"compute.simulate_vram_mb": 256, "compute.vram_mode": "none"})
    engine = probe.engine("voxcpm2", folder)  # type: ignore[arg-type]
    with allocations_during(probe, engine, "generate") as inside:
        ctx = probe.request(seed=11)
        voice = engine.voice_prompt(ctx, **VOX_MODES["reference"])  # type: ignore[arg-type]
        sampling = Sampling(seed=11, max_new_tokens=VOX_PATCHES)
        engine.generate(ctx, VOX_TEXT, voice, sampling)
    assert len(inside) > 20  # everything streams: copies happen while it generates

    # A fresh runtime: the probe's static copy buffers exist already, so its own rerun would
    # not allocate where the probe counted.
    rt = Runtime({"compute.simulate_vram_mb": 256, "compute.vram_mode": "none"})
    engine = rt.engine("voxcpm2", folder)  # type: ignore[arg-type]
    injector = OomInjector(at=inside[len(inside) // 2])
    rt.devices.fault_hook = injector
    ctx = rt.request(seed=11)
    voice = engine.voice_prompt(ctx, **VOX_MODES["reference"])  # type: ignore[arg-type]
    codes = engine.generate(ctx, VOX_TEXT, voice, sampling)
    rt.devices.fault_hook = None
    audio = engine.decode(ctx, codes)
    assert injector.raised == 1 and ctx.meta["applied"]["oom_retries"] == 1
    assert torch.equal(codes.tokens, expected[0]) and torch.equal(audio.waveform, expected[1])
    assert engine.model.base_lm.kv_cache is None and engine.model.residual_lm.kv_cache is None


# ---- F5-TTS and OmniVoice (issue 11): the one-shot engines, every placement, sample by sample ---
# Tiny random checkpoints in the published layouts (conftest `f5tts_checkpoint`,
# `omnivoice_checkpoint`; skipped where a package of the engine's requirements is not installed). Each voice mode
# runs its phases on the plain CPU and on the strict simulated device: audio must be identical.

ONESHOT_REFERENCE = Audio(0.3 * torch.sin(torch.arange(24000) / 6.0).unsqueeze(0), 24000)
ONESHOT_TEXT = "Streaming is exact, every step."
ONESHOT_STEPS = 4
ONESHOT_MODES: dict[str, tuple[str, dict[str, object]]] = {
    "f5tts-clone": ("f5tts", {"reference": ONESHOT_REFERENCE, "transcript": "a reference sentence"}),
    "omnivoice-clone": ("omnivoice", {"reference": ONESHOT_REFERENCE, "transcript": "a reference sentence"}),
    "omnivoice-design": ("omnivoice", {"instruct": "female, low pitch"}),
    "omnivoice-auto": ("omnivoice", {}),
}
ONESHOT_COMPONENTS = {
    "f5tts-clone": {"flow", "vocoder"},
    "omnivoice-clone": {"audio_encoder", "quantizer", "llm", "audio_decoder"},
    "omnivoice-design": {"quantizer", "llm", "audio_decoder"},
    "omnivoice-auto": {"quantizer", "llm", "audio_decoder"},
}
_oneshot_plain: dict[tuple[str, str], torch.Tensor] = {}


def oneshot_runtime(placement: str, **settings: object) -> Runtime:
    if placement != "plain":
        settings["compute.simulate_vram_mb"] = settings.get("compute.simulate_vram_mb", 256)
        settings.setdefault("compute.vram_mode", "none" if placement == "none" else "normal")
    return Runtime(settings)


def oneshot_say(rt: Runtime, folder: object, mode: str, placement: str = "plain",
                seed: int = 11, weights: str = PUBLISHED) -> tuple[torch.Tensor, dict]:
    engine_id, voice = ONESHOT_MODES[mode]
    engine = rt.engine(engine_id, folder, weights=weights)  # type: ignore[arg-type]
    engine.steps = ONESHOT_STEPS
    if placement == "half":
        for h in engine.handles():
            h.cap_bytes = (h.min_working_set + h.size_bytes) // 2
    audio, meta = rt.say(engine, ONESHOT_TEXT, sampling=Sampling(seed=seed, language="English"), **voice)  # type: ignore[arg-type]
    return audio.waveform, meta


def _oneshot_folder(request: pytest.FixtureRequest, mode: str) -> object:
    return request.getfixturevalue(f"{ONESHOT_MODES[mode][0]}_checkpoint")()


def oneshot_plain(request: pytest.FixtureRequest, mode: str, weights: str = PUBLISHED) -> torch.Tensor:
    if (mode, weights) not in _oneshot_plain:
        _oneshot_plain[mode, weights] = oneshot_say(Runtime(), _oneshot_folder(request, mode), mode,
                                                    weights=weights)[0]
    return _oneshot_plain[mode, weights]


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("mode", sorted(ONESHOT_MODES))
def test_oneshot_engine_streams_exactly(request: pytest.FixtureRequest, mode: str, placement: str,
                                        weights: str) -> None:
    """M57 (M1, M15, M18): none / half / whole on the strict device equal the plain CPU run."""
    expected = oneshot_plain(request, mode, weights)
    rt = oneshot_runtime(placement)
    wav, meta = oneshot_say(rt, _oneshot_folder(request, mode), mode, placement, weights=weights)
    assert_weights_said(meta, weights)
    assert wav.shape[-1] > 0 and wav.abs().max() > 0
    assert torch.equal(wav, expected), f"{mode} ({placement}): audio differs from the plain CPU run"
    memory = meta["memory"]
    components = {key.split(":", 1)[1] for key in memory["components"]}
    assert components == ONESHOT_COMPONENTS[mode]  # M1: only each phase's components were placed
    engine = rt.engine(ONESHOT_MODES[mode][0], _oneshot_folder(request, mode), weights=weights)  # type: ignore[arg-type]
    # Streamable: has units; and for `half`, more than the minimum working set to leave out.
    streamable = {h.name for h in engine.handles() if h.units and h.name in components
                  and (placement == "none" or h.min_working_set < h.size_bytes)}
    assert {"flow", "llm"} & streamable  # the model that runs every step really streams
    if placement == "whole":
        assert memory["partial"] == {} and memory["streamed_mb"] == 0
    else:
        assert {key.split(":", 1)[1] for key in memory["partial"]} == streamable
        assert memory["streamed_mb"] > 0


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("mode", ["f5tts-clone", "omnivoice-clone"])
def test_oneshot_same_seed_same_audio(request: pytest.FixtureRequest, mode: str) -> None:
    folder = _oneshot_folder(request, mode)
    first = oneshot_say(oneshot_runtime("none"), folder, mode)[0]
    again = oneshot_say(oneshot_runtime("none"), folder, mode)[0]
    other = oneshot_say(oneshot_runtime("none"), folder, mode, seed=12)[0]
    assert torch.equal(first, again) and torch.equal(first, oneshot_plain(request, mode))
    assert not torch.equal(first[..., :other.shape[-1]], other[..., :first.shape[-1]])  # the seed matters


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("mode", ["f5tts-clone", "omnivoice-clone"])
def test_oneshot_oom_mid_flow_reruns_exactly(request: pytest.FixtureRequest, mode: str) -> None:
    """M40: an OOM in the middle of the flow / diffusion phase (a streamed copy) reruns the phase
    with the same noise: the audio is the plain run's."""
    folder = _oneshot_folder(request, mode)
    probe = oneshot_runtime("none")
    with allocations_during(probe, probe.engine(ONESHOT_MODES[mode][0], folder), "generate") as inside:  # type: ignore[arg-type]
        assert torch.equal(oneshot_say(probe, folder, mode)[0], oneshot_plain(request, mode))
    assert len(inside) > 2 * ONESHOT_STEPS  # copies happen at every step
    rt = oneshot_runtime("none")
    injector = OomInjector(at=inside[len(inside) // 2])
    rt.devices.fault_hook = injector
    wav, meta = oneshot_say(rt, folder, mode)
    assert injector.raised == 1 and meta["applied"]["oom_retries"] == 1
    assert torch.equal(wav, oneshot_plain(request, mode))


@pytest.mark.usefixtures("one_torch_thread")
def test_f5tts_cfg_halves_share_each_copy(f5tts_checkpoint: Callable[[], object]) -> None:
    """M18: F5-TTS runs CFG's conditional and unconditional halves through each DiT block in one
    batch, so a streamed block is copied once per ODE step, not twice: from the streamer's
    counters, each extra step costs exactly the streamed units' bytes."""
    folder = f5tts_checkpoint()
    streamed: dict[int, int] = {}
    for steps in (2, 5):
        rt = oneshot_runtime("none")
        engine = rt.engine("f5tts", folder)  # type: ignore[arg-type]
        engine.steps = steps
        voice = engine.voice_prompt(rt.request(), **ONESHOT_MODES["f5tts-clone"][1])  # type: ignore[arg-type]
        engine.generate(rt.request(seed=1), ONESHOT_TEXT, voice, Sampling(seed=1))
        flow = engine.flow
        assert len(flow.streamed_units) == len(flow.units) >= 4
        per_step = sum(u.nbytes for u in flow.streamed_units)
        streamed[steps] = flow.streamer.streamed_bytes_of(flow)
    assert streamed[5] - streamed[2] == 3 * per_step


# ---- prefetch where CUDA gets it (M19, M20) ------------------------------------------------
# On CUDA the manager's streamer copies with pinned host memory and a side stream
# (`transfer.make_copy_engine`). Here the same engine runs on the simulated device with
# `SimulatedStreams`: which units each component copies ahead is what a GPU would do.

def cuda_copies(rt: Runtime) -> dict[int, list[int]]:
    """Give `rt`'s device the copy engine CUDA gets (pinned host copies, a side stream for copies
    ahead) before any engine registers; returns the units copied ahead, per handle key."""
    device = torch.device("cpu")
    pinner = Pinner("register", RecordingRegistrar(), PinnedBudget(1 << 30))
    engine = BufferedCopyEngine(rt.devices, device, SimulatedStreams(), pinner)
    copied_ahead: dict[int, list[int]] = {}
    copy_unit = engine.copy_unit

    def logged(key: int, unit: Unit, ahead: bool) -> Lease:
        if ahead:
            copied_ahead.setdefault(key, []).append(unit.index)
        return copy_unit(key, unit, ahead=ahead)

    engine.copy_unit = logged  # type: ignore[method-assign]
    rt.manager._streamers[str(device)] = Streamer(rt.devices, device, engine)
    return copied_ahead


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize(("mode", "model"), [("f5tts-clone", "flow"), ("omnivoice-clone", "llm")])
def test_on_cuda_the_oneshot_model_copies_ahead_and_stays_exact(request: pytest.FixtureRequest,
                                                                mode: str, model: str) -> None:
    """M19/M20: the model that runs every step is `oneshot`, so with CUDA's copy engine it copies
    the next units ahead while one computes — in every step — and the audio is the plain run's."""
    rt = oneshot_runtime("none")
    ahead = cuda_copies(rt)
    wav, _ = oneshot_say(rt, _oneshot_folder(request, mode), mode, "none")
    assert torch.equal(wav, oneshot_plain(request, mode))
    handle = next(h for h in rt.engine(ONESHOT_MODES[mode][0], _oneshot_folder(request, mode)).handles()  # type: ignore[arg-type]
                  if h.name == model)
    assert handle.kind == "oneshot" and handle.prefetch_depth == rt.policy.async_offload >= 1
    copied_ahead = ahead.get(id(handle), [])
    # every unit but the first of a step is copied ahead, in every step after the first
    assert len(copied_ahead) >= (ONESHOT_STEPS - 1) * (len(handle.units) - 1), (len(copied_ahead), len(handle.units))


@pytest.mark.usefixtures("one_torch_thread")
def test_on_cuda_voxcpm2s_generator_never_copies_ahead(voxcpm2_checkpoint: Callable[..., object]) -> None:
    """M20: the autoregressive generator is a `sequence` handle: one copy, nothing ahead (the
    design note's 29.0 s with side streams against 13.6 s without). The audio is the plain run's."""
    folder = voxcpm2_checkpoint()
    expected = _vox_plain.get(("reference", PUBLISHED)) or _vox_say(folder, "reference", "plain")[:2]
    rt = Runtime({"compute.simulate_vram_mb": 256, "compute.vram_mode": "none"})
    ahead = cuda_copies(rt)
    engine = rt.engine("voxcpm2", folder)  # type: ignore[arg-type]
    ctx = rt.request(seed=11)
    voice = engine.voice_prompt(ctx, **VOX_MODES["reference"])  # type: ignore[arg-type]
    codes = engine.generate(ctx, VOX_TEXT, voice, Sampling(seed=11, max_new_tokens=VOX_PATCHES))
    audio = engine.decode(ctx, codes)
    assert torch.equal(codes.tokens, expected[0]) and torch.equal(audio.waveform, expected[1])
    handles = {h.name: h for h in engine.handles()}
    generator = handles["generator"]
    assert generator.kind == "sequence" and generator.prefetch_depth == 0 and id(generator) not in ahead
    assert generator.streamer.streamed_bytes_of(generator) > 0 and generator.copies == 1  # it did stream
