"""A script's audio from its spoken lines' audio: lines in order, pauses as silence."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ...audio import Audio
from .syntax import Line, Script, ScriptError


def samples(seconds: float, sample_rate: int) -> int:
    """Whole samples nearest to `seconds` (a pause, a cue's start)."""
    return round(seconds * sample_rate)


def join(script: Script, spoken: Sequence[Audio]) -> Audio:
    """`spoken[i]` is the audio of `script.lines[i]`; pauses are silence of their length. Every
    line's audio must share one sample rate and channel count."""
    if len(spoken) != len(script.lines):
        raise ScriptError(f"{len(script.lines)} spoken lines but {len(spoken)} audio clips")
    if not spoken:
        raise ScriptError("the script has no spoken line")
    rate, channels = spoken[0].sample_rate, spoken[0].waveform.shape[0]
    for line, audio in zip(script.lines, spoken):
        if audio.sample_rate != rate or audio.waveform.shape[0] != channels:
            raise ScriptError(f"line {line.source_line} ({line.text[:30]!r}): {audio.waveform.shape[0]} channel(s) at "
                              f"{audio.sample_rate} Hz, the first line has {channels} at {rate} Hz")
    clips = iter(spoken)
    parts = []
    for item in script.items:
        if isinstance(item, Line):
            parts.append(next(clips).waveform.float())
        else:  # a Pause
            parts.append(torch.zeros(channels, samples(item.seconds, rate)))
    return Audio(torch.cat(parts, dim=-1), rate)
