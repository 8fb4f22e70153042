"""CSM's published checkpoint as data (issue 34; issue 35, `engines.published`): the shapes of
``sesame/csm-1b`` (transformers layout: the Llama backbone, the depth decoder and the Mimi codec
in one config.json) as a plain dict, and the folder the engine loads (`MODELS`). Published in
float32 (its safetensors are 6.2 GB); tests build it on the meta device, nothing here reads a
folder.
"""
from __future__ import annotations

from typing import Any

import torch

from ..published import FileContent, PublishedModel
from .checkpoint import FEATURE_FILES
from .config import SAMPLE_RATE

#: config.json of sesame/csm-1b (transformers layout).
CSM_1B: dict[str, Any] = {
    "architectures": ["CsmForConditionalGeneration"],
    "model_type": "csm",
    "num_codebooks": 32, "vocab_size": 2051, "text_vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "high_freq_factor": 4.0,
                        "low_freq_factor": 1.0, "original_max_position_embeddings": 2048},
    "pad_token_id": 128002, "bos_token_id": 128000, "audio_token_id": 128002, "audio_eos_token_id": 128003,
    "codebook_pad_token_id": 2050, "codebook_eos_token_id": 0, "tie_codebooks_embeddings": True,
    "depth_decoder_config": {
        "model_type": "csm_depth_decoder_model", "num_codebooks": 32, "backbone_hidden_size": 2048,
        "vocab_size": 2051, "hidden_size": 1024, "intermediate_size": 8192, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "hidden_act": "silu",
        "max_position_embeddings": 33, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "high_freq_factor": 4.0,
                            "low_freq_factor": 1.0, "original_max_position_embeddings": 16},
    },
    "codec_config": {
        "model_type": "mimi", "sampling_rate": SAMPLE_RATE, "audio_channels": 1, "hidden_size": 512, "num_filters": 64,
        "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4], "kernel_size": 7, "last_kernel_size": 3,
        "residual_kernel_size": 3, "dilation_growth_rate": 2, "use_causal_conv": True, "pad_mode": "constant",
        "compress": 2, "trim_right_ratio": 1.0, "codebook_size": 2048, "codebook_dim": 256, "num_quantizers": 32,
        "use_conv_shortcut": False, "vector_quantization_hidden_dimension": 256, "num_semantic_quantizers": 1,
        "upsample_groups": 512, "num_hidden_layers": 8, "intermediate_size": 2048, "num_attention_heads": 8,
        "num_key_value_heads": 8, "head_dim": 64, "hidden_act": "gelu", "max_position_embeddings": 8000,
        "norm_eps": 1e-5, "use_cache": False, "sliding_window": 250, "layer_scale_initial_scale": 0.01,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    },
}

#: The folder: its config; the weights, tokenizer and feature extractor, which a shapes-only
#: build does not read, empty.
_FILES: dict[str, FileContent] = {"config.json": CSM_1B, "model.safetensors": None, "tokenizer.json": None,
                                  "tokenizer_config.json": None, FEATURE_FILES[0]: None}

MODELS = (PublishedModel("csm", "CSM-1B", "sesame/csm-1b", _FILES, dtype=torch.float32),)
