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
import itertools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ...audio import Audio
from ...engines.base import Codes, Engine, Sampling, Turn, Voice
from ..chunking import chunk_seed
from .assemble import join
from .segments import SegmentCache, SegmentKey, dialogue_key, segment_key
from .subtitles import Cue, Placed, Timing, cue_script, place_cues
from .syntax import Line, Pause, Script, ScriptError

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
                 on_progress: Callable[[int, int], None] | None = None,
                 pass_starts: Collection[int] = ()) -> ScriptAudio:
    """Speak `script` on a phased engine. `voices[None]` is the node's own voice; every other
    character that speaks needs its entry. `grouped` False runs each line's phases in turn
    (the same audio; for comparison).

    An engine that speaks several voices in one pass (`Engine.VOICES_PER_PASS` > 1) speaks
    each run of lines between pauses as one dialogue (`dialogue_passes`); `pass_starts`: the
    indices of further lines that start a pass (a subtitle cue's first line). Then
    `ScriptAudio.lines` holds each pass's audio."""
    if not engine.PHASED:
        raise ScriptError(f"engine {engine.id!r} does not run in phases; speak its lines one by one")
    missing = [c for c in script.characters() if c not in voices]
    if missing:
        raise ScriptError(f"no voice for {', '.join(repr(c) if c else 'the node' for c in missing)}")
    dialogue = engine.VOICES_PER_PASS > 1
    passes = (dialogue_passes(script, engine, pass_starts) if dialogue
              else [SpokenPass(i, i + 1) for i in range(len(script.lines))])
    lines = script.lines
    samplings = [pass_sampling(sampling, lines, part) for part in passes]
    ctx = requests.request(sampling.seed, cancel_check, None)
    progress = _Progress(on_progress)

    characters = list(dict.fromkeys(line.character for line in lines))
    progress.total = len(characters) + 2 * len(passes)
    prompted: dict[str | None, Voice] = {}
    for character in characters:
        prompted[character] = _prompt(engine, ctx, character, voices[character])
        progress.step()
    jobs = [_job(lines, part, prompted, s, dialogue) for part, s in zip(passes, samplings)]
    keys = [job.key(engine) for job in jobs]

    def speak(todo: list[int]) -> list[Audio]:
        progress.step(2 * (len(passes) - len(todo)))  # passes from the cache run no phase
        return run_phases(engine, ctx, [jobs[i] for i in todo], grouped=grouped, allow_fallback=allow_fallback,
                          cancel_check=cancel_check, after=lambda _phase, _index: progress.step())

    spoken = (cache if cache is not None else SegmentCache(kept=max(1, len(passes)))).speak(keys, speak)
    progress.step(progress.total - progress.done)  # all from the cache: the bar still ends full
    return ScriptAudio(join(collapse(script, passes), spoken.audio), spoken.audio, spoken.from_cache, ctx.meta)


def _prompt(engine: Engine, ctx: RequestContext, character: str | None, source: CharacterVoice) -> Voice:
    if source.prompted is None:
        return engine.voice_prompt(ctx, source.reference, source.transcript, source.speaker,
                                   instruct=source.instruct, **dict(source.options))
    if source.prompted.engine != engine.id:
        raise ScriptError(f"the voice of {character or 'the node'!r} was made by engine "
                          f"{source.prompted.engine!r}; this script's engine is {engine.id!r}")
    return source.prompted


@dataclasses.dataclass(frozen=True)
class SpokenPass:
    """Lines `start` to `end` (exclusive) of a script, spoken by one talker pass: one line, or
    for an engine that speaks several voices at once, a dialogue."""

    start: int
    end: int


def dialogue_passes(script: Script, engine: Engine, starts: Collection[int] = ()) -> list[SpokenPass]:
    """The script's passes for a multi-voice engine: each run of lines with no pause between
    them (silence cannot be placed inside one pass), also cut before each line index in
    `starts`. A pass with more characters than the engine speaks at once, a seed on any line
    but a pass's first, or two languages in one pass is refused, naming the lines."""
    passes: list[SpokenPass] = []
    index, start = 0, None
    for item in script.items:
        if isinstance(item, Pause) or index in starts:
            if start is not None and start < index:
                passes.append(SpokenPass(start, index))
            start = None if isinstance(item, Pause) else index
        if isinstance(item, Line):
            start = index if start is None else start
            index += 1
    if start is not None and start < index:
        passes.append(SpokenPass(start, index))
    for part in passes:
        _check_pass(script.lines[part.start:part.end], engine)
    return passes


