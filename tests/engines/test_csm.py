"""The CSM engine on tiny random checkpoints (issue 34: M1, M4, M27, M45, M46, M57; equal to
upstream; a conversation of two speakers in one pass).

Skipped where transformers (requirements/csm.txt) is not installed. The upstream reference is
transformers' own pipeline: `CsmProcessor.apply_chat_template` (speaker ids as roles, context
turns with their audio) → `CsmForConditionalGeneration.generate(output_audio=True)`, each loaded
with its own ``from_pretrained`` from the tiny folder.
"""
from __future__ import annotations

import hashlib
import json
import types
import wave
from collections.abc import Callable, Iterator
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
REFERENCE = Audio(0.3 * torch.sin(torch.arange(16000) / 6.0).unsqueeze(0), 16000)  # resampled to 24 kHz
TRANSCRIPT = "A reference sentence."
TEXT = "Hello there, how are you?"
SAMPLING = Sampling(seed=3, max_new_tokens=10, temperature=0.9, top_k=50)
UPSTREAM_SETTINGS = {"max_new_tokens": 10, "do_sample": True, "temperature": 0.9, "top_k": 50, "top_p": 1.0}


def mono24(audio: Audio) -> np.ndarray:
    import torchaudio

    return torchaudio.functional.resample(audio.mono().float(), audio.sample_rate, 24000).numpy()


def upstream(folder: Path) -> tuple[torch.nn.Module, object]:
    from transformers import CsmForConditionalGeneration, CsmProcessor

    return CsmForConditionalGeneration.from_pretrained(str(folder)).eval(), CsmProcessor.from_pretrained(str(folder))


