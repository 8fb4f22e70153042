"""The Dia engine on tiny random checkpoints (issue 34: M1, M4, M27, M45, M46, M57; equal to
upstream; two voices in one pass).

Skipped where transformers (requirements/dia.txt) is not installed. The upstream reference is
transformers' own pipeline: `DiaProcessor` (feature extractor, Dia's tokenizer, `DacModel`)
→ `DiaForConditionalGeneration.generate` → `DiaProcessor.batch_decode`, each loaded with its
own ``from_pretrained`` from the tiny folder.
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
from engines_native.streaming import PLACEMENTS, _placed

from mizuoto_runtime import CheckpointError, MizuotoError, OomInjector, Runtime
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.audio import Audio, write_wav
from mizuoto_runtime.engines import Sampling
from mizuoto_runtime.engines.base import Turn
from mizuoto_runtime.memory.small_weights import PUBLISHED
from mizuoto_runtime.nn.loading import build_on_meta

from conftest import link_checkpoint, require_engine
from support.oom import allocations_during

pytestmark = pytest.mark.usefixtures("one_torch_thread")

Checkpoint = Callable[..., Path]
REFERENCE = Audio(0.3 * torch.sin(torch.arange(22050) / 6.0).unsqueeze(0), 22050)  # resampled to 44.1 kHz
OTHER = Audio(0.2 * torch.sin(torch.arange(44100) / 3.0).unsqueeze(0), 44100)
TRANSCRIPT = "A reference sentence."
TEXT = "Hello there. (laughs) How are you?"
SAMPLING = Sampling(seed=3, max_new_tokens=24, temperature=1.3, top_k=45, top_p=0.95)


def upstream(folder: Path) -> tuple[torch.nn.Module, object]:
    from transformers import DacModel, DiaFeatureExtractor, DiaForConditionalGeneration, DiaProcessor, DiaTokenizer

    model = DiaForConditionalGeneration.from_pretrained(str(folder)).eval()
    processor = DiaProcessor(DiaFeatureExtractor.from_pretrained(str(folder)),
                             DiaTokenizer.from_pretrained(str(folder)),
                             DacModel.from_pretrained(str(folder / "dac_44khz")).eval())
    return model, processor


def upstream_say(folder: Path, text: str, audio: list[np.ndarray] | None, sampling: Sampling = SAMPLING
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequence and audio of transformers' own pipeline for one row (our max_new_tokens
    counts frames: generate runs the delay pattern's 15 steps more)."""
    model, processor = upstream(folder)
    inputs = processor(text=[text], audio=audio, padding=True, return_tensors="pt")
    prompt_len = processor.get_audio_prompt_len(inputs["decoder_attention_mask"])
    torch.manual_seed(sampling.seed)
    out = model.generate(**inputs, max_new_tokens=sampling.max_new_tokens + 15, do_sample=True,
                         temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    return out[0], processor.batch_decode(out, audio_prompt_len=prompt_len)[0]


def mono44(audio: Audio) -> np.ndarray:
    import torchaudio

    return torchaudio.functional.resample(audio.mono().float(), audio.sample_rate, 44100).numpy()


def ours(rt: Runtime, folder: Path, turns: list[Turn], refs: list[tuple[Audio, str] | None],
         sampling: Sampling = SAMPLING, weights: str | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    engine = rt.engine("dia", folder, weights=weights)
    ctx = rt.request(seed=sampling.seed)
    voices = [engine.voice_prompt(ctx, *ref) if ref else engine.voice_prompt(ctx) for ref in refs]
    codes = (engine.generate(ctx, turns[0].text, voices[0], sampling) if len(refs) == 1 and len(turns) == 1
             else engine.generate_dialogue(ctx, turns, voices, sampling))
    return codes.tokens, engine.decode(ctx, codes).waveform[0], ctx.meta


@pytest.mark.parametrize("cloned", [True, False])
def test_one_voice_equals_transformers_pipeline(dia_checkpoint: Checkpoint, cloned: bool) -> None:
    """Our three phases (our load, our inputs from the cached codes) equal the processor +
    generate + batch_decode, sequence and samples, with and without an audio prompt."""
    folder = dia_checkpoint()
    ref = (REFERENCE, TRANSCRIPT) if cloned else None
    tokens, wav, meta = ours(Runtime(), folder, [Turn(0, TEXT)], [ref])
    text = f"[S1] {TRANSCRIPT} [S1] {TEXT}" if cloned else f"[S1] {TEXT}"
    expected_tokens, expected_wav = upstream_say(folder, text, [mono44(REFERENCE)] if cloned else None)
    assert torch.equal(tokens, expected_tokens) and torch.equal(wav, expected_wav)
    assert wav.shape[-1] > 0 and wav.abs().max() > 0
    placed = {key.split(":", 1)[1] for key in meta["memory"]["components"]}
    assert ("dac_encoder" in placed) == cloned  # M1: only a clone encodes audio


def test_dialogue_in_one_pass_equals_transformers_pipeline(dia_checkpoint: Checkpoint) -> None:
    """Two voices, one pass: the turns with [S1]/[S2] and the cloned voice's transcript in front
    (its codes the audio prompt), nonverbal tags passed through as text; equal to the
    processor + generate on that script."""
    folder = dia_checkpoint()
    turns = [Turn(0, "Did you hear that?"), Turn(1, "(laughs) I did."), Turn(0, "Good.")]
    tokens, wav, _ = ours(Runtime(), folder, turns, [(REFERENCE, TRANSCRIPT), None])
    script = f"[S1] {TRANSCRIPT} [S1] Did you hear that? [S2] (laughs) I did. [S1] Good."
    expected_tokens, expected_wav = upstream_say(folder, script, [mono44(REFERENCE)])
    assert torch.equal(tokens, expected_tokens) and torch.equal(wav, expected_wav)


def test_two_cloned_voices_prompt_in_order(dia_checkpoint: Checkpoint) -> None:
    """Both voices cloned: the transcripts tagged [S1] then [S2], the codes of each reference
    (cached separately, M4) joined in that order, the delay pattern applied as the processor
    applies it; generate and decode on that input equal transformers'."""
    folder = dia_checkpoint()
    rt = Runtime()
    engine = rt.engine("dia", folder)
    ctx = rt.request()
    voices = [engine.voice_prompt(ctx, REFERENCE, TRANSCRIPT), engine.voice_prompt(ctx, OTHER, "[S2] Another one.")]
    turns = [Turn(1, "Me first."), Turn(0, "Then me.")]
    text, codes = engine.script(turns, voices)
    assert text == f"[S1] {TRANSCRIPT} [S2] Another one. [S2] Me first. [S1] Then me."
    assert codes is not None and torch.equal(codes, torch.cat([voices[0].data["codes"], voices[1].data["codes"]]))
    ours_codes = engine.generate_dialogue(ctx, turns, voices, SAMPLING)
    wav = engine.decode(ctx, ours_codes).waveform[0]
    model, processor = upstream(folder)
    inputs = engine.inputs(text, codes)
    # The processor's delay layout for a prompt of these codes, built by the processor itself.
    proc_inputs = processor(text=[text], audio=[mono44(REFERENCE)], padding=True, return_tensors="pt")
    assert proc_inputs["decoder_input_ids"].dtype == inputs["decoder_input_ids"].dtype
    torch.manual_seed(SAMPLING.seed)
    out = model.generate(**inputs, max_new_tokens=SAMPLING.max_new_tokens + 15, do_sample=True,
                         temperature=SAMPLING.temperature, top_k=SAMPLING.top_k, top_p=SAMPLING.top_p)
    expected = processor.batch_decode(out, audio_prompt_len=processor.get_audio_prompt_len(
        inputs["decoder_attention_mask"]))[0]
    assert torch.equal(ours_codes.tokens, out[0]) and torch.equal(wav, expected)


def test_dialogue_refuses_what_dia_cannot_speak(dia_checkpoint: Checkpoint) -> None:
    rt = Runtime()
    engine = rt.engine("dia", dia_checkpoint())
    ctx = rt.request()
    voice = engine.voice_prompt(ctx)
    assert engine.VOICES_PER_PASS == 2
    with pytest.raises(MizuotoError, match="3 voices in one pass; this engine speaks at most 2"):
        engine.generate_dialogue(ctx, [Turn(0, "a")], [voice, voice, voice], SAMPLING)
    with pytest.raises(MizuotoError, match="turn 1 names voice 2"):
        engine.generate_dialogue(ctx, [Turn(2, "a")], [voice, voice], SAMPLING)
    with pytest.raises(MizuotoError, match="turn 1: text is empty"):
        engine.generate_dialogue(ctx, [Turn(0, "  ")], [voice], SAMPLING)
    with pytest.raises(MizuotoError, match="transcript"):
        engine.voice_prompt(ctx, REFERENCE)
    with pytest.raises(MizuotoError, match="no named speakers"):
        engine.voice_prompt(ctx, speaker="alice")


def test_a_cached_voice_is_not_encoded_again(dia_checkpoint: Checkpoint) -> None:
    """M4: the same reference again places no DAC encoder."""
    rt = Runtime({"compute.simulate_vram_mb": 128})
    folder = dia_checkpoint()
    first, _, _ = ours(rt, folder, [Turn(0, TEXT)], [(REFERENCE, TRANSCRIPT)])
    rt.manager.events.clear()
    again, _, _ = ours(rt, folder, [Turn(0, TEXT)], [(REFERENCE, TRANSCRIPT)])
    placed = {name for action, name, _ in rt.manager.events if action == "place"}
    assert "dia:dac_encoder" not in placed and "dia:talker" in placed
    assert torch.equal(first, again)


def _streamed(folder: Path, placement: str,
              weights: str = PUBLISHED) -> tuple[torch.Tensor, torch.Tensor, dict, set[str]]:
    """The dialogue on `placement`, and the talker's units that streamed."""
    rt, engine = _placed("dia", placement, folder, weights)
    tokens, wav, meta = ours(rt, folder, [Turn(0, "Streaming."), Turn(1, "Is exact.")], [(REFERENCE, TRANSCRIPT), None],
                             weights=weights)
    return tokens, wav, meta, {u.name for u in engine.talker.streamed_units}


_plain: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


def _plain_run(folder: Path, weights: str = PUBLISHED) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain CPU run's codes and audio with `weights`, made once per module."""
    if weights not in _plain:
        _plain[weights] = _streamed(folder, "plain", weights)[:2]
    return _plain[weights]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_streams_exactly(dia_checkpoint: Checkpoint, placement: str) -> None:
    """M57 (M1, M15, M20): none / half / whole on the strict device equal the plain CPU run."""
    folder = dia_checkpoint()
    expected_tokens, expected_wav = _plain_run(folder)
    tokens, wav, meta, streamed = _streamed(folder, placement)
    assert torch.equal(tokens, expected_tokens) and torch.equal(wav, expected_wav)
    memory = meta["memory"]
    components = {key.split(":", 1)[1] for key in memory["components"]}
    assert components == {"dac_encoder", "quantizer", "talker", "dac_decoder"}
    partial = {key.split(":", 1)[1] for key in memory["partial"]}
    if placement == "whole":
        assert partial == set() and memory["streamed_mb"] == 0
    else:
        assert "talker" in partial and memory["streamed_mb"] > 0
    if placement == "half":  # the part marked hot (run at every step) is resident first
        assert "model.decoder.layers.0" not in streamed and "model.encoder.layers.1" in streamed


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("weights", ["fp8_e4m3fn", "int8"])
def test_talker_stored_small_streams_exactly(dia_checkpoint: Checkpoint, weights: str, placement: str) -> None:
    """Issue 36 (M57 with the option on): the talker stored in fp8 / int8, every placement equals
    the plain run with the same choice, streams, and says the choice."""
    folder = dia_checkpoint()
    _, plain_wav = _plain_run(folder)
    expected_tokens, expected_wav = _plain_run(folder, weights)
    assert not torch.equal(expected_wav, plain_wav)  # the choice changes the audio
    tokens, wav, meta, _ = _streamed(folder, placement, weights)
    assert torch.equal(tokens, expected_tokens), f"{weights} ({placement}): codes differ from the plain run with it"
    assert torch.equal(wav, expected_wav), f"{weights} ({placement}): audio differs from the plain run with it"
    assert meta["applied"]["weights"] == {"generate": weights}
    if placement != "whole":
        assert meta["memory"]["streamed_mb"] > 0


def test_oom_in_the_talker_reruns_exactly(dia_checkpoint: Checkpoint) -> None:
    """M40: an OOM mid-generation (a streamed copy) reruns the talker phase with the same draws."""
    folder = dia_checkpoint()
    expected = _plain.get("plain") or _streamed(folder, "plain")[:2]
    probe, engine = _placed("dia", "none", folder)
    with allocations_during(probe, engine, "generate_dialogue") as inside:
        ours(probe, folder, [Turn(0, "Streaming."), Turn(1, "Is exact.")], [(REFERENCE, TRANSCRIPT), None])
    assert len(inside) > 10
    rt, _ = _placed("dia", "none", folder)
    injector = OomInjector(at=inside[len(inside) // 2])
    rt.devices.fault_hook = injector
    tokens, wav, meta = ours(rt, folder, [Turn(0, "Streaming."), Turn(1, "Is exact.")], [(REFERENCE, TRANSCRIPT), None])
    assert injector.raised == 1 and meta["applied"]["oom_retries"] == 1
    assert torch.equal(tokens, expected[0]) and torch.equal(wav, expected[1])


def test_published_shapes_build_on_meta() -> None:
    """The published configs (Dia-1.6B-0626, DAC 44 kHz) build through transformers' classes on
    meta: 1.6B parameters in Dia, the codec's 9 codebooks at hop 512; nothing allocated."""
    require_engine("dia")
    from transformers import DacConfig, DacModel, DiaConfig, DiaForConditionalGeneration

    from mizuoto_runtime.engines.dia.published import DAC_44KHZ, DIA_1_6B

    model = build_on_meta(lambda: DiaForConditionalGeneration(DiaConfig(**DIA_1_6B)), torch.bfloat16)
    count = sum(p.numel() for p in model.parameters())
    assert 1.5e9 < count < 1.7e9 and all(p.is_meta for p in model.parameters())
    dac = build_on_meta(lambda: DacModel(DacConfig(**DAC_44KHZ)))
    assert dac.config.hop_length == 512 and len(dac.quantizer.quantizers) == 9


def test_loading_errors_name_what_is_wrong(dia_checkpoint: Checkpoint, tmp_path: Path) -> None:
    folder = dia_checkpoint()
    rt = Runtime()
    with pytest.raises(CheckpointError, match="folder not found"):
        rt.engine("dia", tmp_path / "nowhere")
    no_codec = link_checkpoint(folder, tmp_path / "no_codec",
                               skip=("dac_44khz/config.json", "dac_44khz/model.safetensors"))
    with pytest.raises(CheckpointError, match="needs the DAC codec"):
        rt.engine("dia", no_codec)
    shard = link_checkpoint(folder, tmp_path / "shard", skip=("model-00002-of-00002.safetensors",))
    with pytest.raises(CheckpointError, match="missing model-00002-of-00002.safetensors"):
        rt.engine("dia", shard)
    from mizuoto_runtime.engines.dia.engine import DiaEngine

    assert DiaEngine.describe_checkpoint(folder) is not None and DiaEngine.describe_checkpoint(tmp_path) is None


def test_bf16_load_converts_in_place(dia_checkpoint: Checkpoint) -> None:
    """M27: Dia loads straight into bfloat16, equal to float32-then-convert; the codec stays
    float32; a bfloat16 checkpoint loads bit for bit and speaks."""
    rt = Runtime()
    half = rt.engine("dia", dia_checkpoint(), "bfloat16")
    full = rt.engine("dia", dia_checkpoint(), "float32")
    theirs = full.model.state_dict()
    for key, value in half.model.state_dict().items():
        if value.is_floating_point():
            assert value.dtype == torch.bfloat16 and torch.equal(value, theirs[key].to(torch.bfloat16)), key
    assert {p.dtype for p in half.dac.parameters()} == {torch.float32}
    saved = rt.engine("dia", dia_checkpoint("bfloat16"), "bfloat16")
    assert all(torch.equal(v, saved.model.state_dict()[k]) for k, v in half.model.state_dict().items())
    ctx = rt.request()
    codes = saved.generate(ctx, TEXT, saved.voice_prompt(ctx), SAMPLING)
    assert codes.tokens.shape[-1] == 9


def test_estimates_follow_the_request(dia_checkpoint: Checkpoint) -> None:
    """M45/M46: the talker's memory grows with the text, the audio prompt and the frames; the
    codec's with its samples or frames; never a worst case."""
    engine = Runtime().engine("dia", dia_checkpoint())
    base = engine.talker_memory(40, 0, 200)
    assert base < engine.talker_memory(80, 0, 200) and base < engine.talker_memory(40, 100, 200)
    assert base < engine.talker_memory(40, 0, 400) < 2 * base
    assert engine.decoder_memory(100) < engine.decoder_memory(200) <= 2 * engine.decoder_memory(100)
    second = engine.voice_prompt_memory(44100)
    assert second < engine.voice_prompt_memory(88200) <= 2 * second
    assert engine.frames_for("abc", Sampling(max_new_tokens=5)) == 5


def test_cli_say_and_tiny_checkpoint(dia_checkpoint: Checkpoint, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "tiny-dia"
    assert main(["tiny-checkpoint", "--engine", "dia", str(folder)]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert {"config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer_config.json",
            "preprocessor_config.json", "dac_44khz/config.json", "dac_44khz/model.safetensors"} <= set(files)
    for name in ("model-00001-of-00002.safetensors", "dac_44khz/model.safetensors", "config.json"):
        digest = [hashlib.sha256((root / name).read_bytes()).hexdigest() for root in (folder, dia_checkpoint())]
        assert digest[0] == digest[1], f"{name} is not byte-identical across runs"
    write_wav(tmp_path / "ref.wav", REFERENCE)
    out = tmp_path / "out.wav"
    code = main(["say", "--engine", "dia", "--model", str(folder), TEXT, "-o", str(out), "--voice",
                 str(tmp_path / "ref.wav"), "--ref-text", TRANSCRIPT, "--max-new-tokens", "40",
                 "--setting", "compute.simulate_vram_mb=16"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["sample_rate"] == 44100 and result["memory"]["streamed_mb"] > 0
    with wave.open(str(out)) as f:
        assert f.getframerate() == 44100 and f.getnframes() > 0


def test_a_script_is_one_pass_of_both_speakers(dia_checkpoint: Checkpoint) -> None:
    """Issue 34 item 3: a script's lines between pauses go to Dia as one [S1]/[S2] pass (the
    characters in order of first appearance), equal to calling the phases directly."""
    from mizuoto_runtime.app.scripts.runner import CharacterVoice, speak_script
    from mizuoto_runtime.app.scripts.syntax import parse_script

    folder = dia_checkpoint()
    rt = Runtime()
    engine = rt.engine("dia", folder)
    voices = {"Alice": CharacterVoice(REFERENCE, TRANSCRIPT), "Bob": CharacterVoice()}
    script = parse_script("[Bob] Did you hear that?\n[Alice] (laughs) I did.", ["Alice", "Bob"])
    out = speak_script(rt, engine, script, voices, SAMPLING)
    assert len(out.lines) == 1
    _, wav, _ = ours(Runtime(), folder, [Turn(0, "Did you hear that?"), Turn(1, "(laughs) I did.")],
                     [None, (REFERENCE, TRANSCRIPT)])
    assert torch.equal(out.lines[0].waveform[0], wav)
