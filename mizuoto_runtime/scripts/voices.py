"""Voices kept by name: a library folder of references, and prompted voices kept on disk.

The library: ``NAME.wav`` (or any format `training.dataset.load_audio` reads: ``.flac`` and
``.ogg`` where soundfile is installed) with ``NAME.txt`` holding its transcript
(TTS-Audio-Suite's ``NAME.reference.txt`` is read too). Subfolders organise voices; a voice's
name is its path below the library folder without the suffix (``characters/alice``). Several
folders may serve one library (ComfyUI's ``extra_model_paths.yaml``): the first holding a name
wins, and `save` writes into the first.

The prompt store: what an engine's voice-prompt phase returns (`Engine.encode_voice`), kept as
safetensors files so that after a restart the voice-prompt models are not placed again. A
cacheable prompt is a dict whose values are tensors, JSON values (None, bool, int, float, str)
or lists, tuples and str-keyed dicts of those; tensors are stored as safetensors tensors, the
rest as JSON in the file's metadata: never pickled. An entry is keyed by the engine, its
checkpoint fingerprint, precision and device kind, the reference audio's digest, the
transcript and the options (speaker, instruction, the engine's voice options). The store is
bounded in bytes, the least recently used entries dropped first; an entry that cannot be read
back is dropped with one log line.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from ..audio import Audio, write_wav
from ..training.dataset import AUDIO_SUFFIXES, load_audio
from .keys import canonical_json, engine_identity
from .syntax import ScriptError

if TYPE_CHECKING:
    from ..engines.base import Engine

log = logging.getLogger(__name__)

TRANSCRIPT_SUFFIXES = (".txt", ".reference.txt")
PROMPT_FORMAT = "mizuoto-voice-prompt/1"
STORE_BYTES = 2 * 1024**3


class VoiceError(ScriptError):
    """A voice that cannot be listed, read, saved or kept; the message names the file or voice."""


# ---- the library -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LibraryVoice:
    name: str
    audio: Path
    transcript: Path | None


class VoiceLibrary:
    """Named voices under `folders` (the first is where `save` writes)."""

    def __init__(self, folders: Sequence[str | Path]) -> None:
        if not folders:
            raise VoiceError("a voice library needs at least one folder")
        self.folders = [Path(f) for f in folders]

    def voices(self) -> dict[str, LibraryVoice]:
        """Every voice, by name, sorted. Missing folders hold none (a fresh install has no
        library yet)."""
        found: dict[str, LibraryVoice] = {}
        for folder in self.folders:
            if not folder.is_dir():
                continue
            for audio in sorted(p for p in folder.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file()):
                name = audio.relative_to(folder).with_suffix("").as_posix()
                if name not in found:
                    found[name] = LibraryVoice(name, audio, _transcript_file(audio))
        return dict(sorted(found.items()))

    def names(self) -> list[str]:
        return list(self.voices())

    def load(self, name: str) -> tuple[Audio, str | None]:
        """A voice's audio and its transcript (None when it has no transcript file)."""
        voices = self.voices()
        voice = voices.get(name)
        if voice is None:
            where = ", ".join(str(f) for f in self.folders)
            raise VoiceError(f"no voice named {name!r} in {where} (voices: {', '.join(voices) or 'none'})")
        audio = load_audio(voice.audio)  # its errors name the file
        return audio, _read_transcript(voice.transcript) if voice.transcript else None

    def save(self, name: str, audio: Audio, transcript: str | None, overwrite: bool = False) -> Path:
        """Write ``NAME.wav`` (16-bit PCM) and ``NAME.txt`` into the first folder; returns the WAV."""
        check_voice_name(name)
        target = self.folders[0] / f"{name}.wav"
        if not overwrite and name in self.voices():
            raise VoiceError(f"a voice named {name!r} already exists ({self.voices()[name].audio}); "
                             "choose another name or overwrite it")
        if transcript is not None and not transcript.strip():
            raise VoiceError(f"voice {name!r}: the transcript is empty (give the words the audio says, or none)")
        target.parent.mkdir(parents=True, exist_ok=True)
        write_wav(target, audio)
        text_file = target.with_suffix(".txt")
        if transcript is not None:
            text_file.write_text(transcript.strip() + "\n", encoding="utf-8")
        elif text_file.exists():
            text_file.unlink()  # an overwritten voice must not keep another recording's words
        return target


def check_voice_name(name: str) -> str:
    """A name that stays inside the library: path parts of letters, digits, spaces, ``-_.``,
    none starting with a dot."""
    parts = name.split("/")
    if not name or any(not p or p.startswith(".") or p != p.strip() or
                       not all(c.isalnum() or c in " -_." for c in p) for p in parts):
        raise VoiceError(f"voice name {name!r}: use letters, digits, spaces, '-', '_' and '.', with '/' between "
                         "subfolders, no part empty or starting with '.'")
    return name


def _transcript_file(audio: Path) -> Path | None:
    stem = audio.with_suffix("")
    return next((f for f in (stem.with_name(stem.name + s) for s in TRANSCRIPT_SUFFIXES) if f.is_file()), None)


def _read_transcript(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8-sig").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise VoiceError(f"{path}: cannot be read as UTF-8 text ({exc})") from exc
    if not text:
        raise VoiceError(f"{path}: the transcript is empty")
    return text


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
        fd, temp = tempfile.mkstemp(dir=self.folder, suffix=".partial")
        os.close(fd)
        try:
            save_file(tensors, temp, metadata=meta)
            os.replace(temp, path)
        finally:
            Path(temp).unlink(missing_ok=True)
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

