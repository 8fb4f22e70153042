"""The safe reader of torch checkpoint files: ``torch.load(weights_only=True, mmap=True)``
(no pickled object is ever constructed), unwrapping the containers trainers save around a
state_dict, with one clear error naming the file when it is not a tensor dict."""
from __future__ import annotations

import os
import pickle
import re
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import torch

from ..errors import CheckpointError

__all__ = ["CheckpointError", "load_state_dict", "load_weights_only", "save_whole"]

# PyTorch's weights-only unpickler names the class it refused as "GLOBAL module.Name"
_REFUSED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def _refused(path: Path, exc: pickle.UnpicklingError) -> CheckpointError:
    """The error for a pickle the weights-only reader refused. PyTorch's own message advises
    loading with the safety off; ours says what the file holds and what to do instead."""
    named = _REFUSED_GLOBAL.search(str(exc))
    holds = f"a pickled {named.group(1)}" if named else "a pickled object"
    return CheckpointError(
        f"{path}: refused to load: it holds {holds}, which is not a tensor or a plain value. Only weights "
        "are read from torch files, so that opening one never runs code from it. Get the file from its "
        "publisher as weights (a .safetensors file or a state dict of tensors), or convert it to one.")


def load_weights_only(path: Path, *, source: IO[bytes] | None = None, mmap: bool = False,
                      allow: Sequence[Any] = ()) -> Any:
    """``torch.load(weights_only=True)`` of `path` (or of `source`, that file's bytes prepared
    by the caller), on the CPU: the one place the pack loads a torch file. `allow`: classes the
    file may also hold (``torch.serialization.safe_globals``). `mmap`: memory-map it, falling
    back to reading a legacy (non-zip) file, which cannot be mapped. Raises CheckpointError
    naming the file: for a refused pickle (what it holds, what to do) or an unreadable file."""
    try:
        with torch.serialization.safe_globals(list(allow)):
            return torch.load(path if source is None else source, map_location="cpu", weights_only=True,
                              mmap=mmap and source is None)
    except pickle.UnpicklingError as exc:
        raise _refused(path, exc) from None
    except (RuntimeError, ValueError, EOFError, OSError, zipfile.BadZipFile) as exc:
        if mmap and "mmap" in str(exc):
            return load_weights_only(path, source=source, allow=allow)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: cannot be read as a torch checkpoint, truncated or damaged ({first})") from exc


def load_state_dict(path: str | Path, *, wrappers: Sequence[str] = ("state_dict", "model", "net"),
                    strip_prefixes: Sequence[str] = (), mmap: bool = True) -> dict[str, torch.Tensor]:
    """The tensors of `path`.

    `wrappers`: keys of a dict around the state_dict (the first present is taken when the top
    level holds no tensor). `strip_prefixes`: prefixes removed from every key that has one
    (``generator.``). Non-tensor entries of the state_dict (a training step count) are dropped."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file not found: {path}")
    data = load_weights_only(path, mmap=mmap)
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


def save_whole(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """`tensors` as a safetensors file at `path`, written whole or not at all (a temporary file
    beside it, then renamed): a reader never sees half a file."""
    from safetensors.torch import save_file

    fd, temp = tempfile.mkstemp(dir=path.parent, suffix=".partial")
    os.close(fd)
    try:
        save_file(tensors, temp, metadata=metadata)
        os.replace(temp, path)
    finally:
        Path(temp).unlink(missing_ok=True)
