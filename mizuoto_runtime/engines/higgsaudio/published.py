"""Higgs Audio v2's published checkpoint as data (issue 34; issue 35, `engines.published`): the
shapes of ``bosonai/higgs-audio-v2-generation-3B-base`` in transformers' format (``config.json``,
``generation_config.json``) as plain dicts, and the folder the engine loads (`MODELS`: the audio
tokenizer's published config, `higgs_codec.TOKENIZER`, in ``audio_tokenizer/``).

Tests build these on the meta device (no weights) to check the estimates and units at full
size; the full-size runs write random weights from them. Values as published, with where they
differ from transformers' class defaults said beside them.
"""
from __future__ import annotations

from typing import Any

from ..higgs_codec import TOKENIZER
from ..published import FileContent, PublishedModel
from .checkpoint import AUDIO_TOKENIZER_FOLDER, INDEX, REQUIRED_FILES

#: ``config.json`` of the 3B generation model (Llama-3.2-3B with a second, audio FFN per layer).
#: `codebook_size` counts the 1024 codes plus the stream's BOS (1024) and EOS (1025); the class
#: default is 1024.
GENERATION_3B: dict[str, Any] = {
    "architectures": ["HiggsAudioV2ForConditionalGeneration"],
    "model_type": "higgs_audio_v2",
    "vocab_size": 128256,
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {
        "factor": 32.0, "high_freq_factor": 0.5, "low_freq_factor": 0.125,
        "original_max_position_embeddings": 1024, "rope_theta": 500000.0, "rope_type": "llama3",
    },
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
    "num_codebooks": 8,
    "codebook_size": 1026,
    "audio_token_id": 128016,
    "audio_bos_token_id": 128013,
    "audio_delay_token_id": 128014,
    "audio_stream_bos_id": 1024,
    "audio_stream_eos_id": 1025,
    "bos_token_id": 1,
    "eos_token_id": 128009,
    "pad_token_id": 128001,
}

#: ``generation_config.json``: sampling, and repetition-aware sampling (RAS) over the last 7
#: frames in place of a repetition penalty (which the model's generate refuses).
GENERATION_CONFIG: dict[str, Any] = {
    "do_sample": True, "temperature": 1.0, "top_k": 50, "top_p": 0.95,
    "ras_win_len": 7, "ras_win_max_num_repeat": 2, "use_cache": True,
    "bos_token_id": 1, "eos_token_id": 128009, "pad_token_id": 128001,
}



def _files() -> dict[str, FileContent]:
    """The published folder: its configs; the index, tokenizer and weights, which a shapes-only
    build does not read, empty."""
    files: dict[str, FileContent] = {path: None for path in (*REQUIRED_FILES, INDEX)}
    files.update({"config.json": GENERATION_3B, "generation_config.json": GENERATION_CONFIG,
                  f"{AUDIO_TOKENIZER_FOLDER}/config.json": TOKENIZER})
    return files


MODELS = (PublishedModel("higgsaudio", "Higgs Audio v2 generation 3B base",
                         "bosonai/higgs-audio-v2-generation-3B-base", _files()),)
