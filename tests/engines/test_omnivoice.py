"""The OmniVoice engine on tiny random checkpoints (issue 11: M1, M4, M27, M43, M45, M50).

Skipped where the `omnivoice` extra is not installed. The M57 placements, the seed and the OOM
rerun are in `engines_native/streaming.py`.
"""
from __future__ import annotations

import hashlib
import json
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
REFERENCE = Audio(0.3 * torch.sin(torch.arange(16000) / 6.0).unsqueeze(0), 16000)  # resampled to 24 kHz
TRANSCRIPT = "a reference sentence"
TEXT = "Hello from the tiny diffusion."
STEPS = 4
VOICES: dict[str, dict[str, object]] = {
    "clone": {"reference": REFERENCE, "transcript": TRANSCRIPT},
    "design": {"instruct": "male, high pitch"},
    "auto": {},
}


def say(rt: Runtime, folder: Path, dtype: str = "float32", seed: int = 5, **voice: object) -> tuple[torch.Tensor, dict]:
    engine = rt.engine("omnivoice", folder, dtype)
    engine.steps = STEPS
    audio, meta = rt.say(engine, TEXT, sampling=Sampling(seed=seed, language="English"), **voice)  # type: ignore[arg-type]
    return audio.waveform, meta


@pytest.mark.parametrize("mode", sorted(VOICES))
def test_equals_the_package_generate(omnivoice_checkpoint: Checkpoint, mode: str) -> None:
    """Our three phases over our own load (meta + mmap safetensors) equal upstream's one call,
    `OmniVoice.from_pretrained(folder).generate(...)`, sample by sample."""
    from omnivoice import OmniVoice

    folder = omnivoice_checkpoint()
    ours, meta = say(Runtime(), folder, **VOICES[mode])
    upstream = OmniVoice.from_pretrained(str(folder))
    kwargs: dict[str, object] = {}
    if mode == "clone":
        kwargs = {"ref_audio": (REFERENCE.waveform, REFERENCE.sample_rate), "ref_text": TRANSCRIPT}
    elif mode == "design":
        kwargs = {"instruct": VOICES["design"]["instruct"]}
    torch.manual_seed(5)
    wavs = upstream.generate(text=TEXT, language="English", num_step=STEPS, **kwargs)
    assert torch.equal(ours[0], torch.from_numpy(wavs[0])), f"{mode} differs from the package"
    placed = {key.split(":", 1)[1] for key in meta["memory"]["components"]}
    assert ("audio_encoder" in placed) == (mode == "clone")  # M1: only a clone encodes audio


def test_a_cached_voice_is_not_encoded_again(omnivoice_checkpoint: Checkpoint) -> None:
    """M4: the same reference again places no codec encoder."""
    rt = Runtime({"compute.simulate_vram_mb": 128})
    first, _ = say(rt, omnivoice_checkpoint(), **VOICES["clone"])
    rt.manager.events.clear()
    again, meta = say(rt, omnivoice_checkpoint(), **VOICES["clone"])
    placed = {name for action, name, _ in rt.manager.events if action == "place"}
    assert "omnivoice:audio_encoder" not in placed and "omnivoice:llm" in placed
    assert torch.equal(first, again)


def test_bf16_load_converts_in_place(omnivoice_checkpoint: Checkpoint) -> None:
    """M27: the LLM loads straight into bfloat16 and equals float32-then-convert; the codec stays
    float32; a bfloat16 checkpoint loads bit for bit; the engine speaks."""
    rt = Runtime()
    half = rt.engine("omnivoice", omnivoice_checkpoint(), "bfloat16")
    full = rt.engine("omnivoice", omnivoice_checkpoint(), "float32")
    ours, theirs = half.model.state_dict(), full.model.state_dict()
    for key, value in ours.items():
        if value.is_floating_point():
            assert value.dtype == torch.bfloat16, key
            assert torch.equal(value, theirs[key].to(torch.bfloat16)), key
    assert {p.dtype for p in half.codec.parameters()} == {torch.float32}
    assert not any(p is q for p in half.model.parameters() for q in half.codec.parameters())
    saved = rt.engine("omnivoice", omnivoice_checkpoint("bfloat16"), "bfloat16")
    assert all(torch.equal(v, saved.model.state_dict()[k]) for k, v in ours.items())
    wav, _ = say(rt, omnivoice_checkpoint(), "bfloat16", **VOICES["clone"])
    assert wav.dtype == torch.float32 and wav.abs().max() > 0


