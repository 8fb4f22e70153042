"""The VibeVoice engine on tiny random checkpoints (issue 34: M1, M4, M27, M45, M46; equal to upstream;
dialogues of up to four voices), and the published 1.5B / 7B configurations built on meta.

Skipped where diffusers (requirements/vibevoice.txt) is not installed. The M57 placements, the
OOM rerun and CFG's shared copies are in `test_vibevoice_streaming.py`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import wave
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mizuoto_runtime import CheckpointError, MizuotoError, Runtime
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.audio import Audio, write_wav
from mizuoto_runtime.engines import Sampling, engine_class
from mizuoto_runtime.engines.base import Turn

from conftest import link_checkpoint, require_engine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

Checkpoint = Callable[..., Path]
_noise = torch.Generator().manual_seed(1)
# References at 24 kHz (the processor's rate), of lengths that are not a multiple of the hop.
REFERENCES = (Audio(0.1 * torch.randn(1, 24500, generator=_noise), 24000),
              Audio(0.1 * torch.randn(1, 12000, generator=_noise), 24000))
TURNS = (Turn(0, "Hello there, how are you?"), Turn(1, "Fine, thanks."), Turn(0, "Good to hear."))
STEPS = 3
FRAMES = 6
SEED = 3


def engine_on(rt: Runtime, folder: Path, dtype: str = "float32") -> Any:
    engine = rt.engine("vibevoice", folder, dtype)
    engine.steps = STEPS
    return engine


def ours(rt: Runtime, folder: Path, turns: Sequence[Turn], references: Sequence[Audio | None]) -> torch.Tensor:
    """Our phases: a voice prompt per reference, one talker pass, decode."""
    engine = engine_on(rt, folder)
    ctx = rt.request()
    voices = [engine.voice_prompt(ctx, ref) for ref in references]
    codes = engine.generate_dialogue(ctx, list(turns), voices, Sampling(seed=SEED, max_new_tokens=FRAMES))
    return engine.decode(ctx, codes).waveform


def conversation(turns: Sequence[Turn], references: Sequence[Audio | None]) -> list[dict[str, Any]]:
    """The model card's conversation: role N is Speaker N, a voice's audio with its first turn."""
    messages, seen = [], set()
    for turn in turns:
        content: list[dict[str, Any]] = []
        ref = references[turn.voice]
        if turn.voice not in seen and ref is not None:
            content.append({"type": "audio", "audio": ref.mono().numpy()})
        seen.add(turn.voice)
        messages.append({"role": str(turn.voice), "content": [*content, {"type": "text", "text": turn.text}]})
    return messages


def upstream(folder: Path, turns: Sequence[Turn], references: Sequence[Audio | None],
             model: Any = None) -> torch.Tensor:
    """transformers' own pipeline: the processor's chat template, then `generate` (seeded)."""
    from transformers import VibeVoiceProcessor

    processor = VibeVoiceProcessor.from_pretrained(str(folder))
    model = model or upstream_model(folder)
    inputs = processor.apply_chat_template(conversation(turns, references), tokenize=True, return_dict=True,
                                           add_generation_prompt=True, return_tensors="pt",
                                           processor_kwargs={"sampling_rate": 24000})
    torch.manual_seed(SEED)
    with torch.inference_mode():
        audio = model.generate(**inputs, max_new_tokens=FRAMES, num_diffusion_steps=STEPS)
    return audio[0].reshape(1, -1).float()


def upstream_model(folder: Path) -> Any:
    """transformers' own load, each weight then copied to fresh memory, as ours are: its loader
    leaves weights at their offsets in the memory-mapped file, and oneDNN's convolutions round
    by the weights' address alignment (measured on the acoustic decoder: ~3e-7)."""
    from transformers import VibeVoiceForConditionalGeneration

    model = VibeVoiceForConditionalGeneration.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.clone()
    return model


