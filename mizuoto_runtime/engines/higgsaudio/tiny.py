"""Tiny random Higgs Audio v2 checkpoints in the published layout, for tests and demos.

`write(dir)` writes the files of ``bosonai/higgs-audio-v2-generation-3B-base`` in transformers'
format, with the audio tokenizer in ``audio_tokenizer/`` (where the loader looks for it)::

    config.json  generation_config.json  model.safetensors.index.json  model-0000N-of-0000M.safetensors
    tokenizer.json  tokenizer_config.json  chat_template.jinja  processor_config.json
    preprocessor_config.json
    audio_tokenizer/{config.json, model.safetensors, preprocessor_config.json}

The models are transformers' own classes (`HiggsAudioV2ForConditionalGeneration`,
`HiggsAudioV2TokenizerModel`), written by their own ``save_pretrained`` (the LLM in shards, as
published), weights drawn from a seeded generator: byte-identical files on every run. The
processor files are `HiggsAudioV2Processor.save_pretrained`'s. Nothing is downloaded.

Geometry: the LLM keeps the dual FFN (a text and an audio MLP per layer) at 128 wide; each of its
4 layers is a 2.5 MB unit in float32 (1.3 MB in bfloat16), so half-way placements keep some and
stream others. The audio tokenizer keeps the real frame structure (24 kHz, hop 960 = 25 Hz,
8 codebooks; HuBERT at 16 kHz) with tiny widths and 256-entry codebooks, so the LLM's
codebooks are 258 wide (256 codes, the stream's BOS and EOS). The text tokenizer is byte-level
with the Llama-3 chat tokens and Higgs's audio tokens as added tokens; the chat template is
ours, rendering the published format (system, scene with per-speaker reference audio, turns).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from ...nn.dtypes import DTYPE_NAMES, parse_dtype
from ..tiny import byte_level_tokenizer, one_version, randomize, scale_output, write_json
from .checkpoint import AUDIO_TOKENIZER_FOLDER

log = logging.getLogger(__name__)

CODEBOOK = 256  # real: 1024
SPECIAL_TOKENS = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
    "<|audio_out_bos|>", "<|AUDIO_OUT|>", "<|audio_eos|>", "<|reserved_special_token_6|>",
    "<|scene_desc_start|>", "<|scene_desc_end|>",
)
LLM: dict[str, Any] = {  # real: published.GENERATION_3B (3072 wide, 28 layers)
    "vocab_size": 288, "hidden_size": 128, "intermediate_size": 768, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 2048,
    "num_codebooks": 8, "codebook_size": CODEBOOK + 2, "audio_stream_bos_id": CODEBOOK,
    "audio_stream_eos_id": CODEBOOK + 1,
}
ACOUSTIC: dict[str, Any] = {  # real: encoder 64, decoder 1024, hidden 256; same ratios
    "encoder_hidden_size": 8, "downsampling_ratios": [8, 5, 4, 2, 3], "decoder_hidden_size": 192,
    "upsampling_ratios": [8, 5, 4, 2, 3], "hidden_size": 32, "codebook_size": CODEBOOK, "codebook_dim": 8,
}
SEMANTIC: dict[str, Any] = {  # real: HuBERT base (768 wide, 12 layers); same conv strides (320x)
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
    "conv_dim": [16] * 7, "conv_stride": [5, 2, 2, 2, 2, 2, 2], "conv_kernel": [10, 3, 3, 3, 3, 2, 2],
    "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 4, "mask_time_prob": 0.0,
}
# 8 codebooks at 25 Hz of 8 bits: 1.6 kbps (real: 10 bits, 2 kbps).
TARGET_BANDWIDTHS = [0.5, 1.0, 1.6]
# The processor's feature extractor: the waveform as it is (not the audio tokenizer's, whose hop pads).
FEATURES: dict[str, Any] = {"feature_size": 1, "hop_length": 1, "padding_side": "right", "padding_value": 0.0,
                            "sampling_rate": 24000, "return_attention_mask": True}
SHARD_SIZE = "4MB"  # the LLM in a few shards with an index, as published

#: The published prompt format: the system text; a scene (its description, then for each speaker
#: "SPEAKERn:" and its reference audio); then the turns, an assistant turn being audio.
CHAT_TEMPLATE = r"""{{- bos_token }}
{%- set system = messages[0] %}
{%- if system['role'] != 'system' %}{{ raise_exception('A system message is required') }}{% endif %}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}
{%- if system['content'] is string %}{{ system['content'] | trim }}
{%- else %}{{ system['content'][0]['text'] | trim }}{% endif %}
{%- set rest = messages[1:] %}
{%- if rest and rest[0]['role'] == 'scene' %}
{{- '\n\n<|scene_desc_start|>\n' }}
{%- set items = rest[0]['content'] %}
{%- for item in items %}
{%- if item['type'] == 'text' %}{{ item['text'] | trim }}
{%- if loop.first and not loop.last %}{{ '\n\n' }}
{%- elif not loop.first and not loop.last and items[loop.index]['type'] != 'audio' %}{{ '\n' }}{% endif %}
{%- else %}{{ ' <|audio_out_bos|><|AUDIO_OUT|><|audio_eos|>' }}{% if not loop.last %}{{ '\n' }}{% endif %}
{%- endif %}
{%- endfor %}
{{- '\n<|scene_desc_end|>' }}
{%- set rest = rest[1:] %}
{%- endif %}
{{- '<|eot_id|>' }}
{%- for message in rest %}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}
{%- if message['role'] == 'assistant' %}{{ '<|audio_out_bos|><|AUDIO_OUT|><|audio_eos|>' }}
{%- elif message['content'] is string %}{{ message['content'] | trim }}
{%- else %}{% for item in message['content'] if item['type'] == 'text' %}{{ item['text'] | trim }}{% endfor %}
{%- endif %}
{{- '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n<|audio_out_bos|>' }}{% endif %}"""


def text_tokenizer() -> Any:
    """A byte-level BPE (no merges: one token per byte) with the chat and audio tokens."""
    return byte_level_tokenizer(SPECIAL_TOKENS, LLM["vocab_size"], bos_token="<|begin_of_text|>",
                                eos_token="<|eot_id|>", pad_token="<|eot_id|>")


def token_ids(tokenizer: Any) -> dict[str, int]:
    """The config's token ids (chat and audio tokens) as `tokenizer` has them."""
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    return {"audio_token_id": ids["<|AUDIO_OUT|>"], "audio_bos_token_id": ids["<|audio_out_bos|>"],
            "audio_delay_token_id": ids["<|reserved_special_token_6|>"], "bos_token_id": ids["<|begin_of_text|>"],
            "eos_token_id": ids["<|eot_id|>"], "pad_token_id": ids["<|end_of_text|>"]}


