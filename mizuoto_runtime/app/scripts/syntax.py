"""Script text: who speaks which words, the pauses between them, and per-line seeds.

The syntax is TTS-Audio-Suite's (the most used ComfyUI TTS pack), so its scripts run here as
they are:

==========================  =====================================================================
``[Alice] Hello.``          Alice speaks until the next tag or the end of the source line; a new
                            line starts in the node's own voice again (text before any tag too).
``[de:Alice] Hallo.``       The same, with a language code for that text (``[de:]``: the node's
                            own voice in German). A code is two letters, optionally ``-XX``.
``[Alice|seed:7] Hi.``      A character and the seed of the line that follows.
``[seed:7]``                The next spoken line's seed (on its own line: the next line's).
``[pause:1.5s]``            Silence: ``1.5s``, ``300ms``, or ``2`` (seconds); ``wait`` and
                            ``stop`` are the same tag; the keyword's case does not matter.
``Speaker 1: Hi.``          At the start of a line, the same as ``[Speaker 1] Hi.`` (the plain
                            dialogue form of VibeVoice's and other multi-speaker scripts).
``\\[`` ``\\]`` ``\\\\``       A literal ``[``, ``]`` or backslash; any other backslash is kept.
==========================  =====================================================================

Names match the known characters without regard to case. Each source line's text between tags
is one spoken line. Refused, each with one error naming the source line and the tag: an unknown
character (listing the known ones), a malformed or too long pause, a seed outside 0..2**64-1,
two seeds for one line, a seed with no line after it, a character tag with no text after it on
its line, an unclosed ``[`` or a stray ``]``, and pipe parameters other than ``seed``.

Where TTS-Audio-Suite differs (its ``utils/text/character_parser``, ``pause_processor`` and
``segment_parameters``): it speaks an unknown character in the narrator's voice and ignores
unknown parameters (``[Alice|temp:0.5]``), emotion references (``[Alice:angry_bob]``) and
malformed pauses (spoken as text); here each is an error. Its ``[seed:N]`` alone also switches
to the narrator; here it leaves the character as it is. Its seeds stop at 2**32-1 and pauses
are clamped to 30 s; here seeds go to 2**64-1 and pauses to 60 s. Its ``[1]`` speaker form
and engine sound tags (``[laughter]``) are not read here (``[laughter]`` is an unknown
character unless one is named so); ``Speaker 1:`` names a character "Speaker 1", which must be
known like any other. It has no escape for brackets.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from decimal import Decimal

from ...errors import MizuotoError

SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes 64 bits; every engine seeds through it
PAUSE_MAX_SECONDS = 60.0
PAUSE_WORDS = ("pause", "wait", "stop")
_PAUSE_VALUE = re.compile(r"(\d+(?:\.\d+)?)(s|ms)?")
_LANGUAGE = re.compile(r"[A-Za-z]{2}(?:-[A-Za-z]{2,4})?")
_NAME_FORBIDDEN = set("[]|:\\")
_SPEAKER_LINE = re.compile(r"\s*(speaker\s+\d+)\s*:(.*)", re.IGNORECASE)


class ScriptError(MizuotoError, ValueError):
    """Script or subtitle text that cannot be spoken; the message names the line (or cue) and tag."""


@dataclasses.dataclass(frozen=True)
class Line:
    """Words one character speaks. `character` None: the node's own voice. `seed` None: the
    run's seed + the line's index. `source_line`: where it stands in the text (1-based; 0 for a
    line built in code), provenance only, so it takes no part in equality."""

    text: str
    character: str | None = None
    language: str | None = None
    seed: int | None = None
    source_line: int = dataclasses.field(default=0, compare=False)

    def __post_init__(self) -> None:
        if not self.text or self.text != self.text.strip() or self.text.splitlines() != [self.text]:
            raise ScriptError(f"a spoken line's text must be one line without surrounding spaces, got {self.text!r}")
        if self.character is not None:
            check_character_name(self.character)
        if self.seed is not None and not 0 <= self.seed <= SEED_MAX:
            raise ScriptError(f"seed {self.seed} is outside 0..{SEED_MAX}")
        if self.language is not None and not _LANGUAGE.fullmatch(self.language):
            raise ScriptError(f"language {self.language!r} is not a code like 'de' or 'pt-BR'")


@dataclasses.dataclass(frozen=True)
class Pause:
    """Silence between lines, in seconds (0 < seconds <= PAUSE_MAX_SECONDS)."""

    seconds: float
    source_line: int = dataclasses.field(default=0, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.seconds <= PAUSE_MAX_SECONDS:
            raise ScriptError(f"a pause lasts more than 0 and at most {PAUSE_MAX_SECONDS:g} s, got {self.seconds}")


Item = Line | Pause


@dataclasses.dataclass(frozen=True)
class Script:
    """A parsed script: spoken lines and pauses in order."""

    items: tuple[Item, ...]

    @property
    def lines(self) -> tuple[Line, ...]:
        return tuple(item for item in self.items if isinstance(item, Line))

    def characters(self) -> list[str | None]:
        """The characters that speak, in order of first appearance (None: the node's voice)."""
        return list(dict.fromkeys(line.character for line in self.lines))

    def to_text(self) -> str:
        """Script text that parses back to this script (one item per source line)."""
        return "\n".join(_item_text(item) for item in self.items)


def looks_like_script(text: str) -> bool:
    """Whether `text` uses script markup: a tag, or a ``Speaker N:`` line."""
    return "[" in text or any(_SPEAKER_LINE.fullmatch(line) for line in text.splitlines())


def check_character_name(name: str) -> str:
    """A name a tag can spell: not empty, no surrounding spaces, none of ``[]|:\\``, not a
    reserved word (``seed``, ``pause``, ``wait``, ``stop``). Returns it."""
    if not name or name != name.strip() or name.splitlines() != [name] or _NAME_FORBIDDEN & set(name):
        raise ScriptError(f"character name {name!r} cannot be written in a tag: it must not be empty, start or "
                          "end with spaces, or hold any of [ ] | : \\")
    if name.lower() in ("seed", *PAUSE_WORDS):
        raise ScriptError(f"character name {name!r} is a reserved tag word")
    return name


def known_characters(characters: Iterable[str]) -> dict[str, str]:
    """Lower-cased name -> name as given, each name checked; names that differ only in case are
    refused (a tag could not tell them apart)."""
    known: dict[str, str] = {}
    for name in characters:
        check_character_name(name)
        if name.lower() in known and known[name.lower()] != name:
            raise ScriptError(f"characters {known[name.lower()]!r} and {name!r} differ only in case")
        known[name.lower()] = name
    return known


def parse_script(text: str, characters: Iterable[str] = ()) -> Script:
    """`text` as a Script; `characters` are the names tags may use (matched without regard to
    case; the Script spells them as given here)."""
    known = known_characters(characters)
    return parse_lines(((f"line {number}", number, source) for number, source in enumerate(text.splitlines(), start=1)),
                       known)


def parse_lines(lines: Iterable[tuple[str, int, str]], known: dict[str, str]) -> Script:
    """Parse source lines given as (where, e.g. "line 3" or "cue 3"; source number; text), with
    `known` mapping lower-cased names to their spelling (`known_characters`)."""
    parser = _Parser(known)
    for where, number, source in lines:
        parser.line(where, number, source)
    return parser.finish()


# ---- parsing ---------------------------------------------------------------------------------

@dataclasses.dataclass
class _Pending:
    seed: int
    where: str  # "line N, [tag]" for the error when no line takes it


class _Parser:
    def __init__(self, known: dict[str, str]) -> None:
        self.known = known
        self.items: list[Item] = []
        self.seed: _Pending | None = None

    def line(self, place: str, number: int, source: str) -> None:
        source = _speaker_form(source)
        character: str | None = None
        language: str | None = None
        switched_by: str | None = None  # the character tag whose text is still to come
        for kind, value in _tokens(place, source):
            if kind == "text":
                words = value.strip()
                if not words:
                    continue
                seed = self.seed.seed if self.seed else None
                self.seed = None
                self.items.append(Line(words, character, language, seed, number))
                switched_by = None
                continue
            where = f"{place}, [{value}]"
            tag = _Tag.read(value, where, self.known)
            if tag.pause is not None:
                self.items.append(Pause(tag.pause, number))
            if tag.seed is not None:
                if self.seed is not None:
                    raise ScriptError(f"{where}: a second seed before a spoken line (the first: {self.seed.where})")
                self.seed = _Pending(tag.seed, where)
            if tag.switches:
                if switched_by is not None:
                    raise ScriptError(f"{place}, [{switched_by}]: no text before the next character tag")
                character, language, switched_by = tag.character, tag.language, value
        if switched_by is not None:
            raise ScriptError(f"{place}, [{switched_by}]: no text after it on its line (a character speaks "
                              "until the end of the line its tag is on)")

    def finish(self) -> Script:
        if self.seed is not None:
            raise ScriptError(f"{self.seed.where}: no spoken line after this seed")
        return Script(tuple(self.items))


@dataclasses.dataclass(frozen=True)
class _Tag:
    """What one ``[...]`` says."""

    switches: bool = False
    character: str | None = None
    language: str | None = None
    seed: int | None = None
    pause: float | None = None

    @classmethod
    def read(cls, body: str, where: str, known: dict[str, str]) -> _Tag:
        head, _, value = body.partition(":")
        if head.strip().lower() in PAUSE_WORDS and "|" not in body:
            return cls(pause=_pause_seconds(value.strip(), where))
        parts = [part.strip() for part in body.split("|")]
        speaker = [part for part in parts if not part.lower().startswith("seed:")]
        seeds = [part for part in parts if part.lower().startswith("seed:")]
        if len(seeds) > 1:
            raise ScriptError(f"{where}: more than one seed in one tag")
        seed = _seed(seeds[0].partition(":")[2].strip(), where) if seeds else None
        if not speaker:
            return cls(seed=seed)
        if len(speaker) > 1:
            raise ScriptError(f"{where}: {speaker[1]!r} is not a parameter this pack reads (only seed:N; a tag names "
                              "one character)")
        character, language = _speaker(speaker[0], where, known)
        return cls(True, character, language, seed)


def _speaker(spec: str, where: str, known: dict[str, str]) -> tuple[str | None, str | None]:
    """``Alice``, ``de:Alice`` or ``de:`` as (character, language)."""
    language = None
    if ":" in spec:
        prefix, _, spec = spec.partition(":")
        prefix, spec = prefix.strip(), spec.strip()
        if prefix.lower() in PAUSE_WORDS:
            raise ScriptError(f"{where}: a pause tag stands alone, [pause:1s]")
        if not _LANGUAGE.fullmatch(prefix):
            raise ScriptError(f"{where}: {prefix!r} is not a language code like 'de' or 'pt-BR' (emotion references "
                              "and other parameters than seed are not read here)")
        if ":" in spec:
            raise ScriptError(f"{where}: a tag holds at most a language and a character, 'lang:Name'")
        language = prefix
        if not spec:
            return None, language
    name = known.get(spec.lower())
    if name is None:
        listed = ", ".join(sorted(known.values(), key=str.lower)) or "none"
        raise ScriptError(f"{where}: no character named {spec!r} (known: {listed})")
    return name, language


def _speaker_form(source: str) -> str:
    """``Speaker 1: words`` as ``[Speaker 1] words`` (one space between the words of the name)."""
    match = _SPEAKER_LINE.fullmatch(source)
    if match is None:
        return source
    return f"[{' '.join(match.group(1).split())}]{match.group(2)}"


def _pause_seconds(value: str, where: str) -> float:
    match = _PAUSE_VALUE.fullmatch(value)
    if match is None:
        raise ScriptError(f"{where}: a pause is written like [pause:1.5s], [pause:300ms] or [pause:2]")
    seconds = float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)
    if not 0 < seconds <= PAUSE_MAX_SECONDS:
        raise ScriptError(f"{where}: a pause lasts more than 0 and at most {PAUSE_MAX_SECONDS:g} s")
    return seconds


