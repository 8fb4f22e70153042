"""Dia's published checkpoint as data (issue 34; issue 35, `engines.published`): the shapes of
``nari-labs/Dia-1.6B-0626`` (transformers layout) and of its codec ``descript/dac_44khz`` as plain
dicts, the settings of Dia's own generation_config.json, and the folder the engine loads
(`MODELS`: the codec in ``dac_44khz/``). Published in float32 (the 1.6B model's safetensors are
6.4 GB); tests build them on the meta device, nothing here reads a folder.
"""
from __future__ import annotations

from typing import Any

import torch

from ..published import FileContent, PublishedModel
from .checkpoint import DAC_FOLDER, FEATURE_FILES
from .config import AUDIO_BOS, AUDIO_EOS, AUDIO_PAD, DELAY_PATTERN, HOP, SAMPLE_RATE

#: config.json of Dia-1.6B-0626 (transformers layout): the text encoder and the audio decoder.
DIA_1_6B: dict[str, Any] = {
    "architectures": ["DiaForConditionalGeneration"],
    "model_type": "dia",
    "delay_pattern": DELAY_PATTERN,
    "norm_eps": 1e-5,
    "encoder_config": {
        "model_type": "dia_encoder", "max_position_embeddings": 1024, "num_hidden_layers": 12,
        "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 128,
        "intermediate_size": 4096, "norm_eps": 1e-5, "vocab_size": 256, "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    },
    "decoder_config": {
        "model_type": "dia_decoder", "max_position_embeddings": 3072, "num_hidden_layers": 18,
        "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 16, "num_key_value_heads": 4,
        "head_dim": 128, "cross_num_attention_heads": 16, "cross_head_dim": 128, "cross_num_key_value_heads": 16,
        "cross_hidden_size": 1024, "norm_eps": 1e-5, "vocab_size": 1028, "hidden_act": "silu", "num_channels": 9,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "pad_token_id": AUDIO_PAD, "eos_token_id": AUDIO_EOS, "bos_token_id": AUDIO_BOS,
    },
}

#: config.json of descript/dac_44khz, the codec Dia's processor names.
DAC_44KHZ: dict[str, Any] = {
    "architectures": ["DacModel"],
    "model_type": "dac",
    "encoder_hidden_size": 64, "downsampling_ratios": [2, 4, 8, 8], "decoder_hidden_size": 1536,
    "upsampling_ratios": [8, 8, 4, 2], "n_codebooks": 9, "codebook_size": 1024, "codebook_dim": 8,
    "hidden_size": 1024, "quantizer_dropout": 0.0, "sampling_rate": SAMPLE_RATE, "hop_length": HOP,
}

#: generation_config.json of Dia-1.6B-0626: classifier-free guidance 3, sampling at temperature
#: 1.8 (Dia clamps anything under 1), top-p 0.95, top-k 45.
GENERATION: dict[str, Any] = {
    "do_sample": True, "guidance_scale": 3.0, "temperature": 1.8, "top_p": 0.95, "top_k": 45,
    "max_length": 3072, "bos_token_id": AUDIO_BOS, "eos_token_id": AUDIO_EOS, "pad_token_id": AUDIO_PAD,
}

#: The folder: its configs; the weights, tokenizer and feature extractor, which a shapes-only
#: build does not read, empty.
_FILES: dict[str, FileContent] = {
    "config.json": DIA_1_6B, "generation_config.json": GENERATION, "model.safetensors": None,
    "tokenizer_config.json": None, FEATURE_FILES[0]: None,
    f"{DAC_FOLDER}/config.json": DAC_44KHZ, f"{DAC_FOLDER}/model.safetensors": None,
}

MODELS = (PublishedModel("dia", "Dia-1.6B", "nari-labs/Dia-1.6B-0626", _FILES, dtype=torch.float32),)
