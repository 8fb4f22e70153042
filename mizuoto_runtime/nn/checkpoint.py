"""The safe reader of torch checkpoint files: ``torch.load(weights_only=True, mmap=True)``
(no pickled object is ever constructed), unwrapping the containers trainers save around a
state_dict, with one clear error naming the file when it is not a tensor dict."""
from __future__ import annotations

import pickle
import zipfile
from collections.abc import Sequence
from pathlib import Path

import torch

from ..errors import CheckpointError

__all__ = ["CheckpointError", "load_state_dict"]


def load_state_dict(path: str | Path, *, wrappers: Sequence[str] = ("state_dict", "model", "net"),
                    strip_prefixes: Sequence[str] = (), mmap: bool = True) -> dict[str, torch.Tensor]:
    """The tensors of `path`.

    `wrappers`: keys of a dict around the state_dict (the first present is taken when the top
    level holds no tensor). `strip_prefixes`: prefixes removed from every key that has one
    (``generator.``). Non-tensor entries of the state_dict (a training step count) are dropped."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file not found: {path}")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (pickle.UnpicklingError, RuntimeError, zipfile.BadZipFile, EOFError) as exc:
        if mmap and "mmap" in str(exc):  # a legacy (non-zip) file cannot be memory-mapped
            return load_state_dict(path, wrappers=wrappers, strip_prefixes=strip_prefixes, mmap=False)
        raise CheckpointError(f"{path}: not a weights-only torch checkpoint ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a dict of tensors, got {type(data).__name__}")
    if not any(isinstance(v, torch.Tensor) for v in data.values()):
        for key in wrappers:
            if isinstance(data.get(key), dict):
                data = data[key]
                break
    tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise CheckpointError(f"{path}: holds no tensors (top-level keys: {sorted(data)[:8]})")
    for prefix in strip_prefixes:
        tensors = {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in tensors.items()}
    return tensors
