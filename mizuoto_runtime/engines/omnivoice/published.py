"""OmniVoice's published checkpoint as data (issue 35, `engines.published`): ``k2-fsa/OmniVoice``,
a Qwen3-0.6B LLM (1024 wide, 28 layers, tied embeddings) over 8 codebooks of 1024 codes, with
the Higgs Audio v2 tokenizer (``audio_tokenizer/``: a DAC acoustic codec at 25 Hz, hop 960, and
a HuBERT-base semantic model; its published config is `higgs_codec.TOKENIZER`). Keys left out
are the config classes' defaults, which are the published values."""
from __future__ import annotations

from typing import Any

import torch

from ..higgs_codec import TOKENIZER
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
_FILES: dict[str, FileContent] = {path: None for path in REQUIRED_FILES}
_FILES.update({"config.json": CONFIG, "audio_tokenizer/config.json": TOKENIZER})

MODELS = (PublishedModel("omnivoice", "OmniVoice", "k2-fsa/OmniVoice", _FILES, dtype=torch.float32),)
