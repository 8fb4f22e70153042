"""A script spoken phase by phase: every voice prompt, then every talker line, then every decode.

Run line by line, a device too small for the talker and the decoder together places the
talker, evicts it for the decoder and places it again, once per line. Grouped by phase, each
component is placed once per script; the codes waiting between the talker and decoder phases
are held on the host. Line i samples with seed + i (or its own ``[seed:N]``), so each line's
audio is the audio of that line spoken alone with that seed, sample for sample, grouped or not.

Lines already spoken with the same engine, voice, words, seed and settings come from the line
cache (`segments.SegmentCache`) and run no phase at all.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ...audio import Audio
from ...engines.base import Codes, Engine, Sampling, Voice
from ..chunking import chunk_seed
from .assemble import join
from .segments import SegmentCache, segment_key
from .subtitles import Cue, Placed, Timing, cue_script, place_cues
from .syntax import Line, Script, ScriptError

if TYPE_CHECKING:
    from ...memory.phases import RequestContext


class Requests(Protocol):
    """What opens a request (`Runtime.request`)."""

    def request(self, seed: int = 0, cancel_check: Callable[[], None] | None = None,
                on_progress: Callable[[int, int], None] | None = None) -> RequestContext: ...


@dataclasses.dataclass(frozen=True)
class CharacterVoice:
    """Where a character's voice comes from: a reference (with its transcript), a speaker of
    the checkpoint, an instruction, and the engine's voice options (`Engine.VOICE_OPTIONS`);
    or a voice the engine prompted already (`prompted`: used as it is)."""

    reference: Audio | None = None
    transcript: str | None = None
    speaker: str | None = None
    instruct: str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    prompted: Voice | None = None


@dataclasses.dataclass(frozen=True)
class ScriptAudio:
    """The script's audio, each line's, how many lines came from the cache, and the request's
    report (`ctx.meta`)."""

    audio: Audio
    lines: tuple[Audio, ...]
    from_cache: int
    meta: dict[str, Any]


def line_sampling(sampling: Sampling, line: Line, index: int) -> Sampling:
    """Line `index` samples with its own seed, else the run's seed + its index; its language,
    when the script names one."""
    seed = line.seed if line.seed is not None else chunk_seed(sampling.seed, index)
    return dataclasses.replace(sampling, seed=seed, language=line.language or sampling.language)


def speak_script(requests: Requests, engine: Engine, script: Script, voices: Mapping[str | None, CharacterVoice],
                 sampling: Sampling, *, cache: SegmentCache | None = None, grouped: bool = True,
                 allow_fallback: bool | None = None, cancel_check: Callable[[], None] | None = None,
                 on_progress: Callable[[int, int], None] | None = None) -> ScriptAudio:
    """Speak `script` on a phased engine. `voices[None]` is the node's own voice; every other
    character that speaks needs its entry. `grouped` False runs each line's phases in turn
    (the same audio; for comparison)."""
    if not engine.PHASED:
        raise ScriptError(f"engine {engine.id!r} does not run in phases; speak its lines one by one")
    missing = [c for c in script.characters() if c not in voices]
    if missing:
        raise ScriptError(f"no voice for {', '.join(repr(c) if c else 'the node' for c in missing)}")
    lines = script.lines
    samplings = [line_sampling(sampling, line, i) for i, line in enumerate(lines)]
    ctx = requests.request(sampling.seed, cancel_check, None)
    progress = _Progress(on_progress)

    characters = list(dict.fromkeys(line.character for line in lines))
    progress.total = len(characters) + 2 * len(lines)
    prompted: dict[str | None, Voice] = {}
    for character in characters:
        source = voices[character]
        if source.prompted is not None:
            if source.prompted.engine != engine.id:
                raise ScriptError(f"the voice of {character or 'the node'!r} was made by engine "
                                  f"{source.prompted.engine!r}; this script's engine is {engine.id!r}")
            prompted[character] = source.prompted
        else:
            prompted[character] = engine.voice_prompt(ctx, source.reference, source.transcript, source.speaker,
                                                      instruct=source.instruct, **dict(source.options))
        progress.step()
    keys = [segment_key(engine, prompted[line.character], line.text, s) for line, s in zip(lines, samplings)]

    def speak(todo: list[int]) -> list[Audio]:
        progress.step(2 * (len(lines) - len(todo)))  # lines from the cache run no phase
        jobs = [(lines[i].text, prompted[lines[i].character], samplings[i]) for i in todo]
        return run_phases(engine, ctx, jobs, grouped=grouped, allow_fallback=allow_fallback,
                          cancel_check=cancel_check, after=lambda _phase, _index: progress.step())

    spoken = (cache if cache is not None else SegmentCache(kept=max(1, len(lines)))).speak(keys, speak)
    progress.step(progress.total - progress.done)  # all lines from the cache: the bar still ends full
    return ScriptAudio(join(script, spoken.audio), spoken.audio, spoken.from_cache, ctx.meta)


def speak_subtitles(requests: Requests, engine: Engine, cues: Sequence[Cue],
                    voices: Mapping[str | None, CharacterVoice], sampling: Sampling, timing: Timing = "pad",
                    max_stretch: float = 1.5, **options: Any) -> Placed:
    """Speak every cue (all cues' lines as one script: each phase runs once for the whole track,
    and line i of the track samples with seed + i) and place them as `timing` says
    (`subtitles.place_cues`). `options`: `speak_script`'s keyword arguments."""
    scripts = [cue_script(cue, [c for c in voices if c is not None]) for cue in cues]
    whole = speak_script(requests, engine, Script(tuple(item for s in scripts for item in s.items)), voices, sampling,
                         **options)
    spoken, start = [], 0
    for script in scripts:
        spoken.append(join(script, whole.lines[start:start + len(script.lines)]))
        start += len(script.lines)
    placed = place_cues(cues, spoken, timing, max_stretch)
    return dataclasses.replace(placed, meta=whole.meta, from_cache=whole.from_cache)