@contextlib.contextmanager
def encoding_each_reference_alone(model: Any) -> Iterator[None]:
    """Upstream encodes a dialogue's references as one padded batch; our voice prompt encodes
    each once (M4), alone, padded to its own hop multiple, and convolutions over another batch
    or length round differently (~1e-6). This makes upstream's `encode` do the same, keeping
    everything else, its noise included (drawn over the padded batch as before)."""
    tower = model.model.audio_tower
    original = tower.encode

    def encode(values: torch.Tensor, *args: Any, sample: bool = True, **kwargs: Any) -> Any:
        out = original(values, sample=False)
        nonzero = (values[:, 0] != 0).int()
        for row in range(values.shape[0]):
            valid = int(nonzero[row].nonzero().max()) + 1 if nonzero[row].any() else 0
            frames = -(-valid // tower.config.hop_length)
            alone = values[row:row + 1, :, :frames * tower.config.hop_length]
            out.latents[row, :frames] = original(alone, sample=False).latents[0]
        if sample:
            std = tower.config.vae_std * torch.randn(out.latents.shape[0], dtype=out.latents.dtype)
            out.latents = out.latents + std[:, None, None] * torch.randn_like(out.latents)
        return out

    tower.encode = encode
    try:
        yield
    finally:
        tower.encode = original


def test_one_voice_equals_upstream_generate(vibevoice_checkpoint: Checkpoint) -> None:
    """Our phases over our own load (meta + mmap shards) equal transformers' processor and
    `generate`, sample for sample: one voice cloned from a reference."""
    folder = vibevoice_checkpoint()
    turns, references = [Turn(0, "Hello from the tiny diffusion.")], [REFERENCES[0]]
    got = ours(Runtime(), folder, turns, references)
    assert got.shape[-1] == FRAMES * 3200 and got.abs().max() > 0
    assert torch.equal(got, upstream(folder, turns, references))


def test_no_reference_equals_upstream_generate(vibevoice_checkpoint: Checkpoint) -> None:
    """A voice without a reference: no voice line in the prompt, as upstream renders it."""
    folder = vibevoice_checkpoint("float32", "7b")
    turns = [Turn(0, "No reference here.")]
    assert torch.equal(ours(Runtime(), folder, turns, [None]), upstream(folder, turns, [None]))


def test_dialogue_equals_upstream_generate(vibevoice_checkpoint: Checkpoint) -> None:
    """Two voices in one pass (Speaker 0, 1, 0 again): equal to upstream's generate sample for
    sample where upstream also encodes each reference alone (`encoding_each_reference_alone`),
    and within float rounding of its batched encoding."""
    folder = vibevoice_checkpoint()
    got = ours(Runtime(), folder, TURNS, REFERENCES)
    model = upstream_model(folder)
    batched = upstream(folder, TURNS, REFERENCES, model)
    with encoding_each_reference_alone(model):
        alone = upstream(folder, TURNS, REFERENCES, model)
    assert torch.equal(got, alone)
    assert not torch.equal(alone, batched)  # the rounding named above is real ...
    assert (got - batched).abs().max() < 1e-4 * batched.abs().max()  # ... and only rounding


def test_dialogue_prompt_is_the_processors(vibevoice_checkpoint: Checkpoint) -> None:
    """The prompt: one voice line per speaker with a reference, in order of first appearance,
    each speaker's lines as `Speaker N:`, token ids equal to the processor's with the audio."""
    from transformers import VibeVoiceProcessor

    folder = vibevoice_checkpoint()
    rt = Runtime()
    engine = engine_on(rt, folder)
    ctx = rt.request()
    voices = [engine.voice_prompt(ctx, ref) for ref in REFERENCES]
    messages, latents = engine.conversation(TURNS, voices)
    assert [x.shape[0] for x in latents] == [8, 4]  # ceil(24500 / 3200), ceil(12000 / 3200)
    ids = engine.prompt_ids(messages, latents)
    processor = VibeVoiceProcessor.from_pretrained(str(folder))
    expected = processor.apply_chat_template(conversation(TURNS, REFERENCES), tokenize=True, return_dict=True,
                                             add_generation_prompt=True, return_tensors="pt",
                                             processor_kwargs={"sampling_rate": 24000})["input_ids"]
    assert torch.equal(ids, expected)
    text = processor.tokenizer.decode(ids[0])
    assert text.index(" Speaker 0:<|vision_start|>") < text.index(" Speaker 1:<|vision_start|>")
    assert " Speaker 0: Hello there, how are you?\n Speaker 1: Fine, thanks.\n Speaker 0: Good to hear.\n" in text
    unvoiced = engine.voice_prompt(ctx)  # no reference: that speaker has no voice line
    messages, latents = engine.conversation(TURNS, [voices[0], unvoiced])
    text = processor.tokenizer.decode(engine.prompt_ids(messages, latents)[0])
    assert len(latents) == 1 and " Speaker 1:<|vision_start|>" not in text and " Speaker 1: Fine" in text


def test_dialogue_takes_up_to_four_voices(vibevoice_checkpoint: Checkpoint) -> None:
    rt = Runtime()
    engine = engine_on(rt, vibevoice_checkpoint())
    assert engine.VOICES_PER_PASS == 4
    ctx = rt.request()
    voice = engine.voice_prompt(ctx, REFERENCES[1])
    four = engine.generate_dialogue(ctx, [Turn(i, f"Line {i}.") for i in range(4)], [voice] * 4,
                                    Sampling(seed=1, max_new_tokens=2))
    assert four.tokens.shape[-1] == 2 * 3200
    with pytest.raises(MizuotoError, match="4"):
        engine.generate_dialogue(ctx, [Turn(i, f"Line {i}.") for i in range(5)], [voice] * 5, Sampling(seed=1))


def test_a_cached_voice_is_not_encoded_again(vibevoice_checkpoint: Checkpoint) -> None:
    """M4: the same reference again places no acoustic encoder; M1: the talker phase places the
    talker, the acoustic decoder and the semantic encoder, never the encoder."""
    rt = Runtime({"compute.simulate_vram_mb": 256})
    folder = vibevoice_checkpoint()
    engine = engine_on(rt, folder)
    first, _ = rt.say(engine, "Hello.", sampling=Sampling(seed=1, max_new_tokens=3), reference=REFERENCES[0])
    rt.manager.events.clear()
    again, meta = rt.say(engine, "Hello.", sampling=Sampling(seed=1, max_new_tokens=3), reference=REFERENCES[0])
    placed = {name for action, name, _ in rt.manager.events if action == "place"}
    assert "vibevoice:acoustic_encoder" not in placed
    assert {"vibevoice:talker", "vibevoice:acoustic_decoder", "vibevoice:semantic_encoder"} <= placed
    assert torch.equal(first.waveform, again.waveform)


def test_bf16_load_converts_in_place(vibevoice_checkpoint: Checkpoint) -> None:
    """M27: the model loads straight into bfloat16 and equals float32-then-convert; a bfloat16
    checkpoint loads bit for bit; the engine speaks."""
    rt = Runtime()
    half = engine_on(rt, vibevoice_checkpoint(), "bfloat16")
    full = engine_on(rt, vibevoice_checkpoint(), "float32")
    theirs = full.model.state_dict()
    for key, value in half.model.state_dict().items():
        if value.is_floating_point():
            assert value.dtype == torch.bfloat16, key
            assert torch.equal(value, theirs[key].to(torch.bfloat16)), key
    saved = engine_on(rt, vibevoice_checkpoint("bfloat16"), "bfloat16")
    assert all(torch.equal(v, saved.model.state_dict()[k]) for k, v in half.model.state_dict().items())
    audio, _ = rt.say(half, "Hello.", sampling=Sampling(seed=1, max_new_tokens=2), reference=REFERENCES[1])
    assert audio.waveform.dtype == torch.float32 and audio.waveform.abs().max() > 0


def test_loading_and_voice_errors_name_what_is_wrong(vibevoice_checkpoint: Checkpoint, tmp_path: Path) -> None:
    folder = vibevoice_checkpoint()
    rt = Runtime()
    with pytest.raises(CheckpointError, match="folder not found"):
        rt.engine("vibevoice", tmp_path / "nowhere")
    shard = "model-00002-of-00002.safetensors"
    partial = link_checkpoint(folder, tmp_path / "partial", skip=(shard,))
    with pytest.raises(CheckpointError, match=f"shards named in model.safetensors.index.json are missing: {shard}"):
        rt.engine("vibevoice", partial)
    (partial / shard).symlink_to(folder / "model-00001-of-00002.safetensors")
    with pytest.raises(CheckpointError, match="missing model.diffusion_head"):
        rt.engine("vibevoice", partial)
    other = link_checkpoint(folder, tmp_path / "other", skip=("config.json",))
    (other / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(CheckpointError, match="model_type is 'qwen2', expected 'vibevoice'"):
        rt.engine("vibevoice", other)
    assert engine_class("vibevoice").describe_checkpoint(other) is None
    engine = engine_on(rt, folder)
    with pytest.raises(MizuotoError, match="no built-in speakers"):
        engine.voice_prompt(rt.request(), speaker="alice")


def test_describe_checkpoint_names_the_published_sizes(vibevoice_checkpoint: Checkpoint, tmp_path: Path) -> None:
    from mizuoto_runtime.engines.vibevoice.published import PUBLISHED

    cls = engine_class("vibevoice")
    folder = vibevoice_checkpoint()
    assert cls.describe_checkpoint(folder).label == "VibeVoice"  # the tiny geometry is neither size
    for name, config in PUBLISHED.items():
        layout = link_checkpoint(folder, tmp_path / name, skip=("config.json",))
        (layout / "config.json").write_text(json.dumps(config))
        assert cls.describe_checkpoint(layout).label == name


@pytest.mark.parametrize(("name", "parameters", "lm_layers", "head_layers"),
                         [("VibeVoice-1.5B", 2_704_021_987, 28, 4), ("VibeVoice-7B", 9_343_355_363, 28, 4)])
def test_published_configs_build_on_meta(name: str, parameters: int, lm_layers: int, head_layers: int) -> None:
    """The published shapes, on meta (no memory): their parameter counts (1.5B: 5.4 GB in
    bfloat16, as published; 7B: 18.7 GB) and the talker's units, one per LM decoder layer and
    one per diffusion-head layer; the tokenizers' units are their blocks (`block_units`)."""
    require_engine("vibevoice")
    from transformers import VibeVoiceForConditionalGeneration

    from mizuoto_runtime.engines.vibevoice.engine import name_block_units, talker_modules
    from mizuoto_runtime.engines.vibevoice.published import published_config
    from mizuoto_runtime.memory.units import plan_units
    from mizuoto_runtime.nn.loading import build_on_meta

    config = published_config(name)
    model = build_on_meta(lambda: VibeVoiceForConditionalGeneration(config), torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == parameters
    talker = plan_units(talker_modules(model))
    inner = model.model
    layers = [*inner.language_model.layers, *inner.diffusion_head.layers]
    assert len(talker.units) == lm_layers + head_layers == len(layers)
    assert {id(u.module) for u in talker.units} == {id(m) for m in layers}
    for module in (inner.audio_tower.encoder, inner.audio_tower.decoder, inner.semantic_tokenizer_encoder):
        name_block_units(module)
        plan = plan_units(module)
        blocks = sum(1 for m in module.modules() if type(m).__name__.endswith("ConvNext1dLayer"))
        assert len(plan.units) >= blocks == 26  # every ConvNeXt block (3 x 6 stages + 8), the convs
        assert max(u.nbytes for u in plan.units) <= 68 << 20  # the last stage's block (2048 wide)


def test_estimates_follow_the_request(vibevoice_checkpoint: Checkpoint) -> None:
    """M45/M46: the talker's from the prompt and the frames the text makes (4 per token, capped
    by max_new_tokens), the encoder's from the reference; never a worst case."""
    engine = engine_on(Runtime(), vibevoice_checkpoint())
    assert engine.talker_memory(200, 50) < engine.talker_memory(200, 400) < engine.talker_memory(400, 400)
    assert engine.frames_for(10, Sampling(max_new_tokens=2048)) == 40
    assert engine.frames_for(10, Sampling(max_new_tokens=16)) == 16
    one_second = engine.voice_prompt_memory(24000)
    assert one_second < engine.voice_prompt_memory(48000) < 2.1 * one_second


def test_cli_say_and_tiny_checkpoint(vibevoice_checkpoint: Checkpoint, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "tiny-vibevoice"
    assert main(["tiny-checkpoint", "--engine", "vibevoice", str(folder)]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert {"config.json", "generation_config.json", "model.safetensors.index.json",
            "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "processor_config.json",
            "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= set(files)
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json"):
        digest = [hashlib.sha256((root / name).read_bytes()).hexdigest() for root in (folder, vibevoice_checkpoint())]
        assert digest[0] == digest[1], f"{name} is not byte-identical across runs"
    write_wav(tmp_path / "ref.wav", REFERENCES[0])
    out = tmp_path / "out.wav"
    code = main(["say", "--engine", "vibevoice", "--model", str(folder), "Hello from the command line.", "-o",
                 str(out), "--voice", str(tmp_path / "ref.wav"), "--max-new-tokens", "4",
                 "--setting", "compute.simulate_vram_mb=40"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["sample_rate"] == 24000 and result["memory"]["streamed_mb"] > 0
    with wave.open(str(out)) as f:
        assert f.getframerate() == 24000 and f.getnframes() == 4 * 3200
        assert np.abs(np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")).max() > 10


def test_a_published_configs_processor_files_use_its_token_ids(tmp_path: Path) -> None:
    """`tiny.write_processor` for a published config (a full-size folder of random weights): the
    processor it writes finds the special tokens at the config's ids."""
    require_engine("vibevoice")
    from transformers import VibeVoiceProcessor

    from mizuoto_runtime.engines.vibevoice.published import published_config
    from mizuoto_runtime.engines.vibevoice.tiny import write_processor

    config = published_config("VibeVoice-7B")
    write_processor(tmp_path, config)
    processor = VibeVoiceProcessor.from_pretrained(str(tmp_path))
    assert (processor.audio_bos_token_id, processor.audio_eos_token_id, processor.audio_token_id,
            processor.tokenizer.eos_token_id) == (151652, 151653, 151654, 151643)
    ids = processor.tokenizer("a<|vision_pad|>", add_special_tokens=False)["input_ids"]
    assert ids == [processor.tokenizer.convert_tokens_to_ids("a"), config.audio_token_id]


def test_a_script_is_one_dialogue_pass(vibevoice_checkpoint: Checkpoint) -> None:
    """The script runner (issue 34 item 3) gives VibeVoice each run of lines between pauses as one
    `generate_dialogue`: a two-character script is one pass, equal to calling the phases with its
    turns; five characters in one pass are refused before any work, naming the limit."""
    from mizuoto_runtime.app.scripts.runner import CharacterVoice, speak_script
    from mizuoto_runtime.app.scripts.syntax import parse_script

    folder = vibevoice_checkpoint()
    names = ["Alice", "Bob", "Carol", "Dave", "Eve"]
    voices = {None: CharacterVoice(REFERENCES[0], None)}
    voices.update({name: CharacterVoice(REFERENCES[i % 2], None) for i, name in enumerate(names)})
    rt = Runtime()
    engine = engine_on(rt, folder)
    script = parse_script("[Alice] Hello there, how are you?\n[Bob] Fine, thanks.\n[Alice] Good to hear.", names)
    out = speak_script(rt, engine, script, voices, Sampling(seed=SEED, max_new_tokens=FRAMES))
    assert len(out.lines) == 1
    assert torch.equal(out.lines[0].waveform, ours(Runtime(), folder, TURNS, REFERENCES))
    crowd = parse_script("\n".join(f"[{name}] Line." for name in names), names)
    with pytest.raises(MizuotoError, match="4"):
        speak_script(rt, engine, crowd, voices, Sampling(seed=SEED, max_new_tokens=FRAMES))


def test_a_config_with_the_head_settings_at_its_top_level_loads(vibevoice_checkpoint: Checkpoint,
                                                                 tmp_path: Path) -> None:
    """A converted config.json that keeps the diffusion head's settings at its top level (no
    diffusion_head_config) gives the same head: checked with a head of another width than
    transformers' default, as the 7B's is."""
    from mizuoto_runtime.engines.vibevoice.checkpoint import model_config

    folder = vibevoice_checkpoint()
    data = json.loads((folder / "config.json").read_text())
    head = data.pop("diffusion_head_config")
    data.update(num_head_layers=head["num_hidden_layers"], intermediate_size=head["intermediate_size"],
                rms_norm_eps=head["rms_norm_eps"], hidden_act=head["hidden_act"])
    flat = link_checkpoint(folder, tmp_path / "flat", skip=("config.json",))
    (flat / "config.json").write_text(json.dumps(data))
    assert head["intermediate_size"] != 4608  # transformers' default, which it would otherwise use
    assert model_config(flat).diffusion_head_config.to_dict() == model_config(folder).diffusion_head_config.to_dict()
    engine = engine_on(Runtime(), flat)
    assert engine.model.model.diffusion_head.layers[0].ffn.gate_proj.out_features == head["intermediate_size"]
