"""Tiny random Chatterbox checkpoints in the published layout, for tests and demos (issue 34).

`write(dir)` writes the files of ``ResembleAI/chatterbox`` (English)::

    ve.safetensors  t3_cfg.safetensors  s3gen.safetensors  tokenizer.json  conds.pt

and, for ``version="multilingual"``, also Chatterbox Multilingual's::

    t3_mtl23ls_v2.safetensors  grapheme_mtl_merged_expanded_v1.json  ve.pt  s3gen.pt

through the package's own classes (`checkpoint.build_t3`, `build_s3gen`, ``VoiceEncoder``) at
`TINY` sizes — the published file layout and tensor names, so upstream's ``load_state_dict``
takes them — with weights drawn from a seeded generator (byte-identical files on every run).
T3's Llama is 128 wide (16 heads of 8, as the published T3 has 16 heads) with 2 layers, each a
1.8 MB unit in float32 (so half-way placements keep one and stream the other); its
vocabularies and position tables keep the published sizes (704 text, 8194 speech tokens). The
voice encoder, CAM++ and the flow encoder's width (512, which upstream hard-codes) keep theirs.
``tokenizer.json`` is one token per character with Chatterbox's special tokens (``[STOP]`` = 0,
``[START]`` = 255, as T3Config expects); ``conds.pt`` is the built-in voice, the conditionals of
a seeded synthetic reference, saved as upstream's ``Conditionals.save`` does (tensors only).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import string
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...memory.intra_op import intra_op_threads
from ...nn.dtypes import parse_dtype
from ...nn.loading import build_on_meta
from ..tiny import fan_in_std, version_of
from .checkpoint import (
    CONDS_FILE,
    MULTILINGUAL_T3,
    MULTILINGUAL_TOKENIZER,
    S3GEN_FILE,
    S3GEN_PICKLE,
    T3_FILE,
    TOKENIZER_FILE,
    VE_FILE,
    VE_PICKLE,
    Sizes,
    build_s3gen,
    build_t3,
    import_upstream,
)
from .conditioning import conditionals

log = logging.getLogger(__name__)

VERSIONS = ("english", "multilingual")
TINY = Sizes(t3_hidden=128, t3_layers=2, t3_intermediate=1024, t3_head_dim=8, t3_kv_heads=16, tokenizer_width=128,
             tokenizer_layers=1, flow_blocks=1, flow_units=256, estimator_channels=64, estimator_blocks=1,
             estimator_mid_blocks=1, estimator_heads=1, hift_channels=64, f0_channels=64)
# The multilingual T3: 14 layers, as its alignment analyzer reads layers 9, 12 and 13; each a
# 1.0 MB unit in float32.
TINY_MULTILINGUAL = dataclasses.replace(TINY, t3_layers=14, t3_intermediate=512)
# The multilingual T3's speech head proposes speech tokens only (its start, stop and padding rows
# are zero, the others scaled up): upstream's multilingual decode keeps whatever T3 proposes
# between start and stop of speech, and its flow cannot embed the padding tokens a random head
# would propose.
SPEECH_VOCAB = 6561
SPEECH_LOGIT_SCALE = 4.0
LANGUAGES = ("ar", "da", "de", "el", "en", "es", "fi", "fr", "he", "hi", "it", "ja", "ko", "ms", "nl", "no", "pl",
             "pt", "ru", "sv", "sw", "tr", "zh")  # upstream's SUPPORTED_LANGUAGES
SPECIAL = {"[STOP]": 0, "[START]": 255, "[UNK]": 1, "[SPACE]": 2, "[PAD]": 3, "[SEP]": 4, "[CLS]": 5, "[MASK]": 6}
S3GEN_COMPUTED = ("tokenizer._mel_filters", "tokenizer.window")  # not in the published file


def text_tokenizer(languages: tuple[str, ...] = ()) -> object:
    """One token per printable ASCII character, Chatterbox's special tokens, and the
    multilingual tokenizer's language tokens (``[fr]``) for `languages`."""
    from tokenizers import AddedToken, Tokenizer, models

    chars = [c for c in string.printable if c not in string.whitespace]
    vocab = dict(SPECIAL)
    for c in chars:
        vocab[c] = len(vocab) + 1  # after [STOP]..[MASK] (0-6) and before [START] (255)
    for code in languages:
        vocab[f"[{code}]"] = 256 + len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    tok.add_special_tokens([AddedToken(t, special=True) for t in (*SPECIAL, *(f"[{c}]" for c in languages))])
    return tok


