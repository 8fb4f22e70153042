"""The Higgs Audio v2 engine on tiny random checkpoints (issue 34: M1, M4, M27, M40, M45, M55–M57).

Skipped where transformers with Higgs Audio v2 is not installed (requirements/higgsaudio.txt).
Equal to upstream: our three phases against transformers' own path, written as its
documentation writes it (the processor's ``apply_chat_template`` encoding the reference audio,
``model.generate``, the processor's ``decode``), with the same seed, sample for sample; single
voice (cloned with and without a transcript, described, the model's own) and a two-voice dialogue.
"""
from __future__ import annotations

import hashlib
import json
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mizuoto_runtime import CheckpointError, MizuotoError, OomInjector, Runtime
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.audio import Audio, write_wav
from mizuoto_runtime.engines import Sampling
from mizuoto_runtime.engines.base import Turn
from mizuoto_runtime.errors import ArgumentError

from conftest import link_checkpoint, require_engine
from support.oom import allocations_during

pytestmark = pytest.mark.usefixtures("one_torch_thread")

Checkpoint = Callable[..., Path]
REFERENCE = Audio(0.3 * torch.sin(torch.arange(24000) / 6.0).unsqueeze(0), 24000)
OTHER = Audio(0.2 * torch.sin(torch.arange(36000) / 11.0).unsqueeze(0), 24000)
TRANSCRIPT = "a reference sentence"
TEXT = "Hello from the tiny talker."
SEED = 7
NEW_TOKENS = 32
SYSTEM = {"role": "system", "content": [{"type": "text", "text": "Generate audio following instruction."}]}
SCENE_TEXT = {"type": "text", "text": "Audio is recorded from a quiet room."}
LINES = [Turn(0, "I can't believe you did that!"), Turn(1, "Oh, come on."), Turn(0, "Fine.")]


def _array(audio: Audio) -> np.ndarray:
    return audio.mono().numpy()


# The conversations transformers' documentation writes for each case (model_doc/higgs_audio_v2).
def _upstream_conversation(mode: str) -> list[dict[str, Any]]:
    user = {"role": "user", "content": [{"type": "text", "text": TEXT}]}
    if mode == "clone":  # "Zero-shot voice cloning"
        return [SYSTEM, {"role": "scene", "content": [SCENE_TEXT]},
                {"role": "user", "content": [{"type": "text", "text": TRANSCRIPT}]},
                {"role": "assistant", "content": [{"type": "audio", "audio": _array(REFERENCE)}]}, user]
    if mode == "clone_untranscribed":  # "Multi-speaker voice cloning", one speaker
        scene = [SCENE_TEXT, {"type": "text", "text": "SPEAKER0:"}, {"type": "audio", "audio": _array(REFERENCE)}]
        return [SYSTEM, {"role": "scene", "content": scene},
                {"role": "user", "content": [{"type": "text", "text": f"[SPEAKER0] {TEXT}"}]}]
    if mode == "described":  # "Multi-speaker smart voice", one speaker
        return [SYSTEM, {"role": "scene", "content": [SCENE_TEXT, {"type": "text", "text": "SPEAKER0: feminine"}]},
                {"role": "user", "content": [{"type": "text", "text": f"[SPEAKER0] {TEXT}"}]}]
    if mode == "dialogue":  # "Multi-speaker voice cloning"
        scene = [SCENE_TEXT, {"type": "text", "text": "SPEAKER0:"}, {"type": "audio", "audio": _array(REFERENCE)},
                 {"type": "text", "text": "SPEAKER1:"}, {"type": "audio", "audio": _array(OTHER)}]
        text = "\n".join(f"[SPEAKER{t.voice}] {t.text}" for t in LINES)
        user = {"role": "user", "content": [{"type": "text", "text": text}]}
        return [SYSTEM, {"role": "scene", "content": scene}, user]
    return [SYSTEM, {"role": "scene", "content": [SCENE_TEXT]}, user]  # "Single-speaker smart voice"


VOICES: dict[str, dict[str, object]] = {
    "clone": {"reference": REFERENCE, "transcript": TRANSCRIPT},
    "clone_untranscribed": {"reference": REFERENCE},
    "described": {"instruct": "feminine"},
    "smart": {},
}


