"""OmniVoice's published checkpoint as data (issue 35, `engines.published`): ``k2-fsa/OmniVoice``,
a Qwen3-0.6B LLM (1024 wide, 28 layers, tied embeddings) over 8 codebooks of 1024 codes, with
the Higgs Audio v2 tokenizer (``audio_tokenizer/``: a DAC acoustic codec at 25 Hz, hop 960, and
a HuBERT-base semantic model). Keys left out are the config classes' defaults, which are the
published values."""
from __future__ import annotations

from typing import Any

import torch

from ..published import FileContent, PublishedModel
from .checkpoint import REQUIRED_FILES

LLM: dict[str, Any] = dict(
    model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
    rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
)
CONFIG: dict[str, Any] = dict(
    model_type="omnivoice", architectures=["OmniVoice"], audio_vocab_size=1025, audio_mask_id=1024,
    num_audio_codebook=8, audio_codebook_weights=[8, 8, 6, 6, 4, 4, 2, 2], llm_config=LLM,
)
AUDIO_TOKENIZER: dict[str, Any] = dict(
    model_type="higgs_audio_v2_tokenizer", architectures=["HiggsAudioV2TokenizerModel"], sample_rate=24000,
    codebook_size=1024, codebook_dim=64, target_bandwidths=[0.5, 1, 1.5, 2],
    acoustic_model_config=dict(
        model_type="dac", encoder_hidden_size=64, downsampling_ratios=[8, 5, 4, 2, 3], decoder_hidden_size=1024,
        upsampling_ratios=[8, 5, 4, 2, 3], hidden_size=256, codebook_size=1024, codebook_dim=8, n_codebooks=9,
        sampling_rate=24000, hop_length=960,
    ),
    semantic_model_config=dict(model_type="hubert", hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                               intermediate_size=3072),
)

_FILES: dict[str, FileContent] = {path: None for path in REQUIRED_FILES}
_FILES.update({"config.json": CONFIG, "audio_tokenizer/config.json": AUDIO_TOKENIZER})

MODELS = (PublishedModel("omnivoice", "OmniVoice", "k2-fsa/OmniVoice", _FILES, dtype=torch.float32),)
