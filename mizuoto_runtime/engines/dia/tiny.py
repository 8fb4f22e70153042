"""Tiny random Dia checkpoints in the published layout, for tests and demos (issue 34).

`write(dir)` writes the files of ``nari-labs/Dia-1.6B-0626`` (transformers layout) and, inside
it, the codec folder ``dac_44khz/`` (``descript/dac_44khz``)::

    config.json  generation_config.json  model.safetensors.index.json  model-0000{1,2}-of-00002.safetensors
    tokenizer_config.json  preprocessor_config.json
    dac_44khz/{config.json, model.safetensors}

Built through transformers' own classes (`DiaForConditionalGeneration`, `DacModel`,
`DiaTokenizer`, `DiaFeatureExtractor`), configs by their own ``save_pretrained``, weights drawn
from a seeded generator: byte-identical files on every run, at any thread count. Geometry:
the real token structure (vocabulary 1028, 9 channels, the delay pattern; the tokenizer is
Dia's own byte tokenizer) and the real codec frame (44.1 kHz, hop 512, 9 codebooks of 1024)
with tiny widths; each decoder layer (3) is a 2 MB unit in float32, each encoder layer (2) a
1.8 MB one, the DAC's widest blocks 2 MB: the M57 placements really stream.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from ...nn.dtypes import DTYPE_NAMES, parse_dtype
from ..tiny import one_version, randomize_normed, save_shards, scale_output
from .checkpoint import DAC_FOLDER
from .config import DELAY_PATTERN, HOP, SAMPLE_RATE
from .published import GENERATION

log = logging.getLogger(__name__)

ENCODER: dict[str, Any] = {  # real: 12 layers, 1024 wide
    "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64,
    "intermediate_size": 1024, "vocab_size": 256, "max_position_embeddings": 1024,
}
DECODER: dict[str, Any] = {  # real: 18 layers, 2048 wide, 16 heads (4 KV), cross-attention 16 x 128
    "num_hidden_layers": 3, "hidden_size": 128, "intermediate_size": 1024, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "cross_num_attention_heads": 4, "cross_head_dim": 32,
    "cross_num_key_value_heads": 4, "cross_hidden_size": 128, "vocab_size": 1028, "num_channels": 9,
    "max_position_embeddings": 3072,
}
DAC: dict[str, Any] = {  # real: encoder 64, decoder 1536, hidden 1024 (same ratios, codebooks)
    "encoder_hidden_size": 16, "downsampling_ratios": [2, 4, 8, 8], "decoder_hidden_size": 256,
    "upsampling_ratios": [8, 8, 4, 2], "n_codebooks": 9, "codebook_size": 1024, "codebook_dim": 8,
    "hidden_size": 64, "sampling_rate": SAMPLE_RATE,
}


def _save(model: torch.nn.Module, folder: Path, dtype: torch.dtype, shards: int) -> None:
    state = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous().clone()
             for k, v in model.state_dict().items()}
    if shards > 1:
        files = save_shards(state, folder, shards)
    else:
        from safetensors.torch import save_file

        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        files = ["model.safetensors"]
    for name in files:
        os.chmod(folder / name, 0o644)


def write(directory: str | Path, *, version: str | None = None, seed: int = 0,
          dtype: torch.dtype | None = None) -> Path:
    """Write a tiny random Dia folder with its codec; `dtype` is that of the Dia weights (None:
    float32; the codec is float32, as published)."""
    one_version(version)
    dtype = parse_dtype(torch.float32 if dtype is None else dtype, "tiny checkpoint dtype")
    from transformers import (
        DacConfig,
        DacModel,
        DiaConfig,
        DiaFeatureExtractor,
        DiaForConditionalGeneration,
        DiaTokenizer,
        GenerationConfig,
    )

    out = Path(directory)
    codec_dir = out / DAC_FOLDER
    codec_dir.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)

    config = DiaConfig(encoder_config=dict(ENCODER), decoder_config=dict(DECODER), delay_pattern=list(DELAY_PATTERN))
    config.architectures = ["DiaForConditionalGeneration"]
    config.dtype = DTYPE_NAMES[dtype]
    config.save_pretrained(str(out))
    GenerationConfig(**GENERATION).save_pretrained(str(out))
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # upstream's own init draws from the global RNG; overwritten below
        model = DiaForConditionalGeneration(config)
    randomize_normed(model, gen)
    _save(model, out, dtype, shards=2)
    DiaTokenizer().save_pretrained(str(out))
    DiaFeatureExtractor(sampling_rate=SAMPLE_RATE, hop_length=HOP).save_pretrained(str(out))

    codec_config = DacConfig(**DAC)
    codec_config.architectures = ["DacModel"]
    codec_config.save_pretrained(str(codec_dir))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        codec = DacModel(codec_config).eval()
    randomize_normed(codec, gen)
    codes = torch.randint(0, DAC["codebook_size"], (1, DAC["n_codebooks"], 12), generator=gen)
    last = codec.decoder.conv2
    scale_output(last, lambda: codec.decode(audio_codes=codes), tuple(p for p in last.parameters()))
    _save(codec, codec_dir, torch.float32, shards=1)
    log.info("wrote tiny Dia checkpoint to %s (%d model + %d codec parameters)", out,
             sum(p.numel() for p in model.parameters()), sum(p.numel() for p in codec.parameters()))
    return out