def upstream_processor(folder: Path, tmp_path: Path) -> Any:
    """transformers' own `HiggsAudioV2Processor.from_pretrained`, on a copy of the folder whose
    processor_config.json names the local audio tokenizer (the published one names the hub)."""
    from transformers import HiggsAudioV2Processor

    local = link_checkpoint(folder, tmp_path / "upstream", skip=("processor_config.json",))
    config = json.loads((folder / "processor_config.json").read_text(encoding="utf-8"))
    config["audio_tokenizer"]["audio_tokenizer_name_or_path"] = str(folder / "audio_tokenizer")
    (local / "processor_config.json").write_text(json.dumps(config), encoding="utf-8")
    return HiggsAudioV2Processor.from_pretrained(str(local))


def upstream_audio(folder: Path, tmp_path: Path, mode: str, greedy: bool = False) -> torch.Tensor:
    from transformers import HiggsAudioV2ForConditionalGeneration

    processor = upstream_processor(folder, tmp_path)
    model = HiggsAudioV2ForConditionalGeneration.from_pretrained(str(folder))
    inputs = processor.apply_chat_template(_upstream_conversation(mode), add_generation_prompt=True, tokenize=True,
                                           return_dict=True, sampling_rate=24000, return_tensors="pt")
    torch.manual_seed(SEED)
    settings = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 0.9, "top_k": 50, "top_p": 1.0}
    out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, **settings)
    return processor.decode(out)


