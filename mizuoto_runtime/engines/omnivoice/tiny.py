"""Tiny random OmniVoice checkpoints in the published layout, for tests and demos (issue 11).

`write(dir)` writes the files of ``k2-fsa/OmniVoice``::

    config.json  model.safetensors  tokenizer.json  tokenizer_config.json
    audio_tokenizer/{config.json, model.safetensors, preprocessor_config.json}

The models are the packages' own classes (`omnivoice.OmniVoice` over a Qwen3 LLM; transformers'
`HiggsAudioV2TokenizerModel` with its DAC and HuBERT parts), configs written by their own
``save_pretrained``, weights drawn from a seeded generator: byte-identical files on every run.
Geometry: the codec keeps the real frame structure (24 kHz, hop 960 = 25 Hz, 8 codebooks;
HuBERT at 16 kHz, 50 Hz halved to 25) with tiny widths and 256-entry codebooks; every LLM layer
(4) is a 3.75 MB unit in float32 (so half-way placements keep some and stream others), the DAC
encoder's last block (3 MB) and decoder's first (3.7 MB) too: the M57 tests really stream. The
text tokenizer is byte-level with OmniVoice's control tokens as added tokens.
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
from ..tiny import byte_level_tokenizer, one_version, randomize
from .checkpoint import import_upstream

log = logging.getLogger(__name__)

CODEBOOK = 256  # real: 1024
ACOUSTIC: dict[str, Any] = {  # real: encoder 64, decoder 1024, hidden 256, ratios [8, 5, 4, 2, 3]
    "encoder_hidden_size": 16, "downsampling_ratios": [8, 5, 4, 2, 3], "decoder_hidden_size": 256,
    "upsampling_ratios": [8, 5, 4, 2, 3], "hidden_size": 64, "codebook_size": CODEBOOK, "codebook_dim": 8,
    "n_codebooks": 4,
}
SEMANTIC: dict[str, Any] = {  # real: HuBERT base (768 wide, 12 layers); same conv strides (320x)
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128,
    "conv_dim": [32] * 7, "conv_stride": [5, 2, 2, 2, 2, 2, 2], "conv_kernel": [10, 3, 3, 3, 3, 2, 2],
    "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 4, "mask_time_prob": 0.0,
}
LLM: dict[str, Any] = {  # real: Qwen3 0.6B (1024 wide, 28 layers)
    "vocab_size": 384, "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 4096,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}
# 8 codebooks at 25 Hz of 8 bits: 1.6 kbps (real: 10 bits, 2 kbps).
TARGET_BANDWIDTHS = [0.5, 1.0, 1.6]
CONTROL_TOKENS = ("<|denoise|>", "<|lang_start|>", "<|lang_end|>", "<|instruct_start|>", "<|instruct_end|>",
                  "<|text_start|>", "<|text_end|>", "<|endoftext|>")


def text_tokenizer() -> Any:
    """A byte-level BPE (no merges: one token per byte) with OmniVoice's control tokens."""
    return byte_level_tokenizer(CONTROL_TOKENS, LLM["vocab_size"], eos_token="<|endoftext|>",
                                pad_token="<|endoftext|>")


@torch.no_grad()
def _calibrate_output(codec: nn.Module, gen: torch.Generator) -> None:
    """Scale the DAC decoder's last conv so random codes give std ~0.1 (random weights give ~100)."""
    codes = torch.randint(0, CODEBOOK, (1, 8, 12), generator=gen)
    with intra_op_threads(1):  # the bytes follow the seed alone, not the caller's thread count
        scale = 0.1 / float(codec.decode(codes).audio_values.std())
    last = codec.acoustic_decoder.conv2
    last.weight.mul_(scale)
    if last.bias is not None:
        last.bias.mul_(scale)


def _save(model: nn.Module, path: Path, dtype: torch.dtype | None = None) -> None:
    from safetensors.torch import save_file

    state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().contiguous().clone()
             for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata={"format": "pt"})
    os.chmod(path, 0o644)


def write(directory: str | Path, *, version: str | None = None, seed: int = 0,
          dtype: torch.dtype | None = None) -> Path:
    """Write a tiny random OmniVoice folder; `dtype` is that of ``model.safetensors`` (None:
    float32; the codec is float32, as published)."""
    one_version(version)
    dtype = parse_dtype(torch.float32 if dtype is None else dtype, "tiny checkpoint dtype")
    import_upstream()
    from omnivoice import OmniVoice, OmniVoiceConfig
    from transformers import DacFeatureExtractor, HiggsAudioV2TokenizerConfig, HiggsAudioV2TokenizerModel, Qwen3Config

    out = Path(directory)
    codec_dir = out / "audio_tokenizer"
    codec_dir.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)

    text_tokenizer().save_pretrained(str(out))
    config = OmniVoiceConfig(audio_vocab_size=CODEBOOK + 1, audio_mask_id=CODEBOOK, num_audio_codebook=8,
                             llm_config=Qwen3Config(**LLM).to_dict(), dtype=DTYPE_NAMES[dtype])
    config.architectures = ["OmniVoice"]
    config.save_pretrained(str(out))
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # upstream's own init draws from the global RNG; overwritten below
        model = OmniVoice(config)
    randomize(model, gen)
    _save(model, out / "model.safetensors", None if dtype == torch.float32 else dtype)

    codec_config = HiggsAudioV2TokenizerConfig(acoustic_model_config=dict(ACOUSTIC),
                                               semantic_model_config=dict(SEMANTIC),
                                               codebook_size=CODEBOOK, codebook_dim=64,
                                               target_bandwidths=TARGET_BANDWIDTHS)
    codec_config.architectures = ["HiggsAudioV2TokenizerModel"]
    codec_config.save_pretrained(str(codec_dir))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        codec = HiggsAudioV2TokenizerModel(codec_config)
    randomize(codec, gen)
    _calibrate_output(codec, gen)
    _save(codec, codec_dir / "model.safetensors")
    DacFeatureExtractor(sampling_rate=24000, hop_length=codec_config.hop_length).save_pretrained(str(codec_dir))
    log.info("wrote tiny OmniVoice checkpoint to %s (%d LLM + %d codec parameters)", out,
             sum(p.numel() for p in model.parameters()), sum(p.numel() for p in codec.parameters()))
    return out
