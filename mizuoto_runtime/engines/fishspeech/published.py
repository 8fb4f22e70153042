"""Fish Speech's published checkpoints as data (issue 35, `engines.published`): ``fishaudio/s2-pro``'s
config.json (``fish_qwen3_omni``: a 36-layer slow transformer 2560 wide, 32 heads over 8 KV
heads of 128, FFN 9728, vocabulary 155776; a 4-layer fast transformer of the same width over 10
codebooks of 4096) and its codec's shapes. ``codec.pth`` carries no config: the loader reads
the shapes off its tensors (`checkpoint.infer_codec_config`), so the stand-in written here holds
every tensor of the published codec (encoder 64 wide, latent 1024, decoder 1536, a 4-layer
encoder transformer, 8-layer quantizer transformers 1024 wide with 16 heads, 9 residual
codebooks of 1024 and a semantic one of 4096, codebook width 8) with its name and shape and no
data (each a zero-stride view of one element), as upstream's ``modded_dac_vq.yaml`` builds it.

Not here: OpenAudio S1-mini (its config.json's sizes were not found in a source to cite).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...nn.loading import build_on_meta
from ..published import FileContent, PublishedModel
from .checkpoint import CODEC_FILE, CODEC_SAMPLE_RATE
from .codec import CodecConfig, CodecDecoder, CodecEncoder, TransformerConfig

CODEC = CodecConfig(
    sample_rate=CODEC_SAMPLE_RATE, encoder_dim=64, encoder_rates=(2, 4, 8, 8), latent_dim=1024, decoder_dim=1536,
    decoder_rates=(8, 8, 4, 2), encoder_transformer_layers=(0, 0, 0, 4), n_codebooks=9, codebook_size=1024,
    codebook_dim=8, semantic_codebook_size=4096, downsample_factor=(2, 2),
    pre=TransformerConfig(n_layer=8, dim=1024, n_head=16, intermediate_size=3072, window=128),
    post=TransformerConfig(n_layer=8, dim=1024, n_head=16, intermediate_size=3072, window=128),
)

_LAYER: dict[str, Any] = dict(n_head=32, n_local_heads=8, head_dim=128, dim=2560, intermediate_size=9728,
                              rope_base=1000000.0, norm_eps=1e-6, attention_qkv_bias=False, attention_o_bias=False)
S2_PRO_CONFIG: dict[str, Any] = {
    "model_type": "fish_qwen3_omni", "dtype": "bfloat16", "sample_rate": CODEC_SAMPLE_RATE,
    "text_config": {"model_type": "fish_qwen3", "vocab_size": 155776, "n_layer": 36, "max_seq_len": 32768,
                    "tie_word_embeddings": True, "attention_qk_norm": True, **_LAYER},
    "audio_decoder_config": {"model_type": "fish_qwen3_audio_decoder", "vocab_size": 4096, "n_layer": 4,
                             "max_seq_len": 11, "tie_word_embeddings": False, "attention_qk_norm": False,
                             "text_dim": 2560, "num_codebooks": 10, **_LAYER},
}


def write_codec(path: Path, config: CodecConfig = CODEC) -> None:
    """A ``codec.pth`` with every tensor of the codec `config` describes, shapes and no data."""
    parts = build_on_meta(lambda: CodecEncoder(config)), build_on_meta(lambda: CodecDecoder(config))
    state = {name: torch.zeros((), dtype=tensor.dtype).expand(tensor.shape)
             for part in parts for name, tensor in part.state_dict().items()}
    torch.save(state, path)


_FILES: dict[str, FileContent] = {"config.json": S2_PRO_CONFIG, "model.safetensors.index.json": None,
                                  "tokenizer.json": None, CODEC_FILE: write_codec}

MODELS = (PublishedModel("fishspeech", "Fish Audio S2-Pro", "fishaudio/s2-pro", _FILES, dtype=torch.bfloat16,
                         version="s2-pro"),)
