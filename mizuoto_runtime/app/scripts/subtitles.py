"""Subtitles: SRT cues, each spoken by its character and placed at its start time.

Timing modes (`place_cues`), each cue's audio placed at its start or, when an earlier cue ran
long, right after that one:

* ``pad``: the audio as spoken, silence until the next cue. A line longer than its room pushes
  the later cues back; the report says by how much.
* ``fit``: each line time-stretched (pitch kept) to its cue's length, by at most `max_stretch`
  either way; what the bound leaves over is padded or pushes later cues back as in ``pad``.
* ``natural``: a line first runs on into the silence before the next cue; if that is not
  enough it is shortened, by at most `max_stretch`; only then are later cues pushed back. A
  line shorter than its room is never lengthened.

Stretching changes the audio: only ``fit`` and ``natural`` do it (choosing them is the opt-in),
with librosa's phase vocoder (`librosa.effects.time_stretch`, an optional package: the rest of
this module needs none), and the report gives each cue's factor.

The adjusted SRT has each cue's actual times (the first and last sample of its audio, rounded
to the millisecond) and its text as written.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from ...audio import Audio
from .assemble import samples
from .syntax import Script, ScriptError, known_characters, parse_lines

Timing = Literal["pad", "fit", "natural"]
TIMINGS: tuple[Timing, ...] = ("pad", "fit", "natural")
_STAMP = r"(\d+):([0-5]\d):([0-5]\d)[,.](\d{3})"
_TIMES = re.compile(rf"\s*{_STAMP}\s*-->\s*{_STAMP}(?:\s.*)?")


@dataclasses.dataclass(frozen=True)
class Cue:
    """One subtitle: its number as written, its times in milliseconds, its text (lines joined
    with newlines, as written: tags included)."""

    number: int
    start_ms: int
    end_ms: int
    text: str


def parse_srt(text: str) -> tuple[Cue, ...]:
    """The cues of SRT text. Cues must run in order without overlapping (one may start where the
    previous ends); a bad block, a bad timestamp, an unordered or an overlapping cue is one error
    naming the cue number."""
    cues: list[Cue] = []
    for first_line, block in _blocks(text.lstrip("\ufeff")):
        cue = _cue(first_line, block)
        if cue.end_ms <= cue.start_ms:
            raise ScriptError(f"cue {cue.number}: it ends ({_stamp(cue.end_ms)}) at or before its start "
                              f"({_stamp(cue.start_ms)})")
        if cues and cue.start_ms < cues[-1].start_ms:
            raise ScriptError(f"cue {cue.number}: it starts ({_stamp(cue.start_ms)}) before cue {cues[-1].number} "
                              f"({_stamp(cues[-1].start_ms)}); cues must be in time order")
        if cues and cue.start_ms < cues[-1].end_ms:
            raise ScriptError(f"cue {cue.number}: it starts ({_stamp(cue.start_ms)}) before cue {cues[-1].number} "
                              f"ends ({_stamp(cues[-1].end_ms)}); cues must not overlap")
        cues.append(cue)
    if not cues:
        raise ScriptError("the subtitles hold no cue")
    return tuple(cues)


def read_srt(path: str | Path) -> tuple[Cue, ...]:
    """The cues of an SRT file (UTF-8, a byte-order mark allowed); errors name the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError as exc:
        raise ScriptError(f"subtitle file not found: {path}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ScriptError(f"{path}: cannot be read as UTF-8 text ({exc})") from exc
    try:
        return parse_srt(text)
    except ScriptError as exc:
        raise ScriptError(f"{path}: {exc}") from exc


def format_srt(cues: Iterable[Cue]) -> str:
    """SRT text of `cues` (the form `parse_srt` reads back)."""
    return "".join(f"{cue.number}\n{_stamp(cue.start_ms)} --> {_stamp(cue.end_ms)}\n{cue.text}\n\n" for cue in cues)


def cue_script(cue: Cue, characters: Iterable[str] = ()) -> Script:
    """What a cue says, in the script syntax: its lines are one source line (a subtitle's line
    breaks wrap the text on screen; they do not end a character's turn)."""
    spoken = " ".join(part.strip() for part in cue.text.splitlines())
    script = parse_lines([(f"cue {cue.number}", cue.number, spoken)], known_characters(characters))
    if not script.lines:
        raise ScriptError(f"cue {cue.number}: nothing to speak")
    return script


@dataclasses.dataclass(frozen=True)
class CueReport:
    """Where one cue's audio landed. `stretch`: its length after / before (1.0: untouched)."""

    number: int
    start_ms: int
    end_ms: int
    placed_start_ms: int
    placed_end_ms: int
    spoken_ms: int
    stretch: float

    @property
    def shift_ms(self) -> int:
        """How far an earlier cue's overrun pushed this one back."""
        return self.placed_start_ms - self.start_ms

    def describe(self) -> str:
        notes = []
        if self.stretch != 1.0:
            notes.append(f"time-stretched x{self.stretch:.3f}, pitch kept")
        if self.shift_ms:
            notes.append(f"pushed back {self.shift_ms} ms by the cues before it")
        return (f"cue {self.number}: {_stamp(self.placed_start_ms)} --> {_stamp(self.placed_end_ms)} "
                f"(cue {_stamp(self.start_ms)} --> {_stamp(self.end_ms)}, spoken {self.spoken_ms} ms)"
                + (f": {'; '.join(notes)}" if notes else ""))


@dataclasses.dataclass(frozen=True)
class Placed:
    """The assembled audio, the cues at their actual times, the per-cue report, and (spoken by
    a runtime) the request's report and how many lines came from the line cache."""

    audio: Audio
    cues: tuple[Cue, ...]
    report: tuple[CueReport, ...]
    timing: Timing
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    from_cache: int = 0

    @property
    def srt(self) -> str:
        return format_srt(self.cues)

    def report_text(self) -> str:
        stretched = sum(1 for r in self.report if r.stretch != 1.0)
        pushed = max((r.shift_ms for r in self.report), default=0)
        head = (f"timing {self.timing}: {len(self.report)} cues, {stretched} time-stretched, "
                f"the furthest pushed back {pushed} ms")
        return "\n".join([head, *(r.describe() for r in self.report)])


def place_cues(cues: Sequence[Cue], spoken: Sequence[Audio], timing: Timing = "pad",
               max_stretch: float = 1.5) -> Placed:
    """Place `spoken[i]` (cue i's audio) on the cues' timeline. `max_stretch` (>= 1): the most a
    line's length may be multiplied or divided by in ``fit`` and ``natural``."""
    if timing not in TIMINGS:
        raise ScriptError(f"timing must be one of {', '.join(TIMINGS)}, got {timing!r}")
    if not (isinstance(max_stretch, (int, float)) and math.isfinite(max_stretch) and max_stretch >= 1):
        raise ScriptError(f"max_stretch must be a finite number >= 1, got {max_stretch!r}")
    if len(spoken) != len(cues) or not cues:
        raise ScriptError(f"{len(cues)} cues but {len(spoken)} audio clips")
    rate, channels = spoken[0].sample_rate, spoken[0].waveform.shape[0]
    for cue, audio in zip(cues, spoken):
        if audio.sample_rate != rate or audio.waveform.shape[0] != channels:
            raise ScriptError(f"cue {cue.number}: {audio.waveform.shape[0]} channel(s) at {audio.sample_rate} Hz, "
                              f"cue {cues[0].number} has {channels} at {rate} Hz")
        if audio.waveform.shape[-1] == 0:
            raise ScriptError(f"cue {cue.number}: its audio is empty")
    starts = [samples(cue.start_ms / 1000, rate) for cue in cues]
    cursor = 0
    pieces: list[tuple[int, torch.Tensor]] = []
    report: list[CueReport] = []
    for i, (cue, audio) in enumerate(zip(cues, spoken)):
        length = audio.waveform.shape[-1]
        at = max(starts[i], cursor)
        shortest, longest = max(1, round(length / max_stretch)), round(length * max_stretch)
        if timing == "fit":
            target = min(max(samples(cue.end_ms / 1000, rate) - starts[i], shortest), longest)
        elif timing == "natural" and i + 1 < len(cues) and length > starts[i + 1] - at:
            target = max(starts[i + 1] - at, shortest)
        else:
            target = length
        wave = audio.waveform.float() if target == length else time_stretch(audio.waveform.float(), target)
        pieces.append((at, wave))
        cursor = at + target
        report.append(CueReport(cue.number, cue.start_ms, cue.end_ms, _ms(at, rate), _ms(cursor, rate),
                                _ms(length, rate), target / length))
    total = max(cursor, samples(cues[-1].end_ms / 1000, rate))
    out = torch.zeros(channels, total)
    for at, wave in pieces:
        out[:, at:at + wave.shape[-1]] = wave
    placed = tuple(Cue(cue.number, r.placed_start_ms, r.placed_end_ms, cue.text) for cue, r in zip(cues, report))
    return Placed(Audio(out, rate), placed, tuple(report), timing)


def time_stretch(waveform: torch.Tensor, target: int) -> torch.Tensor:
    """`waveform` [channels, samples] made `target` samples long with its pitch kept (librosa's
    phase vocoder; its output is within a few samples of the asked length, trimmed or padded
    with silence to exactly `target`)."""
    try:
        import librosa
    except ImportError as exc:
        raise ScriptError("the fit and natural timings time-stretch audio with librosa, which is not installed "
                          "(pip install librosa), or use the pad timing") from exc
    stretched = librosa.effects.time_stretch(waveform.numpy(), rate=waveform.shape[-1] / target)
    out = torch.zeros(waveform.shape[0], target)
    kept = min(target, stretched.shape[-1])
    out[:, :kept] = torch.from_numpy(stretched[..., :kept]).float()
    return out


# ---- SRT text ---------------------------------------------------------------------------------

def _blocks(text: str) -> Iterable[tuple[int, list[str]]]:
    """(1-based number of its first line, its lines) for each run of non-blank lines."""
    block: list[str] = []
    first = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            if not block:
                first = number
            block.append(line.rstrip())
        elif block:
            yield first, block
            block = []
    if block:
        yield first, block


def _cue(first_line: int, block: list[str]) -> Cue:
    if not block[0].strip().isdigit():
        raise ScriptError(f"the cue at line {first_line}: its first line must be the cue number, got {block[0]!r}")
    number = int(block[0])
    if len(block) < 2 or (match := _TIMES.fullmatch(block[1])) is None:
        got = repr(block[1]) if len(block) > 1 else "nothing"
        raise ScriptError(f"cue {number}: its second line must be 'HH:MM:SS,mmm --> HH:MM:SS,mmm', got {got}")
    if len(block) < 3:
        raise ScriptError(f"cue {number}: no text")
    h1, m1, s1, f1, h2, m2, s2, f2 = (int(g) for g in match.groups())
    start = ((h1 * 60 + m1) * 60 + s1) * 1000 + f1
    end = ((h2 * 60 + m2) * 60 + s2) * 1000 + f2
    return Cue(number, start, end, "\n".join(line.strip() for line in block[2:]))


def _stamp(ms: int) -> str:
    seconds, milli = divmod(ms, 1000)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d},{milli:03d}"


def _ms(sample: int, rate: int) -> int:
    return round(sample * 1000 / rate)