def _seed(value: str, where: str) -> int:
    if re.fullmatch(r"-?[0-9]+", value) is None:
        raise ScriptError(f"{where}: a seed is a whole number from 0 to {SEED_MAX}")
    seed = int(value)
    if not 0 <= seed <= SEED_MAX:
        raise ScriptError(f"{where}: seed {seed} is outside 0..{SEED_MAX}")
    return seed


def _tokens(place: str, source: str) -> Iterable[tuple[str, str]]:
    """("text", words with escapes resolved) and ("tag", the tag's body) in order."""
    text: list[str] = []
    i = 0
    while i < len(source):
        char = source[i]
        if char == "\\" and i + 1 < len(source) and source[i + 1] in "[]\\":
            text.append(source[i + 1])
            i += 2
            continue
        if char == "]":
            raise ScriptError(f"{place}: a ']' with no '[' before it (write \\] for a literal bracket)")
        if char == "[":
            end = source.find("]", i + 1)
            if end < 0:
                raise ScriptError(f"{place}: a '[' that is not closed on its line (write \\[ for a literal "
                                  "bracket)")
            if "[" in source[i + 1:end]:
                raise ScriptError(f"{place}: a '[' inside a tag, [{source[i + 1:end]}]")
            yield "text", "".join(text)
            text = []
            yield "tag", source[i + 1:end]
            i = end + 1
            continue
        text.append(char)
        i += 1
    yield "text", "".join(text)


# ---- writing ---------------------------------------------------------------------------------

def _item_text(item: Item) -> str:
    if isinstance(item, Pause):
        return f"[pause:{_decimal(item.seconds)}s]"
    params = [f"{item.language}:{item.character or ''}" if item.language else item.character or ""]
    if item.seed is not None:
        params.append(f"seed:{item.seed}")
    tag = "|".join(p for p in params if p)
    return (f"[{tag}] " if tag else "") + escape(item.text)


def escape(text: str) -> str:
    """`text` with its brackets and backslashes escaped, to be read back as the same words."""
    return text.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")


def _decimal(seconds: float) -> str:
    """The shortest positional digits that read back as the same float (never an exponent)."""
    digits = format(Decimal(repr(seconds)), "f")
    return digits.rstrip("0").rstrip(".") if "." in digits else digits
