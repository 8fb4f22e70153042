"""The published VibeVoice configurations, as data: the ``config.json`` of
``vibevoice/VibeVoice-1.5B-hf`` and the shapes of ``vibevoice/VibeVoice-7B-hf``, for naming a
folder by its size (`label_of`), for building either model on the meta device (tests, and the
full-size measurement that writes random weights shard by shard) and as the engine's published
models (`MODELS`, issue 35, `engines.published`).

1.5B: the converted checkpoint's config.json (transformers 5.13's conversion of
microsoft/VibeVoice-1.5B). 7B: the same conversion applied to microsoft/VibeVoice-7B's
``decoder_config`` (Qwen2.5-7B: 3584 wide, 28 layers, 28 query and 4 key/value heads, vocabulary
152064, an untied head, 32768 positions); its tokenizers, connectors and head geometry are the
1.5B's, the head as wide as the LM, as the original config's ``head_ffn_ratio`` 3.0 and
``head_layers`` 4 say.
"""
from __future__ import annotations

import copy
from typing import Any

from ..published import FileContent, PublishedModel
from .checkpoint import PROCESSOR_FILES, REQUIRED_FILES

TOKENIZER: dict[str, Any] = {
    "channels": 1, "depths": [3, 3, 3, 3, 3, 3, 8], "downsampling_ratios": [2, 2, 4, 5, 5, 8], "ffn_expansion": 4,
    "hidden_act": "gelu", "initializer_range": 0.01, "kernel_size": 7, "layer_scale_init_value": 1e-6,
    "num_filters": 32, "rms_norm_eps": 1e-5, "vae_std": 0.625,
}

VIBEVOICE_1_5B: dict[str, Any] = {
    "architectures": ["VibeVoiceForConditionalGeneration"],
    "model_type": "vibevoice",
    "audio_bos_token_id": 151652, "audio_eos_token_id": 151653, "audio_token_id": 151654,
    "eos_token_id": 151643, "pad_token_id": 151643,
    "audio_config": {**TOKENIZER, "hidden_size": 64, "model_type": "vibevoice_acoustic_tokenizer"},
    "semantic_model_config": {**TOKENIZER, "hidden_size": 128, "model_type": "vibevoice_acoustic_tokenizer_encoder"},
    "diffusion_head_config": {
        "model_type": "vibevoice_diffusion", "hidden_size": 1536, "latent_size": 64, "num_hidden_layers": 4,
        "intermediate_size": 4608, "rms_norm_eps": 1e-5, "hidden_act": "silu", "frequency_embedding_size": 256,
        "diffusion_max_period": 10000, "mlp_bias": False,
    },
    "text_config": {
        "model_type": "qwen2", "attention_dropout": 0.0, "hidden_act": "silu", "hidden_size": 1536,
        "initializer_range": 0.02, "intermediate_size": 8960, "max_position_embeddings": 65536,
        "max_window_layers": 28, "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "sliding_window": None, "tie_word_embeddings": True, "use_cache": True, "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
}

VIBEVOICE_7B: dict[str, Any] = copy.deepcopy(VIBEVOICE_1_5B)
VIBEVOICE_7B["diffusion_head_config"].update(hidden_size=3584, intermediate_size=10752)
VIBEVOICE_7B["text_config"].update(hidden_size=3584, intermediate_size=18944, max_position_embeddings=32768,
                                   num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False,
                                   vocab_size=152064)
VIBEVOICE_7B["tie_word_embeddings"] = False

PUBLISHED: dict[str, dict[str, Any]] = {"VibeVoice-1.5B": VIBEVOICE_1_5B, "VibeVoice-7B": VIBEVOICE_7B}
#: What tells the sizes apart: the LM's geometry.
SIZE_KEYS = ("hidden_size", "num_hidden_layers", "intermediate_size")


def label_of(config: dict[str, Any]) -> str:
    """The published name a config.json's LM geometry matches; "VibeVoice" for any other size."""
    text = config.get("text_config") or {}
    for name, published in PUBLISHED.items():
        if all(text.get(k) == published["text_config"][k] for k in SIZE_KEYS):
            return name
    return "VibeVoice"


def published_config(name: str) -> Any:
    """`VibeVoiceConfig` of a published size (a key of `PUBLISHED`)."""
    from transformers import VibeVoiceConfig

    if name not in PUBLISHED:
        raise ValueError(f"unknown published VibeVoice size {name!r}; known: {', '.join(PUBLISHED)}")
    data = copy.deepcopy(PUBLISHED[name])
    data.pop("model_type")
    return VibeVoiceConfig(**data)


def _model(name: str, version: str) -> PublishedModel:
    """The ``-hf`` folder of a published size: its config.json; the index, tokenizer and
    processor files, which a shapes-only build does not read, empty."""
    files: dict[str, FileContent] = {path: None for path in (*REQUIRED_FILES, PROCESSOR_FILES[0])}
    files["config.json"] = PUBLISHED[name]
    return PublishedModel("vibevoice", name, f"vibevoice/{name}-hf", files, version=version)


MODELS = (_model("VibeVoice-1.5B", "1.5b"), _model("VibeVoice-7B", "7b"))
