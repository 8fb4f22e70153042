"""Tiny random Chatterbox checkpoints in the published layout, for tests and demos (issue 34).

`write(dir)` writes the files of ``ResembleAI/chatterbox`` (English)::

    ve.safetensors  t3_cfg.safetensors  s3gen.safetensors  tokenizer.json  conds.pt

through the package's own classes (`checkpoint.build_t3`, `build_s3gen`, ``VoiceEncoder``) at
`TINY` sizes — the published file layout and tensor names, so upstream's ``load_state_dict``
takes them — with weights drawn from a seeded generator (byte-identical files on every run).
T3's Llama is 128 wide with 2 layers, each a 1.8 MB unit in float32 (so half-way placements
keep one and stream the other); its vocabularies and position tables keep the published
sizes (704 text, 8194 speech tokens). The voice encoder, CAM++ and the flow encoder's width
(512, which upstream hard-codes) keep theirs. ``tokenizer.json`` is one token per character
with Chatterbox's special tokens (``[STOP]`` = 0, ``[START]`` = 255, as T3Config expects);
``conds.pt`` is the built-in voice, the conditionals of a seeded synthetic reference, saved as
upstream's ``Conditionals.save`` does (tensors only).
"""
from __future__ import annotations

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
from ..tiny import fan_in_std, one_version
from .checkpoint import (
    CONDS_FILE,
    S3GEN_FILE,
    T3_FILE,
    TOKENIZER_FILE,
    VE_FILE,
    Sizes,
    build_s3gen,
    build_t3,
    import_upstream,
)
from .conditioning import conditionals

log = logging.getLogger(__name__)

TINY = Sizes(t3_hidden=128, t3_layers=2, t3_intermediate=1024, t3_heads=2, t3_kv_heads=2, tokenizer_width=128,
             tokenizer_layers=1, flow_blocks=1, flow_units=256, estimator_channels=64, estimator_blocks=1,
             estimator_mid_blocks=1, estimator_heads=1, hift_channels=64, f0_channels=64)
SPECIAL = {"[STOP]": 0, "[START]": 255, "[UNK]": 1, "[SPACE]": 2, "[PAD]": 3, "[SEP]": 4, "[CLS]": 5, "[MASK]": 6}
S3GEN_COMPUTED = ("tokenizer._mel_filters", "tokenizer.window")  # not in the published file


def text_tokenizer() -> object:
    """One token per printable ASCII character, and Chatterbox's special tokens."""
    from tokenizers import AddedToken, Tokenizer, models

    chars = [c for c in string.printable if c not in string.whitespace]
    vocab = dict(SPECIAL)
    for c in chars:
        vocab[c] = len(vocab) + (1 if len(vocab) + 7 >= 255 else 7)  # keep 0-6 and 255 for the specials
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL])
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


def write(directory: str | Path, *, version: str | None = None, seed: int = 0,
          dtype: torch.dtype | None = None) -> Path:
    """Write a tiny random Chatterbox folder; `dtype` is that of ``t3_cfg.safetensors`` (None:
    float32; S3Gen and the voice encoder are float32, as published)."""
    one_version(version)
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
    log.info("wrote tiny Chatterbox checkpoint to %s (%d T3 + %d S3Gen + %d voice-encoder parameters)", out,
             sum(p.numel() for p in t3.parameters()), sum(p.numel() for p in s3gen.parameters()),
             sum(p.numel() for p in ve.parameters()))
    return out