def _check_pass(lines: Sequence[Line], engine: Engine) -> None:
    where = (f"lines {lines[0].source_line}-{lines[-1].source_line}" if len(lines) > 1
             else f"line {lines[0].source_line}")
    characters = list(dict.fromkeys(line.character for line in lines))
    most = engine.VOICES_PER_PASS
    if len(characters) > most:
        names = ", ".join(c or "the node's voice" for c in characters)
        raise ScriptError(f"{where}: {len(characters)} voices speak without a pause between them ({names}); "
                          f"{engine.title or engine.id} speaks at most {most} voices at once: put a [pause] "
                          "between lines to start a new pass, or use fewer characters")
    for line in lines[1:]:
        if line.seed is not None:
            raise ScriptError(f"line {line.source_line}: {engine.title or engine.id} speaks {where} in one pass, "
                              "so only the pass's first line takes a seed")
        if line.language != lines[0].language:
            raise ScriptError(f"line {line.source_line}: one pass ({where}) speaks one language; put a [pause] "
                              "before a line in another language")


def pass_sampling(sampling: Sampling, lines: Sequence[Line], part: SpokenPass) -> Sampling:
    """A pass samples as its first line would alone (`line_sampling`)."""
    return line_sampling(sampling, lines[part.start], part.start)


def collapse(script: Script, passes: Sequence[SpokenPass]) -> Script:
    """The script with each pass's lines standing as its first line, so `join` places one clip
    per pass (pauses stay where they were; a pass holds no pause)."""
    firsts = {part.start for part in passes}
    items, index = [], 0
    for item in script.items:
        if isinstance(item, Line):
            if index in firsts:
                items.append(item)
            index += 1
        else:
            items.append(item)
    return Script(tuple(items))


def _job(lines: Sequence[Line], part: SpokenPass, prompted: Mapping[str | None, Voice], sampling: Sampling,
         dialogue: bool) -> Job:
    """A line job; a dialogue job for an engine that speaks several voices at once (even of
    one line: a pass is always in its dialogue format)."""
    spoken = lines[part.start:part.end]
    if not dialogue:
        return LineJob(spoken[0].text, prompted[spoken[0].character], sampling)
    characters = list(dict.fromkeys(line.character for line in spoken))
    return DialogueJob(tuple(Turn(characters.index(line.character), line.text) for line in spoken),
                       tuple(prompted[c] for c in characters), sampling)


def speak_subtitles(requests: Requests, engine: Engine, cues: Sequence[Cue],
                    voices: Mapping[str | None, CharacterVoice], sampling: Sampling, timing: Timing = "pad",
                    max_stretch: float = 1.5, **options: Any) -> Placed:
    """Speak every cue (all cues' lines as one script: each phase runs once for the whole track,
    and line i of the track samples with seed + i) and place them as `timing` says
    (`subtitles.place_cues`). `options`: `speak_script`'s keyword arguments. An engine that
    speaks several voices at once speaks each cue's lines as its own passes."""
    scripts = [cue_script(cue, [c for c in voices if c is not None]) for cue in cues]
    firsts = list(itertools.accumulate((len(s.lines) for s in scripts), initial=0))[:-1]
    whole = speak_script(requests, engine, Script(tuple(item for s in scripts for item in s.items)), voices, sampling,
                         pass_starts=set(firsts), **options)
    per_line = engine.VOICES_PER_PASS == 1
    spoken, start = [], 0
    for script in scripts:
        passes = ([SpokenPass(i, i + 1) for i in range(len(script.lines))] if per_line
                  else dialogue_passes(script, engine))
        spoken.append(join(collapse(script, passes), whole.lines[start:start + len(passes)]))
        start += len(passes)
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


@dataclasses.dataclass(frozen=True)
class LineJob:
    """A job for `run_phases`: the words, the prompted voice, and the sampling (with its seed)."""

    text: str
    voice: Voice
    sampling: Sampling

    def talk(self, engine: Engine, ctx: RequestContext) -> Codes:
        return engine.generate(ctx, self.text, self.voice, self.sampling)

    def key(self, engine: Engine) -> SegmentKey:
        return segment_key(engine, self.voice, self.text, self.sampling)


@dataclasses.dataclass(frozen=True)
class DialogueJob:
    """A dialogue for `run_phases`: one talker pass of several voices (`Engine.generate_dialogue`)."""

    turns: tuple[Turn, ...]
    voices: tuple[Voice, ...]
    sampling: Sampling

    def talk(self, engine: Engine, ctx: RequestContext) -> Codes:
        return engine.generate_dialogue(ctx, self.turns, self.voices, self.sampling)

    def key(self, engine: Engine) -> SegmentKey:
        return dialogue_key(engine, self.voices, self.turns, self.sampling)


Job = LineJob | DialogueJob
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
        if ctx.generator is not None:
            ctx.generator.manual_seed(jobs[index].sampling.seed)
        return _ParkedCodes(jobs[index].talk(engine, ctx))

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
