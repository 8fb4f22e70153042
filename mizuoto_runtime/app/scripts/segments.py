"""Spoken lines kept in memory, so re-running a script after editing one line speaks only that
line. Bounded (the least recently used line is dropped first); keyed by everything that
decides a line's audio: the engine and its checkpoint, precision and device kind, the voice,
the words, the language, the seed, every sampling setting and the engine's own options.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...audio import Audio
from ...engines.voice_store import canonical_json, engine_identity
from ...lru import LruCache
from .syntax import ScriptError

if TYPE_CHECKING:
    from ...engines.base import Engine, Sampling, Turn, Voice

log = logging.getLogger(__name__)

LINES_KEPT = 256  # a few long scripts' worth of lines (10 s at 24 kHz is ~1 MB each)


@dataclasses.dataclass(frozen=True)
class SegmentKey:
    engine: str
    checkpoint: str
    dtype: str
    device: str
    voice: str
    text: str
    sampling: str  # canonical JSON of every Sampling field, the line's own seed included
    options: str  # canonical JSON of the engine's own options (emotion, speed, ...)


def segment_key(engine: Engine, voice: Voice, text: str, sampling: Sampling,
                options: Mapping[str, Any] | None = None) -> SegmentKey:
    """The key of `text` spoken by `engine` in `voice` with `sampling` (its seed is the line's)."""
    return SegmentKey(**engine_identity(engine), voice=voice.key, text=text,
                      sampling=canonical_json(dataclasses.asdict(sampling), "sampling"),
                      options=canonical_json(dict(options or {}), "options"))


def dialogue_key(engine: Engine, voices: Sequence[Voice], turns: Sequence[Turn], sampling: Sampling) -> SegmentKey:
    """The key of a dialogue spoken in one pass: every voice in order, and each turn's voice
    and words."""
    return SegmentKey(**engine_identity(engine), voice=",".join(voice.key for voice in voices),
                      text=canonical_json([[turn.voice, turn.text] for turn in turns], "dialogue"),
                      sampling=canonical_json(dataclasses.asdict(sampling), "sampling"),
                      options=canonical_json({}, "options"))


@dataclasses.dataclass(frozen=True)
class Spoken:
    """Each line's audio, in order, and how many of them came from the cache."""

    audio: tuple[Audio, ...]
    from_cache: int


class SegmentCache:
    """At most `kept` lines' audio. Entries are copies, so a caller changing its audio later
    changes nothing kept."""

    def __init__(self, kept: int = LINES_KEPT) -> None:
        self._lines: LruCache[SegmentKey, Audio] = LruCache(kept)

    def __len__(self) -> int:
        return len(self._lines)

    def get(self, key: SegmentKey) -> Audio | None:
        audio = self._lines.get(key)
        return None if audio is None else Audio(audio.waveform.clone(), audio.sample_rate)

    def put(self, key: SegmentKey, audio: Audio) -> None:
        self._lines[key] = Audio(audio.waveform.detach().clone(), audio.sample_rate)

    def speak(self, keys: Sequence[SegmentKey], speak: Callable[[list[int]], Sequence[Audio]]) -> Spoken:
        """The audio of every key: kept lines from the cache, the others from one call of
        `speak(indices of the missing lines)`, which returns their audio in that order (all at
        once, so a caller can run them phase by phase) and are kept."""
        found = [self.get(key) for key in keys]
        missing = [i for i, audio in enumerate(found) if audio is None]
        if missing:
            made = speak(missing)
            if len(made) != len(missing):
                raise ScriptError(f"{len(missing)} lines to speak, but {len(made)} audio clips came back")
            for i, audio in zip(missing, made):
                self.put(keys[i], audio)
                found[i] = audio
        log.debug("Mizuoto: %d of %d lines from the line cache", len(keys) - len(missing), len(keys))
        return Spoken(tuple(a for a in found if a is not None), len(keys) - len(missing))

    def clear(self) -> None:
        self._lines.clear()