def upstream_say(model: torch.nn.Module, processor: object, conversation: list[dict], seed: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """One utterance of transformers' pipeline: its frames up to the all-zero one, and its audio."""
    inputs = processor.apply_chat_template(conversation, tokenize=True, return_dict=True)  # type: ignore[attr-defined]
    torch.manual_seed(seed)
    out = model.generate(**inputs, **UPSTREAM_SETTINGS, output_audio=True, return_dict_in_generate=True)
    frames = out.sequences[0]
    ends = (frames == 0).all(dim=-1).nonzero()
    return frames[:int(ends.min()) if ends.numel() else frames.shape[0]], out.audio[0]


def turn(speaker: int, text: str, audio: np.ndarray | None = None) -> dict:
    content: list[dict] = [{"type": "text", "text": text}]
    if audio is not None:
        content.append({"type": "audio", "path": audio})
    return {"role": str(speaker), "content": content}


def ours(rt: Runtime, folder: Path, turns: list[Turn], refs: list[tuple[Audio, str] | None],
         sampling: Sampling = SAMPLING, weights: str | None = None
         ) -> tuple[torch.Tensor, torch.Tensor, dict, list[int]]:
    engine = rt.engine("csm", folder, weights=weights)
    ctx = rt.request(seed=sampling.seed)
    voices = [engine.voice_prompt(ctx, *ref) if ref else engine.voice_prompt(ctx) for ref in refs]
    codes = (engine.generate(ctx, turns[0].text, voices[0], sampling) if len(refs) == 1 and len(turns) == 1
             else engine.generate_dialogue(ctx, turns, voices, sampling))
    return codes.tokens, engine.decode(ctx, codes).waveform[0], ctx.meta, codes.extra["turns"]


@pytest.mark.parametrize("cloned", [True, False])
def test_one_voice_equals_transformers_pipeline(csm_checkpoint: Checkpoint, cloned: bool) -> None:
    """Our three phases (our load, our context codes) equal the processor's chat template +
    generate(output_audio=True), frames and samples, with and without a context turn."""
    folder = csm_checkpoint()
    tokens, wav, meta, _ = ours(Runtime(), folder, [Turn(0, TEXT)], [(REFERENCE, TRANSCRIPT) if cloned else None])
    context = [turn(0, TRANSCRIPT, mono24(REFERENCE))] if cloned else []
    expected_tokens, expected_wav = upstream_say(*upstream(folder), [*context, turn(0, TEXT)], SAMPLING.seed)
    assert torch.equal(tokens, expected_tokens) and torch.equal(wav, expected_wav)
    assert wav.shape[-1] > 0 and wav.abs().max() > 0
    placed = {key.split(":", 1)[1] for key in meta["memory"]["components"]}
    assert ("mimi_encoder" in placed) == cloned  # M1: only a context recording is encoded


@pytest.fixture
def codec_gives(monkeypatch: pytest.MonkeyPatch) -> Callable[[torch.nn.Module, list[torch.Tensor]], None]:
    """Upstream's codec, asked to encode the context audio, gives these codes in turn (the
    formatted input our conversation gives: a spoken turn's context is its own codes)."""
    def install(model: torch.nn.Module, codes: list[torch.Tensor]) -> None:
        given: Iterator[torch.Tensor] = iter(codes)

        def encode(_audio: torch.Tensor) -> types.SimpleNamespace:
            return types.SimpleNamespace(audio_codes=next(given).transpose(0, 1)[None])

        monkeypatch.setattr(model.codec_model, "encode", encode)
    return install


def test_conversation_in_one_pass_equals_transformers_pipeline(
        csm_checkpoint: Checkpoint, codec_gives: Callable[[torch.nn.Module, list[torch.Tensor]], None]) -> None:
    """Two speakers, one pass: speaker 0's context turn (its recording), then the turns, each
    `generate` over the conversation so far, with seed + k. Turn 1 equals upstream's pipeline
    as is; turn 2 equals it given the same conversation, turn 1's codes as its context."""
    folder = csm_checkpoint()
    turns = [Turn(0, "Did you hear that?"), Turn(1, "I did, yes.")]
    tokens, wav, meta, lengths = ours(Runtime(), folder, turns, [(REFERENCE, TRANSCRIPT), None])
    assert meta["applied"].get("oom_retries", 0) == 0 and len(lengths) == 2
    first, second = torch.split(tokens, lengths)
    model, processor = upstream(folder)
    ref = mono24(REFERENCE)
    expected_first, audio_first = upstream_say(model, processor, [turn(0, TRANSCRIPT, ref), turn(0, turns[0].text)],
                                               SAMPLING.seed)
    assert torch.equal(first, expected_first)
    rt = Runtime()
    ref_codes = rt.engine("csm", folder).voice_prompt(rt.request(), REFERENCE, TRANSCRIPT).data["codes"]
    codec_gives(model, [ref_codes, first])
    placeholder = np.zeros(first.shape[0] * 1920, dtype=np.float32)  # as long as turn 1: as many audio tokens
    expected_second, audio_second = upstream_say(
        model, processor, [turn(0, TRANSCRIPT, ref), turn(0, turns[0].text, placeholder), turn(1, turns[1].text)],
        SAMPLING.seed + 1)
    assert torch.equal(second, expected_second)
    assert torch.equal(wav, torch.cat([audio_first, audio_second]))


def test_conversation_refuses_what_csm_cannot_speak(csm_checkpoint: Checkpoint) -> None:
    rt = Runtime()
    engine = rt.engine("csm", csm_checkpoint())
    ctx = rt.request()
    voice = engine.voice_prompt(ctx)
    assert engine.VOICES_PER_PASS == 2
    with pytest.raises(MizuotoError, match="3 voices in one pass; this engine speaks at most 2"):
        engine.generate_dialogue(ctx, [Turn(0, "a")], [voice, voice, voice], SAMPLING)
    with pytest.raises(MizuotoError, match="turn 1 names voice 1"):
        engine.generate_dialogue(ctx, [Turn(1, "a")], [voice], SAMPLING)
    with pytest.raises(MizuotoError, match="turn 1: text is empty"):
        engine.generate_dialogue(ctx, [Turn(0, "")], [voice], SAMPLING)
    with pytest.raises(MizuotoError, match="transcript"):
        engine.voice_prompt(ctx, REFERENCE)
    with pytest.raises(MizuotoError, match="no named speakers"):
        engine.voice_prompt(ctx, instruct="calm")


def test_depth_decoder_settings_do_not_leak_between_requests(csm_checkpoint: Checkpoint) -> None:
    """`generate` writes depth-decoder settings into the shared model: a request with its own
    subtalker temperature leaves the next plain request as it was before."""
    folder = csm_checkpoint()
    rt = Runtime()
    plain, _, _, _ = ours(rt, folder, [Turn(0, TEXT)], [None])
    hot = Sampling(seed=3, max_new_tokens=10, subtalker_temperature=3.0, subtalker_top_k=2000)
    other, _, _, _ = ours(rt, folder, [Turn(0, TEXT)], [None], hot)
    again, _, _, _ = ours(rt, folder, [Turn(0, TEXT)], [None])
    assert not torch.equal(other, plain) and torch.equal(again, plain)


def test_a_cached_voice_is_not_encoded_again(csm_checkpoint: Checkpoint) -> None:
    """M4: the same reference again places no Mimi encoder."""
    rt = Runtime({"compute.simulate_vram_mb": 128})
    folder = csm_checkpoint()
    first = ours(rt, folder, [Turn(0, TEXT)], [(REFERENCE, TRANSCRIPT)])[0]
    rt.manager.events.clear()
    again = ours(rt, folder, [Turn(0, TEXT)], [(REFERENCE, TRANSCRIPT)])[0]
    placed = {name for action, name, _ in rt.manager.events if action == "place"}
    assert "csm:mimi_encoder" not in placed and "csm:talker" in placed
    assert torch.equal(first, again)


DIALOGUE = [Turn(0, "Streaming."), Turn(1, "Is exact.")]
_plain: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


def _streamed(folder: Path, placement: str,
              weights: str = PUBLISHED) -> tuple[torch.Tensor, torch.Tensor, dict, set[str]]:
    """The conversation on `placement`, and the talker's units that streamed."""
    rt, engine = _placed("csm", placement, folder, weights)
    tokens, wav, meta, _ = ours(rt, folder, DIALOGUE, [(REFERENCE, TRANSCRIPT), None], weights=weights)
    return tokens, wav, meta, {u.name for u in engine.talker.streamed_units}


def _plain_run(folder: Path, weights: str = PUBLISHED) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain CPU run's codes and audio with `weights`, made once per module."""
    if weights not in _plain:
        _plain[weights] = _streamed(folder, "plain", weights)[:2]
    return _plain[weights]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_streams_exactly(csm_checkpoint: Checkpoint, placement: str) -> None:
    """M57 (M1, M15, M20): none / half / whole on the strict device equal the plain CPU run."""
    folder = csm_checkpoint()
    expected_tokens, expected_wav = _plain_run(folder)
    tokens, wav, meta, streamed = _streamed(folder, placement)
    assert torch.equal(tokens, expected_tokens) and torch.equal(wav, expected_wav)
    memory = meta["memory"]
    components = {key.split(":", 1)[1] for key in memory["components"]}
    assert components == {"mimi_encoder", "quantizer", "talker", "mimi_decoder"}
    partial = {key.split(":", 1)[1] for key in memory["partial"]}
    if placement == "whole":
        assert partial == set() and memory["streamed_mb"] == 0
    else:
        assert "talker" in partial and memory["streamed_mb"] > 0
    if placement == "half":  # the part marked hot (run at every step) is resident first
        assert "depth_decoder.model.layers.0" not in streamed and "backbone_model.layers.0" in streamed


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("weights", ["fp8_e4m3fn", "int8"])
def test_talker_stored_small_streams_exactly(csm_checkpoint: Checkpoint, weights: str, placement: str) -> None:
    """Issue 36 (M57 with the option on): the talker stored in fp8 / int8, every placement equals
    the plain run with the same choice, streams, and says the choice."""
    folder = csm_checkpoint()
    plain_tokens, _ = _plain_run(folder)
    expected_tokens, expected_wav = _plain_run(folder, weights)
    # The choice changes the codes (not the audio: the tiny Mimi decodes different codes alike)
    assert not torch.equal(expected_tokens, plain_tokens)
    tokens, wav, meta, _ = _streamed(folder, placement, weights)
    assert torch.equal(tokens, expected_tokens), f"{weights} ({placement}): codes differ from the plain run with it"
    assert torch.equal(wav, expected_wav), f"{weights} ({placement}): audio differs from the plain run with it"
    assert meta["applied"]["weights"] == {"generate": weights}
    if placement != "whole":
        assert meta["memory"]["streamed_mb"] > 0


def test_oom_in_the_talker_reruns_exactly(csm_checkpoint: Checkpoint) -> None:
    """M40: an OOM mid-conversation (a streamed copy) reruns the talker phase, every turn, with
    the same draws."""
    folder = csm_checkpoint()
    expected = _plain.get("plain") or _streamed(folder, "plain")[:2]
    probe, engine = _placed("csm", "none", folder)
    with allocations_during(probe, engine, "generate_dialogue") as inside:
        ours(probe, folder, DIALOGUE, [(REFERENCE, TRANSCRIPT), None])
    assert len(inside) > 10
    rt, _ = _placed("csm", "none", folder)
    injector = OomInjector(at=inside[len(inside) // 2])
    rt.devices.fault_hook = injector
    tokens, wav, meta, _ = ours(rt, folder, DIALOGUE, [(REFERENCE, TRANSCRIPT), None])
    assert injector.raised == 1 and meta["applied"]["oom_retries"] == 1
    assert torch.equal(tokens, expected[0]) and torch.equal(wav, expected[1])


def test_published_shapes_build_on_meta() -> None:
    """The published config (csm-1b with its Mimi) builds through transformers' classes on meta:
    about 1.6B parameters with the codec; nothing allocated."""
    require_engine("csm")
    from transformers import CsmConfig, CsmForConditionalGeneration

    from mizuoto_runtime.engines.csm.published import CSM_1B

    model = build_on_meta(lambda: CsmForConditionalGeneration(CsmConfig(**CSM_1B)), torch.bfloat16)
    count = sum(p.numel() for p in model.parameters())
    codec = sum(p.numel() for p in model.codec_model.parameters())
    assert 1.4e9 < count < 1.8e9 and 70e6 < codec < 90e6 and all(p.is_meta for p in model.parameters())
    assert model.config.codec_config.frame_rate == 12.5


def test_loading_errors_name_what_is_wrong(csm_checkpoint: Checkpoint, tmp_path: Path) -> None:
    folder = csm_checkpoint()
    rt = Runtime()
    with pytest.raises(CheckpointError, match="folder not found"):
        rt.engine("csm", tmp_path / "nowhere")
    partial = link_checkpoint(folder, tmp_path / "partial", skip=("tokenizer.json",))
    with pytest.raises(CheckpointError, match="missing tokenizer.json"):
        rt.engine("csm", partial)
    shard = link_checkpoint(folder, tmp_path / "shard", skip=("model-00001-of-00002.safetensors",))
    with pytest.raises(CheckpointError, match="missing model-00001-of-00002.safetensors"):
        rt.engine("csm", shard)
    from mizuoto_runtime.engines.csm.engine import CsmEngine

    assert CsmEngine.describe_checkpoint(folder) is not None and CsmEngine.describe_checkpoint(tmp_path) is None


def test_bf16_load_converts_in_place(csm_checkpoint: Checkpoint) -> None:
    """M27: backbone and depth decoder load straight into bfloat16, equal to float32-then-convert;
    Mimi stays float32 and outside the talker's component; a bfloat16 checkpoint loads bit for
    bit and speaks."""
    rt = Runtime()
    half = rt.engine("csm", csm_checkpoint(), "bfloat16")
    full = rt.engine("csm", csm_checkpoint(), "float32")
    theirs = full.model.state_dict()
    assert not any(k.startswith("codec_model.") for k in theirs)
    for key, value in half.model.state_dict().items():
        if value.is_floating_point():
            assert value.dtype == torch.bfloat16 and torch.equal(value, theirs[key].to(torch.bfloat16)), key
    assert {p.dtype for p in half.codec.parameters()} == {torch.float32}
    saved = rt.engine("csm", csm_checkpoint("bfloat16"), "bfloat16")
    assert all(torch.equal(v, saved.model.state_dict()[k]) for k, v in half.model.state_dict().items())
    ctx = rt.request()
    codes = saved.generate(ctx, TEXT, saved.voice_prompt(ctx), SAMPLING)
    assert codes.tokens.shape[-1] == 8


def test_estimates_follow_the_request(csm_checkpoint: Checkpoint) -> None:
    """M45/M46: the talker's memory grows with the prompt, the frames and the context; Mimi's
    with its samples; never a worst case."""
    engine = Runtime().engine("csm", csm_checkpoint())
    base = engine.talker_memory(100, 50, 0)
    assert base < engine.talker_memory(200, 50, 0) and base < engine.talker_memory(100, 100, 0)
    assert base < engine.talker_memory(100, 50, 3000) < 3 * base
    second = engine.mimi_encoder_memory(24000)
    assert second < engine.mimi_encoder_memory(48000) <= 2 * second
    assert engine.mimi_decoder_memory(10) < engine.mimi_decoder_memory(20) <= 2 * engine.mimi_decoder_memory(10)
    assert engine.frames_for("abc", Sampling(max_new_tokens=2)) == 2


def test_cli_say_and_tiny_checkpoint(csm_checkpoint: Checkpoint, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "tiny-csm"
    assert main(["tiny-checkpoint", "--engine", "csm", str(folder)]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert {"config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
            "tokenizer_config.json", "chat_template.jinja", "processor_config.json"} <= set(files)
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "tokenizer.json"):
        digest = [hashlib.sha256((root / name).read_bytes()).hexdigest() for root in (folder, csm_checkpoint())]
        assert digest[0] == digest[1], f"{name} is not byte-identical across runs"
    write_wav(tmp_path / "ref.wav", REFERENCE)
    out = tmp_path / "out.wav"
    code = main(["say", "--engine", "csm", "--model", str(folder), TEXT, "-o", str(out), "--voice",
                 str(tmp_path / "ref.wav"), "--ref-text", TRANSCRIPT, "--max-new-tokens", "12",
                 "--setting", "compute.simulate_vram_mb=10"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["sample_rate"] == 24000 and result["memory"]["streamed_mb"] > 0
    with wave.open(str(out)) as f:
        assert f.getframerate() == 24000 and f.getnframes() > 0


def test_a_script_is_one_pass_of_both_speakers(csm_checkpoint: Checkpoint) -> None:
    """Issue 34 item 3: a script's lines between pauses go to CSM as one conversation (speaker
    ids in order of first appearance), equal to calling the phases directly."""
    from mizuoto_runtime.app.scripts.runner import CharacterVoice, speak_script
    from mizuoto_runtime.app.scripts.syntax import parse_script

    folder = csm_checkpoint()
    rt = Runtime()
    engine = rt.engine("csm", folder)
    voices = {"Alice": CharacterVoice(REFERENCE, TRANSCRIPT), "Bob": CharacterVoice()}
    script = parse_script("[Alice] Did you hear that?\n[Bob] I did.", ["Alice", "Bob"])
    out = speak_script(rt, engine, script, voices, SAMPLING)
    assert len(out.lines) == 1
    _, wav, _, _ = ours(Runtime(), folder, [Turn(0, "Did you hear that?"), Turn(1, "I did.")],
                        [(REFERENCE, TRANSCRIPT), None])
    assert torch.equal(out.lines[0].waveform[0], wav)
