"""Tiny random VibeVoice checkpoints in the transformers layout (``vibevoice/VibeVoice-*-hf``), for
tests and demos (issue 34).

`write(dir, version=...)` writes the files of the published ``-hf`` folders::

    config.json  generation_config.json  model-0000N-of-00002.safetensors
    model.safetensors.index.json  preprocessor_config.json  processor_config.json
    tokenizer.json  tokenizer_config.json  chat_template.jinja

The model is transformers' own `VibeVoiceForConditionalGeneration` (Qwen2 LM, diffusion head,
acoustic tokenizer, semantic tokenizer encoder, connectors) built from tiny sub-configs; its
config, generation config and processor files are written by their own ``save_pretrained``,
the weights drawn from a seeded generator: the files are byte-identical on every run.

Versions: ``1.5b`` ties the LM head to the embedding, as VibeVoice-1.5B does; ``7b`` has its own
head, as VibeVoice-7B does. Geometry: the acoustic and semantic tokenizers keep the real frame
structure (24 kHz, hop 3200 = 7.5 Hz, latents of 64 and 128) with tiny widths; every LM layer
(4, about 4 MB in float32), every diffusion-head layer (2, about 3 MB) and the tokenizers'
widest ConvNeXt blocks are units of at least 1 MB, so the M57 tests really stream.

The text tokenizer is byte-level (one token per byte) with Qwen2's four special tokens the
processor uses: ``<|endoftext|>`` (eos and pad), ``<|vision_start|>`` / ``<|vision_end|>``
(audio begin / end) and ``<|vision_pad|>`` (one acoustic latent); `write_processor` writes these
files for a published config too, its special tokens at the published ids (a full-size folder
of random weights). The chat template renders
VibeVoice's prompt (system line, one ``Speaker N:`` voice line per speaker with audio, the
script's ``Speaker N:`` lines, ``Speech output:`` and the audio begin token).

The LM favours the audio token: the last layer's value bias writes a constant direction into
the residual stream, and the audio token's head row points along it, so a request speaks for
its whole ``max_new_tokens`` instead of stopping at once on random weights.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...memory.intra_op import intra_op_threads
from ...nn.dtypes import DTYPE_NAMES, parse_dtype
from ..tiny import byte_alphabet, fan_in_std, version_of, write_json
from .checkpoint import SHARD_PATTERN, import_upstream

log = logging.getLogger(__name__)

VERSIONS = ("1.5b", "7b")
SPECIAL_TOKENS = ("<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>")
VOCAB_SIZE = 288  # embedding rows >= tokenizer size (256 bytes + 4 special), like 151936 vs ~151665
SYSTEM_PROMPT = (" Transform the text provided by various speakers into speech output, utilizing the distinct "
                 "voice of each respective speaker.\n")
CHAT_TEMPLATE = (
    "{{- '" + SYSTEM_PROMPT.replace("\n", "\\n") + "' -}}"
    "{%- set ns = namespace(voices=false, seen=[]) -%}"
    "{%- for message in messages -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'audio' and message['role'] not in ns.seen -%}"
    "{%- if not ns.voices -%}{{- ' Voice input:\\n' -}}{%- set ns.voices = true -%}{%- endif -%}"
    "{{- ' Speaker ' ~ message['role'] ~ ':<|vision_start|><|vision_pad|><|vision_end|>\\n' -}}"
    "{%- set ns.seen = ns.seen + [message['role']] -%}"
    "{%- endif -%}{%- endfor -%}{%- endfor -%}"
    "{{- ' Text input:\\n' -}}"
    "{%- for message in messages -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{- ' Speaker ' ~ message['role'] ~ ': ' ~ item['text'] | trim ~ '\\n' -}}"
    "{%- endif -%}{%- endfor -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- ' Speech output:\\n<|vision_start|>' -}}{%- endif -%}"
)
LM: dict[str, Any] = {  # real 1.5B: 1536 wide, 28 layers, 12/2 heads; 7B: 3584 wide, 28 layers, 28/4 heads
    "vocab_size": VOCAB_SIZE, "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
}
# Real: 32 filters, depths [3, 3, 3, 3, 3, 3, 8]; the same six strides (hop 3200).
TOKENIZER: dict[str, Any] = {"num_filters": 4, "depths": [1, 1, 1, 1, 1, 1, 2],
                             "downsampling_ratios": [2, 2, 4, 5, 5, 8]}
HEAD: dict[str, Any] = {"num_hidden_layers": 2, "intermediate_size": 768}  # real: 4 layers, 3x hidden
# transformers' defaults, which the published generation configs keep: DPM-Solver++ over a
# cosine schedule with v-prediction, 10 steps, guidance 1.3.
GENERATION: dict[str, Any] = {
    "noise_scheduler_class": "DPMSolverMultistepScheduler",
    "noise_scheduler_config": {"beta_schedule": "squaredcos_cap_v2", "prediction_type": "v_prediction"},
    "num_diffusion_steps": 10, "guidance_scale": 1.3, "max_new_tokens": 2048,
}
AUDIO_TOKEN_BIAS = 64.0  # the value bias' norm: the audio token wins the argmax by a wide margin


def special_ids(config: Any) -> dict[str, int]:
    """The ids `config` gives the processor's special tokens (`SPECIAL_TOKENS`' order)."""
    return dict(zip(SPECIAL_TOKENS, (config.eos_token_id, config.audio_bos_token_id, config.audio_eos_token_id,
                                     config.audio_token_id)))


def text_tokenizer(ids: dict[str, int]) -> Any:
    """A byte-level BPE (no merges: bytes are ids 0-255) with the processor's four special tokens
    at `ids` (the tiny model's 256-259, or a published config's 151643... for a full-size one)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: i for i, symbol in enumerate(sorted(byte_alphabet().values()))}
    vocab.update(ids)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=SPECIAL_TOKENS[0], pad_token=SPECIAL_TOKENS[0])
    fast.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    return fast