@dataclasses.dataclass
class _Progress:
    on_progress: Callable[[int, int], None] | None
    done: int = 0
    total: int = 0

    def step(self, count: int = 1) -> None:
        if count <= 0:
            return
        self.done += count
        if self.on_progress is not None:
            self.on_progress(self.done, self.total)


#: A job for `run_phases`: the words, the prompted voice, and the sampling (with its seed).
Job = tuple[str, Voice, Sampling]
#: Called with (phase, job index), phase 0 the talker and 1 the decoder.
PhaseHook = Callable[[int, int], None]


def run_phases(engine: Engine, ctx: RequestContext, jobs: Sequence[Job], *, grouped: bool = True,
               allow_fallback: bool | None = None, cancel_check: Callable[[], None] | None = None,
               before: PhaseHook | None = None, after: PhaseHook | None = None) -> list[Audio]:
    """Each job's audio: grouped, every talker run then every decode (the codes waiting
    between are held on the host); else each job's talker and decoder in turn. The request's
    generator is seeded with the job's seed before its talker, so a job's audio does not depend
    on the order. `cancel_check` runs before each phase (between lines nothing of this request
    is placed); `before`/`after` see each phase of each job (progress)."""

    def phase(kind: int, index: int, run: Callable[[], Any]) -> Any:
        if cancel_check is not None:
            cancel_check()
        if before is not None:
            before(kind, index)
        result = run()
        if after is not None:
            after(kind, index)
        return result

    def talk(index: int) -> Codes:
        text, voice, sampling = jobs[index]
        if ctx.generator is not None:
            ctx.generator.manual_seed(sampling.seed)
        return _ParkedCodes(engine.generate(ctx, text, voice, sampling))

    def decode(parked: _ParkedCodes) -> Audio:
        return engine.decode(ctx, parked.back(), allow_fallback)

    if grouped:
        codes = [phase(0, i, functools.partial(talk, i)) for i in range(len(jobs))]
        return [phase(1, i, functools.partial(decode, c)) for i, c in enumerate(codes)]
    return [phase(1, i, functools.partial(decode, phase(0, i, functools.partial(talk, i)))) for i in range(len(jobs))]


class _ParkedCodes:
    """Codes waiting for the decoder phase, on the host (they hold no device memory); `back`
    returns them where the talker left them, so the decoder receives exactly what it would
    have received right after the talker."""

    def __init__(self, codes: Codes) -> None:
        self.engine = codes.engine
        self.tokens, self.tokens_device = codes.tokens.cpu(), codes.tokens.device
        self.devices = {k: v.device for k, v in codes.extra.items() if isinstance(v, torch.Tensor)}
        self.extra = {k: v.cpu() if k in self.devices else v for k, v in codes.extra.items()}

    def back(self) -> Codes:
        extra = {k: v.to(self.devices[k]) if k in self.devices else v for k, v in self.extra.items()}
        return Codes(self.tokens.to(self.tokens_device), self.engine, extra)