def test_loading_and_voice_errors_name_what_is_wrong(omnivoice_checkpoint: Checkpoint, tmp_path: Path) -> None:
    folder = omnivoice_checkpoint()
    rt = Runtime()
    with pytest.raises(CheckpointError, match="folder not found"):
        rt.engine("omnivoice", tmp_path / "nowhere")
    partial = link_checkpoint(folder, tmp_path / "partial", skip=("audio_tokenizer/model.safetensors",))
    with pytest.raises(CheckpointError, match="missing audio_tokenizer/model.safetensors"):
        rt.engine("omnivoice", partial)
    (partial / "audio_tokenizer" / "model.safetensors").symlink_to(folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="missing acoustic_encoder.*unexpected llm.embed_tokens.weight"):
        rt.engine("omnivoice", partial)
    engine = rt.engine("omnivoice", folder)
    ctx = rt.request()
    with pytest.raises(MizuotoError, match="'purple' -> 'purple' \\(unsupported"):
        engine.voice_prompt(ctx, instruct="purple")
    with pytest.raises(MizuotoError, match="no built-in speakers"):
        engine.voice_prompt(ctx, speaker="alice")
    with pytest.raises(MizuotoError, match="transcript"):
        engine.voice_prompt(ctx, REFERENCE)


def test_decoder_tiles_are_the_whole_decode_outside_the_crossfades(omnivoice_checkpoint: Checkpoint) -> None:
    """M43: the DAC decoder is local in time (about 10 frames of context each side), so tiled_1d is
    a valid fallback: away from each crossfade a tile's samples are the whole decode's, up to the
    float noise of convolutions over other lengths (measured ~2e-4 of the signal's spread, at the
    very first frames too); at the seams they are not."""
    from mizuoto_runtime.memory.tiling import tiled_1d

    engine = Runtime().engine("omnivoice", omnivoice_checkpoint())
    frames = 600
    codes = torch.randint(0, 256, (1, 8, frames), generator=torch.Generator().manual_seed(0))
    hop_samples = engine.codec.config.hop_length
    with torch.inference_mode():
        whole = engine.codec.decode(codes).audio_values
        tiled = tiled_1d(lambda c: engine.codec.decode(c).audio_values, codes)
    assert tiled.shape == whole.shape == (1, 1, frames * hop_samples)
    hop = TILE_FRAMES - OVERLAP_FRAMES
    pure = torch.zeros(frames, dtype=torch.bool)
    for start in range(0, frames, hop):
        pure[start + OVERLAP_FRAMES:start + hop] = True
    pure = pure.repeat_interleave(hop_samples)
    assert (tiled - whole)[0, 0, pure].abs().max() <= 1e-3 * whole.abs().max()
    assert (tiled - whole)[0, 0, ~pure].abs().max() > 1e-2 * whole.abs().max()


def test_estimates_follow_the_request(omnivoice_checkpoint: Checkpoint) -> None:
    """M45: the LLM's working memory from the request's sequence (style, text, reference and
    target tokens), the codec's from its frames or reference samples; never a worst case."""
    rt = Runtime()
    engine = rt.engine("omnivoice", omnivoice_checkpoint())
    short = engine.llm_memory(200)
    assert short < engine.llm_memory(400) < 4.1 * short  # the attention scores grow quadratically
    assert engine.codec_decoder_memory(100) < engine.codec_decoder_memory(200) <= 2 * engine.codec_decoder_memory(100)
    assert (engine.voice_prompt_memory(24000) < engine.voice_prompt_memory(48000)
            < 2.1 * engine.voice_prompt_memory(24000))
    voice = engine.voice_prompt(rt.request(), **VOICES["clone"])  # type: ignore[arg-type]
    task = engine._task(TEXT, voice, Sampling(language="English"))
    ref = voice.data["prompt"].ref_audio_tokens.shape[-1]
    assert ref + task.target_lens[0] < engine.sequence_length(task) < ref + task.target_lens[0] + 80


def test_cli_say_and_tiny_checkpoint(omnivoice_checkpoint: Checkpoint, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "tiny-omnivoice"
    assert main(["tiny-checkpoint", "--engine", "omnivoice", str(folder)]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "audio_tokenizer/config.json", "audio_tokenizer/model.safetensors",
            "audio_tokenizer/preprocessor_config.json"} <= set(files)
    for name in ("model.safetensors", "audio_tokenizer/model.safetensors", "config.json", "tokenizer.json"):
        digest = [hashlib.sha256((root / name).read_bytes()).hexdigest() for root in (folder, omnivoice_checkpoint())]
        assert digest[0] == digest[1], f"{name} is not byte-identical across runs"
    write_wav(tmp_path / "ref.wav", REFERENCE)
    out = tmp_path / "out.wav"
    code = main(["say", "--engine", "omnivoice", "--model", str(folder), TEXT, "-o", str(out), "--voice",
                 str(tmp_path / "ref.wav"), "--ref-text", TRANSCRIPT, "--language", "English",
                 "--setting", "compute.simulate_vram_mb=24"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["sample_rate"] == 24000 and result["memory"]["streamed_mb"] > 0
    with wave.open(str(out)) as f:
        assert f.getframerate() == 24000 and f.getnframes() > 24000 // 2
        assert np.abs(np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")).max() > 10
