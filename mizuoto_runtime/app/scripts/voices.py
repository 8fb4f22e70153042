"""Voices kept by name: a library folder of references (the prompted voices kept on disk are
the engines' `engines.voice_store`).

The library: ``NAME.wav`` (or any format `training.dataset.load_audio` reads: ``.flac`` and
``.ogg`` where soundfile is installed) with ``NAME.txt`` holding its transcript
(TTS-Audio-Suite's ``NAME.reference.txt`` is read too). Subfolders organise voices; a voice's
name is its path below the library folder without the suffix (``characters/alice``). Several
folders may serve one library (ComfyUI's ``extra_model_paths.yaml``): the first holding a name
wins, and `save` writes into the first.

"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

from ...audio import Audio, write_wav
from ...engines.voice_store import VoiceError
from ..training.dataset import AUDIO_SUFFIXES, load_audio

log = logging.getLogger(__name__)

TRANSCRIPT_SUFFIXES = (".txt", ".reference.txt")


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
