"""GPT-SoVITS's published base voice as data (issue 35, `engines.published`): the v2 pair of
``lj1995/GPT-SoVITS`` (``gsv-v2final-pretrained/``), whose sizes are
in the files themselves (``config`` of the GPT ``.ckpt``: s1longer-v2.yaml's model block, 512
wide, 16 heads, 24 layers; ``config`` of the SoVITS ``.pth``: s2.json, hidden and inter channels
192, filter 768, 6 layers, upsampling from 512 channels, gin 512), with the HuBERT feature model
(``chinese-hubert-base``: HuBERT base, 768 wide, 12 layers). The stand-ins written here hold
those configs (plain dicts, as the tiny writer's do; upstream pickles its ``HParams``) with no
weight but the phoneme table's shape, which the loader reads to tell v1 from v2 (each tensor a
zero-stride view of one element). The BERT and g2pW models run for Chinese text only and the
speaker model for v2Pro only: not in this build.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..published import FileContent, PublishedModel
from .checkpoint import HUBERT_FOLDER

GPT_FILE = "s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt"
SOVITS_FILE = "s2G2333k.pth"
T2S_MODEL: dict[str, Any] = {"vocab_size": 1025, "phoneme_vocab_size": 732, "embedding_dim": 512, "hidden_dim": 512,
                             "head": 16, "linear_units": 2048, "n_layer": 24, "dropout": 0, "EOS": 1024,
                             "random_bert": 0}
S2_MODEL: dict[str, Any] = {
    "inter_channels": 192, "hidden_channels": 192, "filter_channels": 768, "n_heads": 2, "n_layers": 6,
    "kernel_size": 3, "p_dropout": 0.1, "resblock": "1", "resblock_kernel_sizes": [3, 7, 11],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]], "upsample_rates": [10, 8, 2, 2, 2],
    "upsample_initial_channel": 512, "upsample_kernel_sizes": [16, 16, 8, 2, 2], "n_layers_q": 3,
    "use_spectral_norm": False, "gin_channels": 512, "semantic_frame_rate": "25hz", "freeze_quantizer": True,
    "version": "v2",
}
S2_DATA: dict[str, Any] = {"max_wav_value": 32768.0, "sampling_rate": 32000, "filter_length": 2048,
                           "hop_length": 640, "win_length": 2048, "n_mel_channels": 128, "n_speakers": 300}
HUBERT: dict[str, Any] = {"model_type": "hubert", "architectures": ["HubertModel"], "hidden_size": 768,
                          "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
                          "feat_extract_norm": "group", "conv_bias": False}
# chinese-roberta-wwm-ext-large's config.json (hfl; lj1995/GPT-SoVITS ships it in float16): the
# Chinese BERT, not in this build (it runs for Chinese text only) but written beside the voice by
# bench/full_size.py, as users have it.
BERT: dict[str, Any] = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 1024,
                        "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096,
                        "hidden_act": "gelu", "max_position_embeddings": 512, "type_vocab_size": 2,
                        "vocab_size": 21128, "layer_norm_eps": 1e-12, "pad_token_id": 0, "initializer_range": 0.02,
                        "attention_probs_dropout_prob": 0.1, "hidden_dropout_prob": 0.1}
PHONEMES, TEXT_WIDTH = 732, 192  # enc_p.text_embedding: v2's phoneme table


def _saved(obj: dict[str, Any]) -> Callable[[Path], None]:
    return lambda path: torch.save(obj, path)


_FILES: dict[str, FileContent] = {
    GPT_FILE: _saved({"weight": {}, "config": {"model": T2S_MODEL, "data": {"max_sec": 54}}, "info": "pretrained"}),
    SOVITS_FILE: _saved({"weight": {"enc_p.text_embedding.weight": torch.zeros((), dtype=torch.float16).expand(
        PHONEMES, TEXT_WIDTH)}, "config": {"model": S2_MODEL, "data": S2_DATA}, "info": "pretrained"}),
    f"{HUBERT_FOLDER}/config.json": HUBERT,
}

MODELS = (PublishedModel("gptsovits", "GPT-SoVITS v2 (pretrained)", "lj1995/GPT-SoVITS", _FILES,
                         dtype=torch.float16, version="v2"),)
