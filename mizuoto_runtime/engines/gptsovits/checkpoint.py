"""GPT-SoVITS's checkpoints: where the files are, reading them safely and building the modules
from them.

**Layout.** Where GPT-SoVITS's files are, as users have them.

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

**Reading.** Reading GPT-SoVITS weight files as users have them (M27), never unpickling arbitrary objects.

* GPT (T2S) ``.ckpt``: a torch zip of ``{"weight": {"model.<name>": fp16}, "config": dict,
  "info": str}`` — plain types, so ``torch.load(weights_only=True)`` reads it as is.
* SoVITS ``.pth``: ``{"weight": fp16 state (no ``enc_q``), "config": utils.HParams, "info": str}``.
  ``config`` is a pickled ``utils.HParams`` object (upstream's attribute dict); it is rebuilt as
  `HParamsStandIn`, the one class allow-listed under that name, and turned into plain dicts.
  Newer versions overwrite the zip's first two bytes ``PK`` with a version tag (``05`` v2Pro,
  ``06`` v2ProPlus; ``02``–``04`` v3/v4): the bytes are put back in memory, never on disk.
* The version is told apart as upstream does: the published pretrained files by the MD5 of their
  first 8192 bytes, tagged files by their tag, and an untagged zip by its phoneme table
  (``enc_p.text_embedding`` rows: 732 = v2, 322 = v1).

Any other file, a truncated one, or one whose pickle names another global is one
`CheckpointError` naming the file, and nothing is loaded.

**Building.** Building GPT-SoVITS's modules from their weight files: each module's sizes come from the file's
own config (the T2S ``config["model"]``, the SoVITS ``hps``, the speaker model's tensors), and its
tensors are checked against them, every mismatch one `CheckpointError` naming file and tensor.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import CheckpointError
from ...nn import weight_norm
from ...nn.checkpoint import load_weights_only
from ...nn.loading import reading_weights
from .config import T2SConfig, VitsConfig, config_for
from .sv import ERes2NetV2
from .t2s import Text2Semantic, load_state
from .vits import Synthesizer

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


# ---- reading the weight files ---------------------------------------------------------------
ZIP_MAGIC = b"PK"
SUPPORTED_TAGS = {b"05": "v2Pro", b"06": "v2ProPlus"}
UNSUPPORTED_TAGS = {b"00": "v1", b"01": "v2 (tagged)", b"02": "v3", b"03": "v3 LoRA", b"04": "v4 LoRA"}
# MD5 of the first 8192 bytes of upstream's published SoVITS files (lj1995/GPT-SoVITS).
PRETRAINED_MD5 = {
    "6642b37f3dbb1f76882b69937c95a5f3": "v2",  # gsv-v2final-pretrained/s2G2333k.pth
    "c7e9fce2223f3db685cdfa1e6368728a": "v2Pro",  # v2Pro/s2Gv2Pro.pth
    "66b313e39455b57ab1b0bc0b239c9d0a": "v2ProPlus",  # v2Pro/s2Gv2ProPlus.pth
    "dc3c97e17592963677a4a1681f30c653": "v1",  # s2G488k.pth
    "43797be674a37c1c83ee81081941ed0f": "v3",  # s2Gv3.pth
    "4f26b9476d0c5033e04162c486074374": "v4",  # gsv-v4-pretrained/s2Gv4.pth
}
SUPPORTED = ("v2", "v2Pro", "v2ProPlus")
# Training-only quantizer state (EMA statistics): in every file, never read at inference.
TRAINING_ONLY = ("_codebook.inited", "_codebook.cluster_size", "_codebook.embed_avg")


class HParamsStandIn:
    """Stands in for upstream's ``utils.HParams`` (an attribute dict) while a ``.pth`` is read."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


