"""The F5-TTS engine on tiny random checkpoints (issue 11: M1, M27, M42-M43, M45, M50).

Skipped where the `f5tts` extra (`f5_tts`) is not installed. The M57 placements, the seed, the
OOM rerun and the CFG copy reuse are in `engines_native/streaming.py`.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from mizuoto_runtime import CheckpointError, MizuotoError, Runtime
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.audio import Audio, write_wav
from mizuoto_runtime.engines import Sampling
from mizuoto_runtime.memory.tiling import OVERLAP_FRAMES, TILE_FRAMES

from conftest import link_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

Checkpoint = Callable[..., Path]
REFERENCE = Audio(0.05 * torch.sin(torch.arange(24000) / 6.0).unsqueeze(0), 24000)  # quiet: loudness restored
TRANSCRIPT = "a reference sentence"
TEXT = "Hello from the tiny flow."
STEPS = 4


def say(rt: Runtime, folder: Path, dtype: str = "float32", **kwargs: object) -> tuple[torch.Tensor, dict]:
    engine = rt.engine("f5tts", folder, dtype)
    engine.steps = STEPS
    audio, meta = rt.say(engine, TEXT, reference=REFERENCE, transcript=TRANSCRIPT, sampling=Sampling(seed=5),
                         **kwargs)  # type: ignore[arg-type]
    return audio.waveform, meta


def test_equals_upstream_inference(f5tts_checkpoint: Checkpoint) -> None:
    """Our three phases over our own load (meta + mmap safetensors, published names) equal
    F5-TTS's own inference steps over its own load (`load_state_dict` of the EMA weights,
    `Vocos.from_hparams`), sample by sample."""
    from safetensors.torch import load_file
    from vocos import Vocos

    from mizuoto_runtime.engines.f5tts.engine import _ref_text
    from mizuoto_runtime.engines.f5tts.tiny import ARCH, VOCAB
    from mizuoto_runtime.engines.f5tts.upstream import import_upstream

    folder = f5tts_checkpoint()
    ours, meta = say(Runtime(), folder)
    assert meta["memory"]["components"].keys() == {"f5tts:flow", "f5tts:vocoder"}

    up = import_upstream()
    arch = {k: v for k, v in ARCH.items() if k != "checkpoint_activations"}
    model = up.CFM(transformer=up.DiT(**arch, text_num_embeds=len(VOCAB), mel_dim=100),
                   mel_spec_kwargs=dict(n_fft=1024, hop_length=256, win_length=1024, n_mel_channels=100,
                                        target_sample_rate=24000, mel_spec_type="vocos"),
                   odeint_kwargs=dict(method="euler"), vocab_char_map={t: i for i, t in enumerate(VOCAB)})
    state = load_file(str(folder / "model_1250000.safetensors"))
    model.load_state_dict({k.replace("ema_model.", ""): v for k, v in state.items() if k not in ("initted", "step")})
    vocoder = Vocos.from_hparams(str(folder / "vocos-mel-24khz" / "config.yaml"))
    vocoder.load_state_dict(torch.load(folder / "vocos-mel-24khz" / "pytorch_model.bin", weights_only=True))
    vocoder.eval()
    # infer_batch_process / _infer_basic, step by step:
    audio = REFERENCE.waveform
    rms = torch.sqrt(torch.mean(torch.square(audio)))
    audio = audio * 0.1 / rms
    ref_text = _ref_text(TRANSCRIPT)
    ref_len = audio.shape[-1] // 256
    duration = ref_len + int(ref_len / len(ref_text.encode()) * len(TEXT.encode()))
    with torch.inference_mode():
        generated, _ = model.sample(cond=audio, text=up.convert_char_to_pinyin([ref_text + TEXT]), duration=duration,
                                    steps=STEPS, cfg_strength=2.0, sway_sampling_coef=-1.0, seed=5)
        wave_ = vocoder.decode(generated.to(torch.float32)[:, ref_len:, :].permute(0, 2, 1)) * rms / 0.1
    assert torch.equal(ours, wave_), "f5tts differs from the package's own inference"


def test_bf16_load_converts_in_place(f5tts_checkpoint: Checkpoint) -> None:
    """M27: the DiT loads straight into bfloat16 (built on meta, each tensor converted as it is
    copied in) and equals float32-then-convert; the vocoder stays float32; the engine speaks."""
    folder = f5tts_checkpoint()
    rt = Runtime()
    half = rt.engine("f5tts", folder, "bfloat16")
    full = rt.engine("f5tts", folder, "float32")
    ours, theirs = half.cfm.state_dict(), full.cfm.state_dict()
    for key, value in ours.items():
        if value.is_floating_point() and not key.endswith("inv_freq"):
            assert value.dtype == torch.bfloat16, key
            assert torch.equal(value, theirs[key].to(torch.bfloat16)), key
    assert {p.dtype for p in half.vocos.parameters()} == {torch.float32}
    wav, _ = say(rt, folder, "bfloat16")
    assert wav.dtype == torch.float32 and wav.abs().max() > 0
    # A checkpoint saved in bfloat16 loads into a bfloat16 model bit for bit.
    saved = f5tts_checkpoint("bfloat16")
    again = rt.engine("f5tts", saved, "bfloat16")
    assert all(torch.equal(v, again.cfm.state_dict()[k]) for k, v in ours.items())


def test_loading_errors_name_what_is_wrong(f5tts_checkpoint: Checkpoint, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = f5tts_checkpoint()
    rt = Runtime()
    with pytest.raises(CheckpointError, match="folder not found"):
        rt.engine("f5tts", tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="no model_<step>.safetensors"):
        rt.engine("f5tts", link_checkpoint(folder, tmp_path / "noweights", skip=("model_1250000.safetensors",)))
    with pytest.raises(CheckpointError, match="missing vocab.txt, vocos-mel-24khz/pytorch_model.bin"):
        rt.engine("f5tts", link_checkpoint(folder, tmp_path / "missing",
                                           skip=("vocab.txt", "vocos-mel-24khz/pytorch_model.bin")))
    # A vocoder config may name Vocos's own classes only: a model folder is not a license to import.
    evil = link_checkpoint(folder, tmp_path / "evil", skip=("vocos-mel-24khz/config.yaml",))
    config = (folder / "vocos-mel-24khz" / "config.yaml").read_text()
    (evil / "vocos-mel-24khz" / "config.yaml").write_text(config.replace("vocos.models.VocosBackbone", "os.system"))
    with pytest.raises(CheckpointError, match="backbone.class_path must be one of .* got 'os.system'"):
        rt.engine("f5tts", evil)
    mismatched = link_checkpoint(folder, tmp_path / "mismatched", skip=("model_1250000.safetensors",))
    state = load_file(str(folder / "model_1250000.safetensors"))
    state["ema_model.transformer.proj_out.weight"] = state["ema_model.transformer.proj_out.weight"][:-1].clone()
    save_file(state, str(mismatched / "model_1250000.safetensors"))
    with pytest.raises(CheckpointError, match=r"shape of transformer.proj_out.weight: checkpoint \(99, 256\)"):
        rt.engine("f5tts", mismatched)
    ctx = rt.request()
    engine = rt.engine("f5tts", folder)
    with pytest.raises(MizuotoError, match="reference audio and its transcript"):
        engine.voice_prompt(ctx, REFERENCE)
    with pytest.raises(MizuotoError, match="no speaker or instruct"):
        engine.voice_prompt(ctx, REFERENCE, TRANSCRIPT, speaker="alice")


def test_vocoder_tiles_are_the_whole_decode_outside_the_crossfades(f5tts_checkpoint: Checkpoint) -> None:
    """M43: Vocos is local in time, so tiled_1d is a valid fallback: away from each crossfade a
    tile's samples are the whole decode's (float noise aside); and after an OOM the vocoder
    falls back to it when allowed (M42), recorded in `applied.fallbacks`."""
    from mizuoto_runtime.memory.tiling import tiled_1d

    engine = Runtime().engine("f5tts", f5tts_checkpoint())
    mel = torch.randn(1, 100, 700, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        whole = engine.vocos.decode(mel)
        tiled = tiled_1d(engine.vocos.decode, mel)
    assert tiled.shape == whole.shape == (1, 700 * 256)
    hop = TILE_FRAMES - OVERLAP_FRAMES
    pure = torch.zeros(700, dtype=torch.bool)
    for start in range(0, 700, hop):
        pure[start + OVERLAP_FRAMES:start + hop] = True  # neither crossfade touches these frames
    pure = pure.repeat_interleave(256)
    assert (tiled - whole)[0, pure].abs().max() <= 1e-5 * whole.abs().max()
    assert (tiled - whole)[0, ~pure].abs().max() > 1e-4 * whole.abs().max()  # the crossfades are not exact

    expected, _ = say(Runtime(), f5tts_checkpoint())
    rt = Runtime({"compute.simulate_vram_mb": 64, "compute.vram_mode": "none"})
    failing = FailingAllocations()
    rt.devices.fault_hook = failing
    engine = rt.engine("f5tts", f5tts_checkpoint())
    decode = engine.decode

    def decode_failing_thrice(*args: object, **kwargs: object) -> Audio:
        failing.left = 3  # the first attempt and both exact retries run out of memory
        return decode(*args, **kwargs)  # type: ignore[arg-type]

    engine.decode = decode_failing_thrice  # type: ignore[method-assign]
    wav, meta = say(rt, f5tts_checkpoint(), allow_fallback=True)
    assert meta["applied"] == {"oom_retries": 2, "fallbacks": ["tiled_1d"]}
    assert torch.equal(wav, expected)  # under one tile (256 frames), the tiled decode is the whole one


class FailingAllocations:
    """A device fault hook: the next `left` counted allocations run out of memory."""

    def __init__(self) -> None:
        self.left = 0

    def __call__(self, device: torch.device, nbytes: int) -> None:
        if self.left:
            self.left -= 1
            raise torch.OutOfMemoryError(f"injected OOM ({nbytes} bytes on {device})")


def test_estimates_follow_the_request(f5tts_checkpoint: Checkpoint) -> None:
    """M45: flow memory from the request's frames, text and steps (not a worst case); Vocos's
    from the frames it decodes; both grow with the request."""
    engine = Runtime().engine("f5tts", f5tts_checkpoint())
    short = engine.flow_memory(frames=300, text_tokens=40, steps=32)
    assert short < engine.flow_memory(600, 40, 32) < 2.1 * short
    assert engine.flow_memory(300, 40, 8) < short  # the ODE trajectory keeps every step
    assert engine.vocoder_memory(600) == 2 * engine.vocoder_memory(300)
    voice = engine.voice_prompt(Runtime().request(), REFERENCE, TRANSCRIPT)
    ref, total = engine.durations(voice, TEXT)
    assert ref == 24000 // 256 and total > ref  # 1 s of reference, counted as upstream does


def test_progress_per_ode_step(f5tts_checkpoint: Checkpoint) -> None:
    rt = Runtime()
    steps: list[tuple[int, int]] = []
    engine = rt.engine("f5tts", f5tts_checkpoint())
    engine.steps = STEPS
    rt.say(engine, TEXT, reference=REFERENCE, transcript=TRANSCRIPT, on_progress=lambda d, t: steps.append((d, t)))
    assert steps == [(i, STEPS) for i in range(STEPS + 1)]
    assert not engine.cfm.transformer._forward_pre_hooks


def test_cli_say_and_tiny_checkpoint(f5tts_checkpoint: Checkpoint, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "tiny-f5"
    assert main(["tiny-checkpoint", "--engine", "f5tts", str(folder)]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert set(files) == {"model_1250000.safetensors", "vocab.txt", "F5TTS_tiny.yaml",
                          "vocos-mel-24khz/config.yaml", "vocos-mel-24khz/pytorch_model.bin"}
    for name in files:
        digest = [hashlib.sha256((root / name).read_bytes()).hexdigest() for root in (folder, f5tts_checkpoint())]
        assert digest[0] == digest[1], f"{name} is not byte-identical across runs"
    write_wav(tmp_path / "ref.wav", REFERENCE)
    out = tmp_path / "out.wav"
    code = main(["say", "--engine", "f5tts", "--model", str(folder), TEXT, "-o", str(out), "--voice",
                 str(tmp_path / "ref.wav"), "--ref-text", TRANSCRIPT, "--setting", "compute.simulate_vram_mb=16"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["sample_rate"] == 24000 and result["memory"]["streamed_mb"] > 0
    with wave.open(str(out)) as f:
        assert f.getframerate() == 24000 and f.getnframes() > 24000 // 2
        assert np.abs(np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")).max() > 10
    shutil.rmtree(folder)


def test_a_larger_device_keeps_part_of_the_dit_and_copies_less(f5tts_checkpoint: Checkpoint) -> None:
    """M45 (issue 21): the flow's estimate fits the request, so the room it leaves on a 40 MB
    device holds a DiT block: part of the DiT stays resident and the request copies less than on
    a 24 MB device, where every block streams — the same audio on both. (An estimate 1.4x its
    measured peak streamed every block on both.)"""
    reference = Audio(0.05 * torch.sin(torch.arange(60000) / 6.0).unsqueeze(0), 24000)  # 2.5 s
    runs = {}
    for mb_ in (24, 40):
        rt = Runtime({"compute.simulate_vram_mb": mb_})
        engine = rt.engine("f5tts", f5tts_checkpoint())
        engine.steps = STEPS
        audio, meta = rt.say(engine, "The runtime streams every block, step after step.", reference=reference,
                             transcript=TRANSCRIPT, sampling=Sampling(seed=5))
        flow = engine.flow  # type: ignore[attr-defined]
        runs[mb_] = (audio.waveform, meta["memory"]["components"]["f5tts:flow"]["loaded_mb"], flow.plan.fixed_bytes,
                     meta["memory"]["streamed_mb"])
    assert runs[24][1] * 2**20 == pytest.approx(runs[24][2], abs=2**14)  # only the fixed part: every block streams
    assert runs[40][1] * 2**20 > runs[40][2] + 2**20  # a block resident
    assert 0 < runs[40][3] < runs[24][3]
    assert torch.equal(runs[24][0], runs[40][0])
