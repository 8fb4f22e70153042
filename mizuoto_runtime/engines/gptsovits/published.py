"""GPT-SoVITS's published base voices as data (issue 35, `engines.published`): the v2 pair of
``lj1995/GPT-SoVITS`` (``gsv-v2final-pretrained/``), whose sizes are
in the files themselves (``config`` of the GPT ``.ckpt``: s1longer-v2.yaml's model block, 512
wide, 16 heads, 24 layers; ``config`` of the SoVITS ``.pth``: s2.json, hidden and inter channels
192, filter 768, 6 layers, upsampling from 512 channels, gin 512), with the HuBERT feature model
(``chinese-hubert-base``: HuBERT base, 768 wide, 12 layers). The stand-ins written here hold
those configs (plain dicts, as the tiny writer's do; upstream pickles its ``HParams``) with no
weight but the phoneme table's shape, which the loader reads to tell v1 from v2 (each tensor a
zero-stride view of one element). The BERT and g2pW models run for Chinese text only: not in
this build.

v2Pro and v2ProPlus (``v2Pro/s2Gv2Pro.pth``, ``v2Pro/s2Gv2ProPlus.pth``, version-tagged ``05`` /
``06``, with the GPT ``s1v3.ckpt`` one folder up: s1longer-v2.yaml's model block, as v2's): their
SoVITS configs are s2v2Pro.json's and s2v2ProPlus.json's, and the speaker model
(``sv/pretrained_eres2netv2w24s4ep4.ckpt``, ERes2NetV2 at `SVConfig`'s published sizes) is
written as its tensors' shapes, which the loader reads, as is the SoVITS ``sv_emb`` (its 20480
inputs).
"""
from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ...nn.loading import build_on_meta
from ..published import FileContent, PublishedModel
from .checkpoint import HUBERT_FOLDER, PRO_GPT, SV_FILE
from .config import SVConfig
from .sv import ERes2NetV2

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
# s2v2Pro.json / s2v2ProPlus.json's model blocks: v2's, with the global embedding 1024 wide (the
# speaker model's 20480 values projected to it) and, for ProPlus, a wider first upsampling.
S2_PRO_MODEL: dict[str, Any] = {**S2_MODEL, "p_dropout": 0.0, "gin_channels": 1024, "version": "v2Pro"}
S2_PRO_PLUS_MODEL: dict[str, Any] = {**S2_PRO_MODEL, "upsample_initial_channel": 768,
                                     "upsample_kernel_sizes": [20, 16, 8, 2, 2], "version": "v2ProPlus"}
PRO_FOLDER, PRO_SOVITS, PRO_PLUS_SOVITS = "v2Pro", "s2Gv2Pro.pth", "s2Gv2ProPlus.pth"
SV_DIM = SVConfig().output_dim  # 20480: ERes2NetV2's forward3 at its published sizes
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


def _saved(obj: dict[str, Any], tag: bytes = b"") -> Callable[[Path], None]:
    """Writes `obj` with torch.save; `tag`: the version tag upstream writes over the zip's
    first two bytes (``05`` v2Pro, ``06`` v2ProPlus)."""
    def write(path: Path) -> None:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        path.write_bytes(tag + buffer.getvalue()[len(tag):])

    return write


def _shape_only(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.zeros((), dtype=dtype).expand(shape)


def _gpt_file() -> Callable[[Path], None]:
    return _saved({"weight": {}, "config": {"model": T2S_MODEL, "data": {"max_sec": 54}}, "info": "pretrained"})


def _pro_sovits(model: dict[str, Any], tag: bytes) -> Callable[[Path], None]:
    weight = {"enc_p.text_embedding.weight": _shape_only(PHONEMES, TEXT_WIDTH),
              "sv_emb.weight": _shape_only(model["gin_channels"], SV_DIM)}
    return _saved({"weight": weight, "config": {"model": model, "data": S2_DATA}, "info": "pretrained"}, tag)


def _sv_state(path: Path) -> None:
    """ERes2NetV2's state at its published sizes (`SVConfig`'s defaults), shapes only."""
    model = build_on_meta(lambda: ERes2NetV2(SVConfig()))
    torch.save({k: _shape_only(*t.shape, dtype=t.dtype) for k, t in model.state_dict().items()}, path)


_FILES: dict[str, FileContent] = {
    GPT_FILE: _gpt_file(),
    SOVITS_FILE: _saved({"weight": {"enc_p.text_embedding.weight": _shape_only(PHONEMES, TEXT_WIDTH)},
                         "config": {"model": S2_MODEL, "data": S2_DATA}, "info": "pretrained"}),
    f"{HUBERT_FOLDER}/config.json": HUBERT,
}


def _pro_files(sovits: str, model: dict[str, Any], tag: bytes) -> dict[str, FileContent]:
    """upstream's pretrained_models/ as v2Pro users have it: ``v2Pro/<sovits>`` (tagged), its GPT
    ``s1v3.ckpt`` one folder up, HuBERT and the speaker model beside that."""
    return {PRO_GPT: _gpt_file(), f"{PRO_FOLDER}/{sovits}": _pro_sovits(model, tag),
            f"{HUBERT_FOLDER}/config.json": HUBERT, SV_FILE: _sv_state}


MODELS = (
    PublishedModel("gptsovits", "GPT-SoVITS v2 (pretrained)", "lj1995/GPT-SoVITS", _FILES,
                   dtype=torch.float16, version="v2"),
    PublishedModel("gptsovits", "GPT-SoVITS v2Pro (pretrained)", "lj1995/GPT-SoVITS",
                   _pro_files(PRO_SOVITS, S2_PRO_MODEL, b"05"), dtype=torch.float16, version="v2pro",
                   choice=f"{PRO_FOLDER}/{PRO_SOVITS}"),
    PublishedModel("gptsovits", "GPT-SoVITS v2ProPlus (pretrained)", "lj1995/GPT-SoVITS",
                   _pro_files(PRO_PLUS_SOVITS, S2_PRO_PLUS_MODEL, b"06"), dtype=torch.float16, version="v2pro",
                   choice=f"{PRO_FOLDER}/{PRO_PLUS_SOVITS}"),
)
