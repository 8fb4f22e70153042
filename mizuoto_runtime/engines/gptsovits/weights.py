"""Reading GPT-SoVITS weight files as users have them (M27), never unpickling arbitrary objects.

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
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
from pathlib import Path
from typing import Any

import torch

from ...errors import CheckpointError
from ...nn import weight_norm
from ...nn.checkpoint import load_weights_only

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