def model_config(version: str, dtype: torch.dtype) -> Any:
    """The tiny `VibeVoiceConfig`: special ids right after the 256 bytes."""
    from transformers import VibeVoiceConfig

    ids = [len(byte_alphabet()) + i for i in range(len(SPECIAL_TOKENS))]
    acoustic = {"model_type": "vibevoice_acoustic_tokenizer", "hidden_size": 64, **TOKENIZER}
    semantic = {"model_type": "vibevoice_acoustic_tokenizer_encoder", "hidden_size": 128, **TOKENIZER}
    config = VibeVoiceConfig(
        text_config={"model_type": "qwen2", **LM, "tie_word_embeddings": version == "1.5b"},
        audio_config=acoustic, semantic_model_config=semantic, diffusion_head_config=dict(HEAD),
        pad_token_id=ids[0], eos_token_id=ids[0], audio_bos_token_id=ids[1], audio_eos_token_id=ids[2],
        audio_token_id=ids[3], dtype=DTYPE_NAMES[dtype])
    config.architectures = ["VibeVoiceForConditionalGeneration"]
    return config


def write_processor(directory: Path, config: Any) -> None:
    """What a ``-hf`` folder has besides config.json and the weights, for `config` (the tiny one or
    a published one): generation_config.json, the processor (the feature extractor's settings,
    the byte-level tokenizer with `config`'s special ids, the chat template)."""
    from transformers import GenerationConfig, VibeVoiceAcousticTokenizerFeatureExtractor, VibeVoiceProcessor

    tokenizer = text_tokenizer(special_ids(config))
    if max(special_ids(config).values()) >= config.text_config.vocab_size:
        raise ValueError("the special tokens' ids do not fit the LM's embedding")
    GenerationConfig(**GENERATION, pad_token_id=config.pad_token_id,
                     eos_token_id=config.eos_token_id).save_pretrained(str(directory))
    features = VibeVoiceAcousticTokenizerFeatureExtractor()
    VibeVoiceProcessor(features, tokenizer, chat_template=CHAT_TEMPLATE).save_pretrained(str(directory))


