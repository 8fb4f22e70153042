"""Prompted voices kept on disk, and what decides an engine's output as cache keys.

The prompt store: what an engine's voice-prompt phase returns (`Engine.encode_voice`), kept as
safetensors files so that after a restart the voice-prompt models are not placed again (M4). A
cacheable prompt is a dict whose values are tensors, JSON values (None, bool, int, float, str)
or lists, tuples and str-keyed dicts of those; tensors are stored as safetensors tensors, the
rest as JSON in the file's metadata: never pickled. An entry is keyed by the engine, its
checkpoint fingerprint, precision and device kind, the reference audio's digest, the
transcript and the options (speaker, instruction, the engine's voice options). The store is
bounded in bytes, the least recently used entries dropped first; an entry that cannot be read
back is dropped with one log line.

The keys: an engine's output depends on its weights (a fingerprint of its checkpoint), the
precision and the kind of device it runs in (float32 on CPU and on CUDA give different bits),
and the request's inputs. The fingerprint reads file names, sizes and modification times, never
the weights: a rewritten checkpoint file changes it, reading one does not. The application's
caches of spoken lines key on the same (`app.scripts.segments`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from ..audio import Audio
from ..errors import MizuotoError
from ..nn.checkpoint import save_whole

log = logging.getLogger(__name__)

PROMPT_FORMAT = "mizuoto-voice-prompt/1"
STORE_BYTES = 2 * 1024**3


class Engine(Protocol):
    """What decides an engine's outputs besides its inputs (an `engines.base.Engine`, which keeps
    its voices here: a protocol, so no import cycle forms)."""

    @property
    def id(self) -> str: ...

    @property
    def model_dir(self) -> Path | None: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def device(self) -> torch.device: ...


class VoiceError(MizuotoError, ValueError):
    """A voice that cannot be listed, read, saved or kept; the message names the file or voice."""


def checkpoint_fingerprint(model_dir: Path | None) -> str:
    """A digest of a checkpoint folder's (or file's) files: relative path, size, mtime in ns.
    None (an engine's built-in weights): "builtin"."""
    if model_dir is None:
        return "builtin"
    model_dir = Path(model_dir)
    if not model_dir.exists():
        raise VoiceError(f"checkpoint not found: {model_dir}")
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
            raise VoiceError(f"{name}: keys must be strings, got {sorted(map(repr, value))}")
        return {k: canonical(v, f"{name}.{k}") for k, v in sorted(value.items())}
    raise VoiceError(f"{name}: a {type(value).__name__} cannot be part of a cache key")


def canonical_json(value: Any, name: str = "options") -> str:
    return json.dumps(canonical(value, name), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(data: torch.Tensor) -> str:
    """Of the raw bytes (any dtype, bfloat16 too, which numpy cannot hold)."""
    return hashlib.sha256(data.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


# ---- the prompt store ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PromptKey:
    engine: str
    checkpoint: str
    dtype: str
    device: str
    audio: str  # canonical JSON of the reference (sample rate, dtype, shape, digest), "null" without one
    transcript: str | None
    options: str  # canonical JSON of speaker, instruct and the engine's voice options

    def text(self) -> str:
        return canonical_json(dataclasses.asdict(self), "key")

    def digest(self) -> str:
        return hashlib.sha256(self.text().encode()).hexdigest()[:32]


def prompt_key(engine: Engine, reference: Audio | None, transcript: str | None, speaker: str | None = None,
               instruct: str | None = None, options: Mapping[str, Any] | None = None) -> PromptKey:
    return PromptKey(**engine_identity(engine), audio=canonical_json(reference, "reference"), transcript=transcript,
                     options=canonical_json({"speaker": speaker, "instruct": instruct, **dict(options or {})}))


class VoicePromptStore:
    """Prompted voices in `folder`, at most `max_bytes` of files."""

    def __init__(self, folder: str | Path, max_bytes: int = STORE_BYTES) -> None:
        if max_bytes < 1:
            raise VoiceError(f"the voice-prompt store keeps at least one byte, not {max_bytes}")
        self.folder = Path(folder)
        self.max_bytes = max_bytes

    def path(self, key: PromptKey) -> Path:
        return self.folder / f"{key.digest()}.safetensors"

    def load(self, key: PromptKey) -> dict[str, Any] | None:
        """The prompt kept under `key`, or None. Reading an entry makes it the newest."""
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            tensors = load_file(path)
            meta = _metadata(path)
            if meta.get("format") != PROMPT_FORMAT or meta.get("key") != key.text():
                raise ValueError("written for another key or format")
            data = _rebuild(json.loads(meta["structure"]), tensors)
        except (SafetensorError, OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("Mizuoto: dropped a damaged voice-prompt cache entry %s (%s)", path, exc)
            path.unlink(missing_ok=True)
            return None
        self._touch(path)
        return data

    def save(self, key: PromptKey, data: Mapping[str, Any]) -> Path:
        """Keep `data` under `key` (written whole or not at all), then drop the oldest entries
        past the bound. Data that cannot be kept without pickling is refused, naming the entry."""
        tensors: dict[str, torch.Tensor] = {}
        structure = _flatten(dict(data), "prompt", tensors)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        meta = {"format": PROMPT_FORMAT, "key": key.text(), "structure": json.dumps(structure)}
        save_whole(path, tensors, meta)
        self._touch(path)
        self._bound(keep=path)
        return path

    def get_or_encode(self, key: PromptKey, encode: Callable[[], Mapping[str, Any]]) -> dict[str, Any]:
        """The prompt kept under `key`, else `encode()`'s, kept for next time when it can be
        (what an engine's voice-prompt phase calls around `encode_voice`; a prompt holding an
        object the store would have to pickle is used, not kept)."""
        data = self.load(key)
        if data is not None:
            return data
        data = dict(encode())
        try:
            self.save(key, data)
        except VoiceError as exc:
            log.debug("Mizuoto: %s's voice prompt is not kept on disk (%s)", key.engine, exc)
        return data

    def entries(self) -> list[Path]:
        """The kept entries, least recently used first."""
        if not self.folder.is_dir():
            return []
        return sorted(self.folder.glob("*.safetensors"), key=lambda p: (p.stat().st_mtime_ns, p.name))

    def _touch(self, path: Path) -> None:
        """Make `path` the most recently used: its mtime after every other entry's, even where
        the file system's clock is coarser than two uses in a row."""
        newest = max((p.stat().st_mtime_ns for p in self.entries() if p != path), default=0)
        now = max(time.time_ns(), newest + 1)
        os.utime(path, ns=(now, now))

    def _bound(self, keep: Path) -> None:
        entries = self.entries()
        total = sum(p.stat().st_size for p in entries)
        for old in entries:
            if total <= self.max_bytes:
                break
            if old != keep:  # the entry just written stays, even alone past the bound
                total -= old.stat().st_size
                old.unlink(missing_ok=True)
                log.debug("Mizuoto: voice-prompt store past %d bytes, dropped %s", self.max_bytes, old.name)


def _metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), "pt") as f:
        return f.metadata() or {}


_TENSOR, _TUPLE = "__tensor__", "__tuple__"


def _flatten(value: Any, where: str, tensors: dict[str, torch.Tensor]) -> Any:
    """`value` as JSON with each tensor replaced by {"__tensor__": its name in `tensors`}."""
    if isinstance(value, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = value.detach().cpu().contiguous().clone()
        return {_TENSOR: name}
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value) or _TENSOR in value or _TUPLE in value:
            raise VoiceError(f"{where}: a voice prompt's dicts need string keys other than {_TENSOR}, {_TUPLE}")
        return {k: _flatten(v, f"{where}.{k}", tensors) for k, v in value.items()}
    if isinstance(value, tuple):
        return {_TUPLE: [_flatten(v, f"{where}[{i}]", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_flatten(v, f"{where}[{i}]", tensors) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value  # Python's JSON writes and reads floats exactly, NaN and infinities too
    raise VoiceError(f"{where}: a {type(value).__name__} cannot be kept in a voice prompt (tensors, numbers, "
                     "strings, lists and dicts only; never pickled)")


def _rebuild(value: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(value, dict):
        if set(value) == {_TENSOR}:
            return tensors[value[_TENSOR]]
        if set(value) == {_TUPLE}:
            return tuple(_rebuild(v, tensors) for v in value[_TUPLE])
        return {k: _rebuild(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_rebuild(v, tensors) for v in value]
    return value


def cacheable(data: Mapping[str, Any]) -> bool:
    """Whether `data` is a voice prompt the store can keep (no object it would have to pickle)."""
    try:
        _flatten(dict(data), "prompt", {})
    except VoiceError:
        return False
    return True

