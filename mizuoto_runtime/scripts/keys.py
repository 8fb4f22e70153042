"""What decides an engine's output, as keys for the caches of spoken lines and prompted voices.

An engine's output depends on its weights (a fingerprint of its checkpoint), the precision and
the kind of device it runs in (float32 on CPU and on CUDA give different bits), and the
request's inputs. The fingerprint reads file names, sizes and modification times, never the
weights: a rewritten checkpoint file changes it, reading one does not.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..audio import Audio
from .syntax import ScriptError

if TYPE_CHECKING:
    from ..engines.base import Engine


def checkpoint_fingerprint(model_dir: Path | None) -> str:
    """A digest of a checkpoint folder's (or file's) files: relative path, size, mtime in ns.
    None (an engine's built-in weights): "builtin"."""
    if model_dir is None:
        return "builtin"
    model_dir = Path(model_dir)
    if not model_dir.exists():
        raise ScriptError(f"checkpoint not found: {model_dir}")
    files = [model_dir] if model_dir.is_file() else sorted(p for p in model_dir.rglob("*") if p.is_file())
    h = hashlib.sha256(b"file\n" if model_dir.is_file() else b"folder\n")
    for path in files:
        stat = path.stat()
        name = path.name if path == model_dir else path.relative_to(model_dir).as_posix()
        h.update(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return h.hexdigest()[:20]


def engine_identity(engine: Engine) -> dict[str, str]:
    """What of an engine decides its outputs: its id, its checkpoint, its precision and its
    device kind."""
    return {"engine": engine.id, "checkpoint": checkpoint_fingerprint(engine.model_dir),
            "dtype": str(engine.dtype).removeprefix("torch."), "device": engine.device.type}


def canonical(value: Any, name: str = "option") -> Any:
    """`value` as plain JSON data that is equal exactly when the values are: tensors and audio
    by their bytes' digest. Anything else is refused, naming it (a key must not guess)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        return {"tensor": str(data.dtype), "shape": list(data.shape), "sha256": _digest(data)}
    if isinstance(value, Audio):
        return {"audio": value.sample_rate, **canonical(value.waveform, name)}
    if isinstance(value, (list, tuple)):
        return [canonical(v, f"{name}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise ScriptError(f"{name}: keys must be strings, got {sorted(map(repr, value))}")
        return {k: canonical(v, f"{name}.{k}") for k, v in sorted(value.items())}
    raise ScriptError(f"{name}: a {type(value).__name__} cannot be part of a cache key")


def canonical_json(value: Any, name: str = "options") -> str:
    return json.dumps(canonical(value, name), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(data: torch.Tensor) -> str:
    """Of the raw bytes (any dtype, bfloat16 too, which numpy cannot hold)."""
    return hashlib.sha256(data.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