@torch.no_grad()
def randomize(model: nn.Module, gen: torch.Generator) -> None:
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or name.endswith(".act.weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif name.endswith(("gamma", ".bias")):  # ConvNeXt layer scales, biases
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        elif "embed_tokens" in name:  # small, as trained embeddings are: a tied head then
            p.copy_(0.05 * torch.randn(p.shape, generator=gen))  # does not just repeat its input
        elif name.endswith("latent_scaling_factor"):
            p.fill_(0.2)
        elif name.endswith("latent_bias_factor"):
            p.fill_(-0.05)
        else:
            p.copy_(fan_in_std(p) * torch.randn(p.shape, generator=gen))


@torch.no_grad()
def favour_audio_token(model: nn.Module, gen: torch.Generator) -> None:
    """Make the audio token the LM's argmax (module docstring): a constant direction in the last
    layer's output, the audio token's head row along it after the final norm."""
    config = model.config
    last = model.model.language_model.layers[-1].self_attn
    bias = torch.randn(last.v_proj.bias.shape, generator=gen)
    last.v_proj.bias.copy_(AUDIO_TOKEN_BIAS * bias / bias.norm())
    groups = config.text_config.num_attention_heads // config.text_config.num_key_value_heads
    head_dim = last.head_dim
    per_head = last.v_proj.bias.view(-1, head_dim).repeat_interleave(groups, dim=0).flatten()
    direction = last.o_proj.weight @ per_head * model.model.language_model.norm.weight
    model.lm_head.weight[config.audio_token_id] = 4.0 * direction / direction.norm()


def _shards(state: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Two shards, as published folders have several: the LM first, the rest second."""
    first = {k: v for k, v in state.items() if k.startswith("model.language_model.")}
    return [first, {k: v for k, v in state.items() if k not in first}]


def _save(model: nn.Module, folder: Path, dtype: torch.dtype) -> None:
    from safetensors.torch import save_file

    state: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        if id(tensor) in seen or (name == "lm_head.weight" and model.config.tie_word_embeddings):
            continue  # a tied head is stored once, as the embedding (as save_pretrained does)
        seen.add(id(tensor))
        state[name] = (tensor.to(dtype) if tensor.is_floating_point() else tensor).detach().contiguous().clone()
    shards = _shards(state)
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        file = SHARD_PATTERN.format(i, len(shards))
        save_file(dict(sorted(shard.items())), str(folder / file), metadata={"format": "pt"})
        os.chmod(folder / file, 0o644)
        weight_map.update({k: file for k in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    write_json(folder / "model.safetensors.index.json",
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})


@torch.no_grad()
def _calibrate_decoder(model: nn.Module, gen: torch.Generator) -> None:
    """Scale the acoustic decoder's last conv so random latents give a waveform of std ~0.1."""
    decoder = model.model.audio_tower.decoder
    latents = torch.randn(1, 64, 6, generator=gen)
    with intra_op_threads(1):  # the bytes follow the seed alone, not the caller's thread count
        scale = 0.1 / float(decoder(latents).audio.std())
    decoder.head.conv.weight.mul_(scale)
    decoder.head.conv.bias.mul_(scale)


def write(directory: str | Path, *, version: str | None = None, seed: int = 0,
          dtype: torch.dtype | None = None) -> Path:
    """Write a tiny random VibeVoice ``-hf`` folder; `dtype`: its weights' (None: float32)."""
    version = version_of(version, VERSIONS)
    dtype = parse_dtype(torch.float32 if dtype is None else dtype, "tiny checkpoint dtype")
    import_upstream()
    from transformers import VibeVoiceForConditionalGeneration

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    config = model_config(version, dtype)
    config.save_pretrained(str(out))
    write_processor(out, config)
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # upstream's own init draws from the global RNG; overwritten below
        model = VibeVoiceForConditionalGeneration(config).eval()
    randomize(model, gen)
    favour_audio_token(model, gen)
    _calibrate_decoder(model, gen)
    _save(model, out, dtype)
    log.info("wrote tiny VibeVoice %s checkpoint to %s (%d parameters)", version, out,
             sum(p.numel() for p in model.parameters()))
    return out