def ours(rt: Runtime, folder: Path, mode: str, greedy: bool = False,
         weights: str | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    engine = rt.engine("higgsaudio", folder, weights=weights)
    ctx = rt.request(seed=SEED)
    sampling = Sampling(seed=SEED, max_new_tokens=NEW_TOKENS, temperature=0.9, top_k=50, top_p=1.0,
                        do_sample=not greedy)
    if mode == "dialogue":
        voices = [engine.voice_prompt(ctx, REFERENCE), engine.voice_prompt(ctx, OTHER, TRANSCRIPT)]
        codes = engine.generate_dialogue(ctx, LINES, voices, sampling)
    else:
        voice = engine.voice_prompt(ctx, **VOICES[mode])  # type: ignore[arg-type]
        codes = engine.generate(ctx, TEXT, voice, sampling)
    audio = engine.decode(ctx, codes)
    return codes.tokens, audio.waveform, ctx.meta


@pytest.mark.parametrize("mode", [*sorted(VOICES), "dialogue"])
def test_equals_transformers_generate_and_decode(higgsaudio_checkpoint: Checkpoint, tmp_path: Path,
                                                 mode: str) -> None:
    """Our phases over our own load (meta + mmap safetensors shards) equal transformers' path
    from the same folder, sample for sample; only a cloned voice places the encoder (M1)."""
    folder = higgsaudio_checkpoint()
    _, wav, meta = ours(Runtime(), folder, mode)
    expected = upstream_audio(folder, tmp_path, mode)
    assert wav.shape[-1] > 0 and wav.abs().max() > 0
    assert torch.equal(wav[0], expected), f"{mode} differs from transformers"
    placed = {key.split(":", 1)[1] for key in meta["memory"]["components"]}
    assert ("audio_encoder" in placed) == (mode in ("clone", "clone_untranscribed", "dialogue"))


def test_greedy_equals_transformers_too(higgsaudio_checkpoint: Checkpoint, tmp_path: Path) -> None:
    """Sampling off (the documentation's do_sample=False): the same audio as transformers'."""
    folder = higgsaudio_checkpoint()
    _, wav, _ = ours(Runtime(), folder, "dialogue", greedy=True)
    assert wav.shape[-1] > 0 and wav.abs().max() > 0
    assert torch.equal(wav[0], upstream_audio(folder, tmp_path, "dialogue", greedy=True))


def test_the_prompt_is_the_published_format(higgsaudio_checkpoint: Checkpoint) -> None:
    """The dialogue's prompt as the chat template renders it: speaker tags on each line, each
    speaker's reference in the scene; and the same ids as the processor's (with audio encoded)."""
    rt = Runtime()
    engine = rt.engine("higgsaudio", higgsaudio_checkpoint())
    ctx = rt.request()
    voices = [engine.voice_prompt(ctx, REFERENCE), engine.voice_prompt(ctx, instruct="masculine, deep")]
    conversation, codes = engine._conversation([(t.voice, t.text) for t in LINES], voices)
    text = engine.processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    assert ("Audio is recorded from a quiet room.\n\nSPEAKER0: <|audio_out_bos|><|AUDIO_OUT|><|audio_eos|>\n"
            "SPEAKER1: masculine, deep\n<|scene_desc_end|>") in text
    assert "[SPEAKER0] I can't believe you did that!\n[SPEAKER1] Oh, come on.\n[SPEAKER0] Fine." in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n<|audio_out_bos|>")
    assert len(codes) == 1 and codes[0].shape == (8, 25)  # 1 s at 25 Hz


def test_dialogue_limits_and_errors(higgsaudio_checkpoint: Checkpoint) -> None:
    rt = Runtime()
    engine = rt.engine("higgsaudio", higgsaudio_checkpoint())
    assert engine.VOICES_PER_PASS == 2
    ctx = rt.request()
    voice = engine.voice_prompt(ctx)
    with pytest.raises(ArgumentError, match="3 voices in one pass; this engine speaks at most 2"):
        engine.generate_dialogue(ctx, LINES, [voice] * 3, Sampling())
    with pytest.raises(ArgumentError, match="turn 2 names voice 1"):
        engine.generate_dialogue(ctx, LINES, [voice], Sampling())
    with pytest.raises(ArgumentError, match="turn 1: text is empty"):
        engine.generate_dialogue(ctx, [Turn(0, " ")], [voice], Sampling())
    with pytest.raises(MizuotoError, match="no built-in speakers"):
        engine.voice_prompt(ctx, speaker="alice")


def test_a_cached_voice_is_not_encoded_again(higgsaudio_checkpoint: Checkpoint) -> None:
    """M4: the same reference again places no encoder and speaks the same."""
    rt = Runtime({"compute.simulate_vram_mb": 128})
    first = ours(rt, higgsaudio_checkpoint(), "clone")[1]
    rt.manager.events.clear()
    again = ours(rt, higgsaudio_checkpoint(), "clone")[1]
    placed = {name for action, name, _ in rt.manager.events if action == "place"}
    assert "higgsaudio:audio_encoder" not in placed and "higgsaudio:talker" in placed
    assert torch.equal(first, again)


def test_the_talker_streams_its_dual_ffn_layers_as_units(higgsaudio_checkpoint: Checkpoint) -> None:
    """M11/M12: each decoder layer is one unit holding its attention and both FFNs (text and
    audio), so one streamed copy serves every position; embeddings, norms and heads are fixed."""
    engine = Runtime().engine("higgsaudio", higgsaudio_checkpoint())
    units = engine.talker.units
    layers = engine.model.model.layers
    assert len(units) == len(layers) == 4
    for unit, layer in zip(units, layers):
        names = {s.name for s in unit.slots}
        assert any(".mlp.down_proj" in n for n in names) and any(".audio_mlp.down_proj" in n for n in names)
        linear = [m.weight for m in layer.modules() if isinstance(m, torch.nn.Linear)]
        assert sum(w.numel() * w.element_size() for w in linear) == unit.nbytes  # M13: its norms stay fixed
    assert engine.talker.kind == "sequence"


# ---- M57: every placement equals the plain run ---------------------------------------------
PLACEMENTS = ("none", "half", "whole")
_plain: dict[tuple[str, str | None], tuple[torch.Tensor, torch.Tensor]] = {}


def placed_runtime(placement: str) -> Runtime:
    settings: dict[str, object] = {}
    if placement != "plain":
        settings = {"compute.simulate_vram_mb": 256, "compute.vram_mode": "none" if placement == "none" else "normal"}
    return Runtime(settings)


def placed_say(folder: Path, mode: str, placement: str, weights: str | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, dict]:
    rt = placed_runtime(placement)
    engine = rt.engine("higgsaudio", folder, weights=weights)
    if placement == "half":
        for h in engine.handles():
            h.cap_bytes = (h.min_working_set + h.size_bytes) // 2
    return ours(rt, folder, mode, weights=weights)


def plain(folder: Path, mode: str, weights: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if (mode, weights) not in _plain:
        _plain[mode, weights] = placed_say(folder, mode, "plain", weights)[:2]
    return _plain[mode, weights]


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("mode", ["clone", "dialogue"])
def test_streams_exactly(higgsaudio_checkpoint: Checkpoint, mode: str, placement: str) -> None:
    """M57 (M1, M15, M20): none / half / whole on the strict device equal the plain CPU run,
    codes and audio; the partial placements really stream."""
    folder = higgsaudio_checkpoint()
    expected_codes, expected_wav = plain(folder, mode)
    codes, wav, meta = placed_say(folder, mode, placement)
    assert torch.equal(codes, expected_codes), f"{mode} ({placement}): codes differ from the plain run"
    assert torch.equal(wav, expected_wav), f"{mode} ({placement}): audio differs from the plain run"
    memory = meta["memory"]
    assert {key.split(":", 1)[1] for key in memory["components"]} == {"audio_encoder", "quantizer", "talker",
                                                                       "audio_decoder"}
    if placement == "whole":
        assert memory["partial"] == {} and memory["streamed_mb"] == 0
    else:
        assert "higgsaudio:talker" in memory["partial"] and memory["streamed_mb"] > 0


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("weights", ["fp8_e4m3fn", "int8"])
def test_talker_stored_small_streams_exactly(higgsaudio_checkpoint: Checkpoint, weights: str, placement: str) -> None:
    """Issue 36 (M57 with the option on): the talker stored in fp8 / int8, every placement equals
    the plain run with the same choice, streams, and says the choice."""
    folder = higgsaudio_checkpoint()
    expected_codes, expected_wav = plain(folder, "clone", weights)
    if weights.startswith("fp8"):  # int8's error is too small to change the tiny talker's 32 sampled codes
        assert not torch.equal(expected_codes, plain(folder, "clone")[0])  # the choice changes the codes
    codes, wav, meta = placed_say(folder, "clone", placement, weights)
    assert meta["applied"]["weights"] == {"generate": weights}
    assert torch.equal(codes, expected_codes), f"{weights} ({placement}): codes differ from the plain run with it"
    assert torch.equal(wav, expected_wav), f"{weights} ({placement}): audio differs from the plain run with it"
    if placement != "whole":
        assert meta["memory"]["streamed_mb"] > 0


def test_an_oom_in_the_talker_reruns_exactly(higgsaudio_checkpoint: Checkpoint) -> None:
    """M40: an OOM mid-generation (a streamed copy) reruns the talker phase with the same draws."""
    folder = higgsaudio_checkpoint()
    expected = plain(folder, "clone")
    probe = placed_runtime("none")
    with allocations_during(probe, probe.engine("higgsaudio", folder), "generate") as inside:
        ours(probe, folder, "clone")
    assert len(inside) > 20  # every layer streams at every step
    rt = placed_runtime("none")
    injector = OomInjector(at=inside[len(inside) // 2])
    rt.devices.fault_hook = injector
    codes, wav, meta = ours(rt, folder, "clone")
    assert injector.raised == 1 and meta["applied"]["oom_retries"] == 1
    assert torch.equal(codes, expected[0]) and torch.equal(wav, expected[1])


def test_the_seed_decides(higgsaudio_checkpoint: Checkpoint) -> None:
    folder = higgsaudio_checkpoint()
    rt = Runtime()
    engine = rt.engine("higgsaudio", folder)
    voice = engine.voice_prompt(rt.request(), REFERENCE, TRANSCRIPT)
    runs = [engine.generate(rt.request(), TEXT, voice, Sampling(seed=s, max_new_tokens=NEW_TOKENS)).tokens
            for s in (1, 1, 2)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0][:8], runs[2][:8])


# ---- loading (M27) ---------------------------------------------------------------------------
def test_bf16_load_converts_in_place(higgsaudio_checkpoint: Checkpoint) -> None:
    """M27: the LLM loads straight into bfloat16 and equals float32-then-convert; the audio
    tokenizer stays float32; a bfloat16 checkpoint loads bit for bit; the engine speaks."""
    rt = Runtime()
    half = rt.engine("higgsaudio", higgsaudio_checkpoint(), "bfloat16")
    full = rt.engine("higgsaudio", higgsaudio_checkpoint(), "float32")
    mine, theirs = half.model.state_dict(), full.model.state_dict()
    for key, value in mine.items():
        if value.is_floating_point() and "rotary" not in key:
            assert value.dtype == torch.bfloat16, key
            assert torch.equal(value, theirs[key].to(torch.bfloat16)), key
    assert {p.dtype for p in half.codec.parameters()} == {torch.float32}
    saved = rt.engine("higgsaudio", higgsaudio_checkpoint("bfloat16"), "bfloat16")
    assert all(torch.equal(v, saved.model.state_dict()[k]) for k, v in mine.items())
    audio, _ = rt.say(half, TEXT, reference=REFERENCE, transcript=TRANSCRIPT, sampling=Sampling(max_new_tokens=16))
    assert audio.waveform.dtype == torch.float32 and audio.waveform.abs().max() > 0


def test_loading_errors_name_what_is_wrong(higgsaudio_checkpoint: Checkpoint, tmp_path: Path) -> None:
    folder = higgsaudio_checkpoint()
    rt = Runtime()
    with pytest.raises(CheckpointError, match="folder not found"):
        rt.engine("higgsaudio", tmp_path / "nowhere")
    no_codec = link_checkpoint(folder, tmp_path / "no_codec", skip=("audio_tokenizer/model.safetensors",))
    with pytest.raises(CheckpointError, match="missing audio_tokenizer/model.safetensors"):
        rt.engine("higgsaudio", no_codec)
    shard = sorted(p.name for p in folder.glob("model-*.safetensors"))[-1]
    no_shard = link_checkpoint(folder, tmp_path / "no_shard", skip=(shard,))
    with pytest.raises(CheckpointError, match=f"shards named in model.safetensors.index.json are missing: {shard}"):
        rt.engine("higgsaudio", no_shard)
    from safetensors.torch import save_file

    extra = link_checkpoint(folder, tmp_path / "extra", skip=("model.safetensors.index.json",))
    save_file({"model.vision_tower.weight": torch.zeros(2), "text_lm_head.weight": torch.zeros(2)},
              str(extra / "model-extra.safetensors"))
    index = json.loads((folder / "model.safetensors.index.json").read_text(encoding="utf-8"))
    index["weight_map"].update({"model.vision_tower.weight": "model-extra.safetensors",
                                "text_lm_head.weight": "model-extra.safetensors"})
    (extra / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    with pytest.raises(CheckpointError, match="tensors Higgs Audio v2 does not have: model.vision_tower.weight$"):
        rt.engine("higgsaudio", extra)  # the optional text head is left out, another model's tensor refused
    wrong = link_checkpoint(folder, tmp_path / "wrong", skip=("audio_tokenizer/config.json",))
    (wrong / "audio_tokenizer" / "config.json").symlink_to(folder / "config.json")
    with pytest.raises(CheckpointError, match="model_type is 'higgs_audio_v2', expected 'higgs_audio_v2_tokenizer'"):
        rt.engine("higgsaudio", wrong)


def test_full_size_shapes_build_on_meta() -> None:
    """The published 3B config and audio tokenizer build on meta (no memory): 28 units of one
    dual-FFN layer each (0.34 GB in bfloat16), and the estimates at that size."""
    require_engine("higgsaudio")
    from transformers import HiggsAudioV2Config, HiggsAudioV2ForConditionalGeneration

    from mizuoto_runtime.engines.higgs_codec import TOKENIZER
    from mizuoto_runtime.engines.higgsaudio.published import GENERATION_3B
    from mizuoto_runtime.memory.handle import ModelHandle
    from mizuoto_runtime.nn.loading import build_on_meta

    config = HiggsAudioV2Config(**{k: v for k, v in GENERATION_3B.items() if k not in ("architectures", "model_type")})
    model = build_on_meta(lambda: HiggsAudioV2ForConditionalGeneration(config), torch.bfloat16)
    units = ModelHandle.units_of(model)
    assert len(units) == 28 and len({u.nbytes for u in units}) == 1
    layer = 2 * (3072 * 24 * 128 + 3072 * 8 * 128 * 1) + 2 * 3 * 3072 * 8192  # q, o; k, v; two gated MLPs
    assert units[0].nbytes == 2 * layer  # the four RMSNorms stay fixed (M13)
    assert model.audio_lm_head.weight.shape == (8 * 1026, 3072)
    # M46 at full size: each position of the talker's KV cache costs keys and values of 8 heads
    # of 128 in bfloat16 in every layer (and one layer's copy while it grows), plus its audio ids.
    from types import SimpleNamespace

    from mizuoto_runtime.engines.higgsaudio.engine import HiggsAudioEngine

    full: Any = SimpleNamespace(model=model, dtype=torch.bfloat16)
    per_position = HiggsAudioEngine.talker_memory(full, 0, 1001) - HiggsAudioEngine.talker_memory(full, 0, 1000)
    assert per_position == 2 * 8 * 128 * 2 * (28 + 1) + 8 * 8
    from transformers import HiggsAudioV2TokenizerConfig

    codec = HiggsAudioV2TokenizerConfig(**{k: v for k, v in TOKENIZER.items()
                                           if k not in ("architectures", "model_type")})
    assert (codec.hop_length, codec.frame_rate, codec.num_quantizers) == (960, 25, 8)


def test_describe_and_cli(higgsaudio_checkpoint: Checkpoint, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    """`mizuoto tiny-checkpoint` writes the published layout byte for byte as the fixture did,
    and `mizuoto say` speaks a cloned voice from it, streamed on a small device."""
    from mizuoto_runtime.engines import engine_class

    info = engine_class("higgsaudio").describe_checkpoint(higgsaudio_checkpoint())
    assert info is not None and info.label == "Higgs Audio v2" and info.languages == ["auto"]
    folder = tmp_path / "tiny-higgs"
    assert main(["tiny-checkpoint", "--engine", "higgsaudio", str(folder)]) == 0
    files = set(json.loads(capsys.readouterr().out)["files"])
    assert {"config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
            "tokenizer_config.json", "chat_template.jinja", "processor_config.json",
            "audio_tokenizer/config.json", "audio_tokenizer/model.safetensors"} <= files
    assert len([f for f in files if f.startswith("model-0000")]) >= 2
    for name in sorted(f for f in files if f.endswith((".safetensors", ".json", ".jinja"))):
        digest = [hashlib.sha256((root / name).read_bytes()).hexdigest() for root in (folder, higgsaudio_checkpoint())]
        assert digest[0] == digest[1], f"{name} is not byte-identical across runs"
    write_wav(tmp_path / "ref.wav", REFERENCE)
    out = tmp_path / "out.wav"
    code = main(["say", "--engine", "higgsaudio", "--model", str(folder), TEXT, "-o", str(out), "--voice",
                 str(tmp_path / "ref.wav"), "--ref-text", TRANSCRIPT, "--max-new-tokens", "24",
                 "--setting", "compute.simulate_vram_mb=10"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["sample_rate"] == 24000 and result["memory"]["streamed_mb"] > 0
    with wave.open(str(out)) as f:
        assert f.getframerate() == 24000 and f.getnframes() > 0


def test_a_script_of_two_characters_is_one_pass(higgsaudio_checkpoint: Checkpoint) -> None:
    """A script's lines between pauses go to `generate_dialogue` as one pass (characters in order
    of first appearance are SPEAKER0 and SPEAKER1): the same audio as calling the phases with
    those turns, and a third character in one pass is refused."""
    from mizuoto_runtime.app.scripts.runner import CharacterVoice
    from mizuoto_runtime.app.scripts.syntax import ScriptError, parse_script

    folder = higgsaudio_checkpoint()
    voices = {None: CharacterVoice(), "Alice": CharacterVoice(REFERENCE), "Bob": CharacterVoice(OTHER),
              "Carol": CharacterVoice(instruct="masculine")}
    sampling = Sampling(seed=SEED, max_new_tokens=NEW_TOKENS)
    rt = Runtime()
    script = parse_script("[Alice] I can't believe you did that!\n[Bob] Oh, come on.\n[Alice] Fine.",
                          ["Alice", "Bob", "Carol"])
    out = rt.speak_script(rt.engine("higgsaudio", folder), script, voices, sampling)
    assert len(out.lines) == 1
    plain = Runtime()
    engine = plain.engine("higgsaudio", folder)
    ctx = plain.request(seed=SEED)
    pair = [engine.voice_prompt(ctx, REFERENCE), engine.voice_prompt(ctx, OTHER)]
    direct = engine.decode(ctx, engine.generate_dialogue(ctx, LINES, pair, sampling)).waveform
    assert torch.equal(out.lines[0].waveform, direct)
    three = parse_script("[Alice] One.\n[Bob] Two.\n[Carol] Three.", ["Alice", "Bob", "Carol"])
    with pytest.raises(ScriptError, match="3 voices speak .*Higgs Audio v2 speaks at most 2 voices at once"):
        rt.speak_script(rt.engine("higgsaudio", folder), three, voices, sampling)
