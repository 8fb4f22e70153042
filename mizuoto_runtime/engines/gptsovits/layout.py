"""Where GPT-SoVITS's files are, as users have them.

A voice is a pair of weight files: a GPT (T2S) ``.ckpt`` and a SoVITS ``.pth``. Users have them as

* upstream's pretrained base folders (``GPT_SoVITS/pretrained_models/``):
  ``gsv-v2final-pretrained/`` holds the v2 pair (``s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt``,
  ``s2G2333k.pth``); ``v2Pro/`` holds ``s2Gv2Pro.pth`` and ``s2Gv2ProPlus.pth`` whose GPT is
  ``s1v3.ckpt`` one folder up;
* a fine-tuned pair, ``GPT_weights_v2*/<name>-e<N>.ckpt`` beside ``SoVITS_weights_v2*/<name>_e<N>_s<M>.pth``;
* or any folder holding one ``.ckpt`` and one ``.pth``.

The feature models are folders of their own, looked for beside the pair and up to two levels
above it (as ``pretrained_models/`` holds them): ``chinese-hubert-base/`` (transformers
HubertModel) and ``sv/pretrained_eres2netv2w24s4ep4.ckpt`` (v2Pro's speaker model).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ...errors import CheckpointError

HUBERT_FOLDER = "chinese-hubert-base"
SV_FILE = "sv/pretrained_eres2netv2w24s4ep4.ckpt"
PRO_GPT = "s1v3.ckpt"


@dataclasses.dataclass(frozen=True)
class VoicePair:
    gpt: Path
    sovits: Path

    @property
    def label(self) -> str:
        return f"{self.gpt.stem} + {self.sovits.stem}"


def _single(folder: Path, pattern: str) -> Path | None:
    found = sorted(p for p in folder.glob(pattern) if p.is_file())
    return found[0] if len(found) == 1 else None


def pair_in(folder: Path) -> VoicePair | None:
    """The one ``.ckpt`` + ``.pth`` pair of `folder` (a v2Pro base folder's GPT one level up);
    None when it holds no such pair."""
    sovits = _single(folder, "*.pth")
    if sovits is None:
        return None
    gpt = _single(folder, "*.ckpt")
    if gpt is None and (folder.parent / PRO_GPT).is_file():
        gpt = folder.parent / PRO_GPT
    return VoicePair(gpt, sovits) if gpt is not None else None


def require_pair(folder: Path) -> VoicePair:
    pair = pair_in(folder)
    if pair is None:
        raise CheckpointError(f"{folder}: expected one GPT-SoVITS GPT file (*.ckpt) and one SoVITS file (*.pth)")
    return pair


def find_aux(start: Path, relative: str) -> Path | None:
    """`relative` in `start` or up to two folders above it."""
    for folder in (start, start.parent, start.parent.parent):
        if (folder / relative).exists():
            return folder / relative
    return None