def _plain(value: Any) -> Any:
    if isinstance(value, HParamsStandIn):
        return {k: _plain(v) for k, v in vars(value).items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclasses.dataclass
class GptFile:
    path: Path
    weights: dict[str, torch.Tensor]
    config: dict[str, Any]
    info: str


@dataclasses.dataclass
class SovitsFile:
    path: Path
    weights: dict[str, torch.Tensor]  # weight norm folded, training-only buffers dropped
    model: dict[str, Any]  # hps.model
    data: dict[str, Any]  # hps.data
    version: str  # "v2", "v2Pro" or "v2ProPlus"
    info: str


def _as_dict(obj: Any, path: Path, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict) or not isinstance(obj.get("weight"), dict) or "config" not in obj:
        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise CheckpointError(f"{path}: not a GPT-SoVITS {what} file (expected a dict with 'weight' and "
                              f"'config', found {keys})")
    return obj


def read_gpt(path: Path) -> GptFile:
    """A T2S ``.ckpt`` (pretrained ``s1*.ckpt`` or a user's ``GPT_weights*/name-eN.ckpt``)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GPT (.ckpt) file")
    obj = _as_dict(load_weights_only(path), path, "GPT (.ckpt)")
    config = obj["config"]
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise CheckpointError(f"{path}: its 'config' has no 'model' section")
    return GptFile(path, obj["weight"], config, str(obj.get("info", "")))


def sovits_version_hint(path: Path) -> tuple[bytes, str | None]:
    """The file's opening bytes and the version they name (a pretrained file's MD5 or a tag);
    None for an untagged zip (told apart later by its phoneme table)."""
    with open(path, "rb") as f:
        head = f.read(8192)
    known = PRETRAINED_MD5.get(hashlib.md5(head).hexdigest())
    if known is not None:
        return head[:2], known
    tag = head[:2]
    if tag == ZIP_MAGIC:
        return tag, None
    if tag in SUPPORTED_TAGS:
        return tag, SUPPORTED_TAGS[tag]
    if tag in UNSUPPORTED_TAGS:
        return tag, UNSUPPORTED_TAGS[tag]
    raise CheckpointError(f"{path}: not a GPT-SoVITS SoVITS (.pth) file: it starts with {tag!r}, "
                          f"neither a torch zip (b'PK') nor a GPT-SoVITS version tag")


def read_sovits(path: Path) -> SovitsFile:
    """A SoVITS ``.pth`` (pretrained ``s2G*.pth`` or a user's ``SoVITS_weights*/name_eN_sM.pth``)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such SoVITS (.pth) file")
    tag, version = sovits_version_hint(path)
    if version is not None and version not in SUPPORTED:
        raise CheckpointError(f"{path}: a GPT-SoVITS {version} SoVITS file; only v2, v2Pro and v2ProPlus are supported")
    allow = [(HParamsStandIn, "utils.HParams")]
    if tag == ZIP_MAGIC:
        obj = load_weights_only(path, allow=allow)
    else:  # the tag replaced the zip's magic: restore it in memory
        obj = load_weights_only(path, source=io.BytesIO(ZIP_MAGIC + path.read_bytes()[2:]), allow=allow)
    obj = _as_dict(obj, path, "SoVITS (.pth)")
    hps = _plain(obj["config"])
    if not isinstance(hps, dict) or not isinstance(hps.get("model"), dict) or not isinstance(hps.get("data"), dict):
        raise CheckpointError(f"{path}: its 'config' has no 'model' and 'data' sections")
    weights = obj["weight"]
    embedding = weights.get("enc_p.text_embedding.weight")
    if embedding is None:
        raise CheckpointError(f"{path}: has no enc_p.text_embedding (a v3/v4 SoVITS); only v2, v2Pro and v2ProPlus "
                              f"are supported")
    if embedding.shape[0] != 732:
        raise CheckpointError(f"{path}: its phoneme table has {embedding.shape[0]} rows (v1 has 322, v2 732); "
                              f"only v2, v2Pro and v2ProPlus are supported")
    return SovitsFile(path, fold_legacy_weight_norm(weights, path), hps["model"], hps["data"], version or "v2",
                      str(obj.get("info", "")))


def fold_legacy_weight_norm(state: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """``X.weight_g`` / ``X.weight_v`` → ``X.weight`` (`nn.weight_norm`), folded in float32 as
    upstream's fp32 model computes it each forward; training-only quantizer buffers left out."""
    kept = {k: (v.float() if k.endswith(weight_norm.LEGACY) else v) for k, v in state.items()
            if not k.endswith(TRAINING_ONLY)}
    try:
        return weight_norm.fold_state_dict(kept)
    except KeyError as exc:
        raise CheckpointError(f"{path}: {exc.args[0]}") from None


# ---- building the modules --------------------------------------------------------------------
def build_t2s(gpt: GptFile, dtype: torch.dtype = torch.float32) -> Text2Semantic:
    try:
        model = Text2Semantic(T2SConfig.from_checkpoint(gpt.config["model"], str(gpt.path)))
        if reading_weights():  # a shapes-only build (engines.published) reads the config alone
            load_state(model, gpt.weights, str(gpt.path))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    return model.to(dtype).eval()


def vits_config(sovits: SovitsFile) -> VitsConfig:
    try:
        sv = sovits.weights.get("sv_emb.weight")
        return VitsConfig.from_hparams(sovits.model, sovits.data, sovits.version, str(sovits.path),
                                       sv.shape[1] if sv is not None else 20480)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(str(exc)) from None


def build_vits(sovits: SovitsFile, dtype: torch.dtype = torch.float32) -> Synthesizer:
    model = Synthesizer(vits_config(sovits))
    if reading_weights():  # a shapes-only build (engines.published) reads the config alone
        fill_strict(model, sovits.weights, sovits.path)
    return model.to(dtype).eval()


def fill_strict(model: nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """``load_state_dict(strict=True)`` with one error naming the file and the first tensors at fault."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [f"{k} {tuple(state[k].shape)} (expected {tuple(t.shape)})" for k, t in expected.items()
             if k in state and state[k].shape != t.shape]
    if missing or unexpected or wrong:
        parts = [f"missing {', '.join(missing[:4])}" if missing else "",
                 f"unexpected {', '.join(unexpected[:4])}" if unexpected else "",
                 f"wrong shape {', '.join(wrong[:3])}" if wrong else ""]
        raise CheckpointError(f"{path}: tensors do not match the model its config describes: "
                              + "; ".join(p for p in parts if p))
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)


def read_sv_state(path: Path) -> dict[str, torch.Tensor]:
    """The speaker model's plain state dict (``sv/pretrained_eres2netv2w24s4ep4.ckpt``)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such speaker-verification (ERes2NetV2) file")
    state = load_weights_only(path)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: not an ERes2NetV2 state dict")
    return state


def build_sv(state: dict[str, torch.Tensor], path: Path, dtype: torch.dtype = torch.float32) -> ERes2NetV2:
    try:
        model = ERes2NetV2(config_for(state, str(path)))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    fill_strict(model, state, path)
    return model.to(dtype).eval()