def _save_safetensors(model: torch.nn.Module, path: Path) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata={"format": "pt"})
    os.chmod(path, 0o644)


def codec_config() -> Any:
    """The tiny audio tokenizer's `HiggsAudioV2TokenizerConfig`."""
    from transformers import HiggsAudioV2TokenizerConfig

    config = HiggsAudioV2TokenizerConfig(acoustic_model_config=dict(ACOUSTIC), semantic_model_config=dict(SEMANTIC),
                                         codebook_size=CODEBOOK, codebook_dim=32, target_bandwidths=TARGET_BANDWIDTHS)
    config.architectures = ["HiggsAudioV2TokenizerModel"]
    return config


def _codec(out: Path, gen: torch.Generator, seed: int) -> Any:
    from transformers import DacFeatureExtractor, HiggsAudioV2TokenizerModel

    folder = out / AUDIO_TOKENIZER_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    config = codec_config()
    config.save_pretrained(str(folder))
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # upstream's own init draws from the global RNG; overwritten below
        codec = HiggsAudioV2TokenizerModel(config).eval()
    randomize(codec, gen)
    codes = torch.randint(0, CODEBOOK, (1, 8, 12), generator=gen)
    last = codec.acoustic_decoder.conv2  # random weights give std ~100: scaled to a waveform's 0.1
    scale_output(last, lambda: codec.decode(codes), (last.weight, last.bias))
    _save_safetensors(codec, folder / "model.safetensors")
    DacFeatureExtractor(sampling_rate=24000, hop_length=config.hop_length).save_pretrained(str(folder))
    return codec


def write(directory: str | Path, *, version: str | None = None, seed: int = 0,
          dtype: torch.dtype | None = None) -> Path:
    """Write a tiny random Higgs Audio v2 folder; `dtype` is that of the LLM's shards (None:
    float32; the audio tokenizer is float32, as published)."""
    one_version(version)
    dtype = parse_dtype(torch.float32 if dtype is None else dtype, "tiny checkpoint dtype")
    from transformers import (
        DacFeatureExtractor,
        GenerationConfig,
        HiggsAudioV2Config,
        HiggsAudioV2ForConditionalGeneration,
        HiggsAudioV2Processor,
    )

    from .published import GENERATION_CONFIG

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tokenizer = text_tokenizer()
    config = HiggsAudioV2Config(**LLM, **token_ids(tokenizer), dtype=DTYPE_NAMES[dtype])
    config.architectures = ["HiggsAudioV2ForConditionalGeneration"]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = HiggsAudioV2ForConditionalGeneration(config).eval()
    randomize(model, gen)
    model.generation_config = GenerationConfig(**{**GENERATION_CONFIG, "bos_token_id": config.bos_token_id,
                                                  "eos_token_id": config.eos_token_id,
                                                  "pad_token_id": config.pad_token_id})
    model.to(dtype).save_pretrained(str(out), max_shard_size=SHARD_SIZE)
    for shard in out.glob("model-*.safetensors"):
        os.chmod(shard, 0o644)  # as _save_safetensors: readable like the other files
    codec = _codec(out, gen, seed)
    features = DacFeatureExtractor(**FEATURES)
    processor = HiggsAudioV2Processor(features, tokenizer, codec, chat_template=CHAT_TEMPLATE,
                                      audio_stream_bos_id=config.audio_stream_bos_id,
                                      audio_stream_eos_id=config.audio_stream_eos_id)
    processor.save_pretrained(str(out))
    for name in ("processor_config.json", "preprocessor_config.json"):
        path = out / name
        if path.is_file():  # the audio tokenizer is named as published, never a local path
            data = json.loads(path.read_text(encoding="utf-8"))
            if "audio_tokenizer" in data:
                data["audio_tokenizer"]["audio_tokenizer_name_or_path"] = "bosonai/higgs-audio-v2-tokenizer"
                write_json(path, data)
    log.info("wrote tiny Higgs Audio v2 checkpoint to %s (%d LLM + %d audio tokenizer parameters)", out,
             sum(p.numel() for p in model.parameters()), sum(p.numel() for p in codec.parameters()))
    return out