@torch.no_grad()
def randomize(model: nn.Module, gen: torch.Generator) -> None:
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if p.dim() == 1 and ("norm" in name or "ln" in name) and leaf == "weight":
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif leaf == "bias" or p.dim() == 0:
            p.copy_(0.02 * torch.randn(p.shape, generator=gen))
        elif "emb" in name and p.dim() == 2:
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(fan_in_std(p) * torch.randn(p.shape, generator=gen))


def materialized(model: nn.Module) -> nn.Module:
    """`model`'s meta parameters as empty CPU tensors (to be drawn)."""
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None and p.is_meta:
                module._parameters[name] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype), requires_grad=False)
    return model


def _save(model: nn.Module, path: Path, dtype: torch.dtype, skip: tuple[str, ...] = ()) -> None:
    from safetensors.torch import save_file

    state = {k: (v.to(dtype) if v.is_floating_point() else v).detach().contiguous().clone()
             for k, v in model.state_dict().items() if k not in skip}
    save_file(state, str(path), metadata={"format": "pt"})
    os.chmod(path, 0o644)


def _write_multilingual(out: Path, ve: nn.Module, s3gen: nn.Module, gen: torch.Generator, dtype: torch.dtype) -> None:
    """The multilingual files beside the English ones, as the published repository has them:
    its T3 and grapheme tokenizer, and the voice encoder and S3Gen as the pickled state dicts
    its loader reads (the same tensors as the .safetensors files)."""
    t3 = materialized(build_on_meta(lambda: build_t3(TINY_MULTILINGUAL, multilingual=True)))
    randomize(t3, gen)
    with torch.no_grad():  # as a trained model: speech tokens only, clearly above min_p's cut
        t3.speech_head.weight[SPEECH_VOCAB:] = 0
        t3.speech_head.weight[:SPEECH_VOCAB] *= SPEECH_LOGIT_SCALE
    _save(t3, out / MULTILINGUAL_T3, dtype)
    text_tokenizer(LANGUAGES).save(str(out / MULTILINGUAL_TOKENIZER))
    for model, name in ((ve, VE_PICKLE), (s3gen, S3GEN_PICKLE)):  # s3gen.pt has every key: upstream loads it strictly
        state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
        torch.save(state, out / name)
        os.chmod(out / name, 0o644)


def write(directory: str | Path, *, version: str | None = None, seed: int = 0,
          dtype: torch.dtype | None = None) -> Path:
    """Write a tiny random Chatterbox folder; `dtype` is that of ``t3_cfg.safetensors`` (None:
    float32; S3Gen and the voice encoder are float32, as published)."""
    version = version_of(version, VERSIONS)
    dtype = parse_dtype(torch.float32 if dtype is None else dtype, "tiny checkpoint dtype")
    import_upstream()
    from chatterbox.models.voice_encoder import VoiceEncoder

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    # On meta (no init cost: the published-size parts build_s3gen replaces are never made),
    # then every parameter drawn from the seeded generator; buffers are upstream's own.
    ve, t3, s3gen = (materialized(build_on_meta(f)) for f in (VoiceEncoder, lambda: build_t3(TINY),
                                                               lambda: build_s3gen(TINY)))
    for model in (ve, t3, s3gen):
        randomize(model, gen)
        model.eval()
    text_tokenizer().save(str(out / TOKENIZER_FILE))
    _save(ve, out / VE_FILE, torch.float32)
    _save(t3, out / T3_FILE, dtype)
    _save(s3gen, out / S3GEN_FILE, torch.float32, S3GEN_COMPUTED)
    t = np.arange(2 * 24000, dtype=np.float32) / 24000
    noise = torch.randn(t.shape, generator=gen).numpy()
    reference = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t)) + 0.02 * noise)
    with intra_op_threads(1), torch.inference_mode():  # the bytes follow the seed alone
        conds = conditionals(t3, s3gen, ve, reference.astype(np.float32), torch.device("cpu"))
    conds["t3"]["emotion_adv"] = 0.5 * torch.ones(1, 1, 1)
    torch.save(conds, out / CONDS_FILE)
    os.chmod(out / CONDS_FILE, 0o644)
    if version == "multilingual":
        _write_multilingual(out, ve, s3gen, gen, dtype)
    log.info("wrote tiny Chatterbox checkpoint to %s (%d T3 + %d S3Gen + %d voice-encoder parameters)", out,
             sum(p.numel() for p in t3.parameters()), sum(p.numel() for p in s3gen.parameters()),
             sum(p.numel() for p in ve.parameters()))
    return out
