"""Where GPT-SoVITS's files are, as users have them.

A voice is a pair of weight files: a GPT (T2S) ``.ckpt`` and a SoVITS ``.pth``. Users have them as

* upstream's pretrained base folders (``GPT_SoVITS/pretrained_models/``):
  ``gsv-v2final-pretrained/`` holds the v2 pair (``s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt``,
  ``s2G2333k.pth``, beside the discriminator ``s2D2333k.pth``, which is never a voice);
  ``v2Pro/`` holds ``s2Gv2Pro.pth`` and ``s2Gv2ProPlus.pth`` whose GPT is ``s1v3.ckpt`` one
  folder up;
* a fine-tuned pair, ``GPT_weights_v2*/<name>-e<N>.ckpt`` beside ``SoVITS_weights_v2*/<name>_e<N>_s<M>.pth``;
* or any folder holding one ``.ckpt`` and one ``.pth``.

A checkpoint choice is a folder with one pair, or a ``.pth`` file (`voice_files`: a folder of
several, such as ``v2Pro/`` or ``SoVITS_weights_v2/``); a ``.pth``'s GPT is the one ``.ckpt``
beside it, else ``s1v3.ckpt`` one folder up, else the latest epoch of the same experiment
name in a sibling ``GPT_weights*/`` folder (`pair_for`).

The feature models are folders of their own, looked for beside the pair and up to two levels
above it, there or in a ``pretrained_models/`` (`find_aux`): ``chinese-hubert-base/`` (transformers
HubertModel) and ``sv/pretrained_eres2netv2w24s4ep4.ckpt`` (v2Pro's speaker model).
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ...errors import CheckpointError

HUBERT_FOLDER = "chinese-hubert-base"
SV_FILE = "sv/pretrained_eres2netv2w24s4ep4.ckpt"
PRO_GPT = "s1v3.ckpt"
DISCRIMINATOR = "s2D"


@dataclasses.dataclass(frozen=True)
class VoicePair:
    gpt: Path
    sovits: Path

    @property
    def label(self) -> str:
        return f"{self.gpt.stem} + {self.sovits.stem}"


def _files(folder: Path, pattern: str) -> list[Path]:
    """The files of `folder` matching `pattern`, without the discriminators (``s2D*.pth``) the
    pretrained folders ship beside their generators: training weights, never a voice."""
    return sorted(p for p in folder.glob(pattern) if p.is_file() and not p.name.startswith(DISCRIMINATOR))


def _single(folder: Path, pattern: str) -> Path | None:
    found = _files(folder, pattern)
    return found[0] if len(found) == 1 else None


def _experiment(path: Path) -> str:
    """The experiment name a fine-tuned file carries: ``name`` of ``name_e8_s16.pth`` or ``name-e15.ckpt``."""
    return re.sub(r"(_e\d+_s\d+|-e\d+)$", "", path.stem)


def _epoch(path: Path) -> int:
    found = re.search(r"[-_]e(\d+)", path.stem)
    return int(found.group(1)) if found else -1


def pair_for(sovits: Path) -> VoicePair | None:
    """The GPT file that goes with the SoVITS file `sovits` (see the module doc); None when none does."""
    folder = sovits.parent
    gpt = _single(folder, "*.ckpt")
    if gpt is None and (folder.parent / PRO_GPT).is_file():
        gpt = folder.parent / PRO_GPT
    if gpt is None:
        name = _experiment(sovits)
        fine_tuned = [p for d in folder.parent.glob("GPT_weights*") if d.is_dir() for p in d.glob("*.ckpt")
                      if _experiment(p) == name]
        gpt = max(fine_tuned, key=lambda p: (_epoch(p), p.name), default=None)
    return VoicePair(gpt, sovits) if gpt is not None else None


def pair_in(place: Path) -> VoicePair | None:
    """The pair a choice names: a ``.pth`` file's (`pair_for`), or a folder's one ``.pth``'s;
    None when there is no such pair."""
    if place.is_file():
        return pair_for(place) if place.suffix == ".pth" and not place.name.startswith(DISCRIMINATOR) else None
    sovits = _single(place, "*.pth")
    return pair_for(sovits) if sovits is not None else None


def voice_files(folder: Path) -> list[Path]:
    """The ``.pth`` files of a folder of several, each a choice of its own."""
    found = _files(folder, "*.pth")
    return found if len(found) > 1 else []


def require_pair(place: Path) -> VoicePair:
    pair = pair_in(place)
    if pair is None:
        raise CheckpointError(f"{place}: expected a GPT-SoVITS SoVITS file (*.pth) with its GPT file (*.ckpt) beside "
                              "it, or a folder with one of each")
    return pair


PRETRAINED = ("", "pretrained_models", "GPT_SoVITS/pretrained_models")


def find_aux(start: Path, relative: str) -> Path | None:
    """`relative` in `start` or up to two folders above it, directly or in a ``pretrained_models/``
    (or an install's ``GPT_SoVITS/pretrained_models/``) there."""
    for folder in (start, start.parent, start.parent.parent):
        for sub in PRETRAINED:
            if (folder / sub / relative).exists():
                return folder / sub / relative
    return None
