"""IndexTTS-2's text front end: normalisation, CJK splitting, SentencePiece on bpe.model, and
the split into segments the GPT takes one at a time (issue 25).

Read from upstream's front end as a specification (its code may not be copied; every rule here is
written anew and checked against upstream's output). The normaliser, in upstream's order:

1. ``<word|reading>`` pronunciation annotations are set aside whole, so the number grammars never
   see them, and come back unchanged at the very end.
2. The language: Chinese when the text has a Han character, has no Latin letter, is one e-mail
   address, or holds pinyin with a tone digit ("xuan4"); English otherwise.
3. "what's", "it's", "she's"... become "what is"...; then the glossary (``glossary.yaml`` in the
   model folder: a term's reading for the text's language) replaces its terms, longest first,
   matching case-insensitively.
4. Protected from the number grammars: the hyphens of technical terms ("GPT-5-nano", which would
   otherwise read as a minus; the digits inside are still read), and in Chinese text also pinyin
   with tones (given back upper-cased, j/q/x + u written with v: "xu1" -> "XV1") and names joined
   by a middle dot or dash ("克里斯托弗·诺兰").
5. The number grammars, WeTextProcessing's: its own package (`tn`, on pynini; installed with the
   engine on Linux x86_64 where pynini has wheels) built as upstream builds it on Linux, which
   gives upstream's Linux output exactly, its Chinese grammar compiled once per machine; otherwise
   ``wetext`` (the same grammars as FSTs in its wheel, offline) with the Chinese settings
   WeTextProcessing's normaliser has (traditional to simplified, full-width to half-width;
   interjections and erhua kept). wetext equals WeTextProcessing 1.2 on ordinary text; it reads
   some numbers differently from 1.0.4.1 (upstream's lock) and spaces English text that opens
   with a quote or bracket differently.
6. Upstream's punctuation map (full-width and bracket characters to ASCII ones).

Then every CJK character becomes its own word and everything is upper-cased before SentencePiece.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import MizuotoError
from ..checkpoint_files import cache_root

log = logging.getLogger(__name__)

CHAR_MAP = {
    "：": ",", "；": ",", ";": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": " ", "·": "-",
    "、": ",", "...": "…", ",,,": "…", "，，，": "…", "……": "…", "“": "'", "”": "'", '"': "'",
    "‘": "'", "’": "'", "（": "'", "）": "'", "(": "'", ")": "'", "《": "'", "》": "'", "【": "'",
    "】": "'", "[": "'", "]": "'", "—": "-", "～": "-", "~": "-", "「": "'", "」": "'", ":": ",",
}
ZH_CHAR_MAP = {"$": ".", **CHAR_MAP}
CJK = re.compile(r"([\u1100-\u11ff\u2e80-\ua4cf\ua840-\uD7AF\uF900-\uFAFF\uFE30-\uFE4F\uFF65-\uFFDC"
                 r"\U00020000-\U0002FFFF])")
HAN = "\u4e00-\u9fff"
ALNUM = "0-9A-Za-z"
# "<word|reading>": the word may not hold "|" or ">", the reading may hold "|" but not ">".
ANNOTATION = re.compile(r"<(?P<word>[^\n|>]+)[|](?P<reading>[^\n>]+)>")
# No word boundary on either side, as upstream ("visit's" -> "visit is").
CONTRACTION = re.compile(r"(wh(?:at|ere|o|ich)|how|t?here|it|s?he|th(?:at|is))'s", re.IGNORECASE)
EMAIL = re.compile(f"[{ALNUM}]+@[{ALNUM}]+[.][A-Za-z]+")
# A letter first, then letters or digits, then one or more "-" + letters/digits groups: "F5-TTS".
# Phone numbers ("135-4567-8900") start with a digit and stay the grammars' to read.
TECH_TERM = re.compile(f"[A-Za-z][{ALNUM}]*(?:-[{ALNUM}]+)+")
NAME = re.compile(f"[{HAN}]+(?:[·—-][{HAN}]+){{1,2}}")
PINYIN_INITIALS = "zh ch sh b c d f g h j k l m n p q r s t w x y z".split()
PINYIN_FINALS = ("a e i o u ü v ai ei ao ou an en in un vn ang eng ing ong ia ie iu ian iao iang iong "
                 "ua ui uo uai uan uang ue üe ve üan üang van vang").split()


def _alternatives(parts: list[str]) -> str:
    return "|".join(sorted(parts, key=len, reverse=True))


# A syllable (initial + final, or a bare "ng" / "er") right before a tone digit 1-5, starting where
# no ASCII letter precedes it: "xuan4", "ZHONG4", "ng2"; not "beta1" nor "voice2".
PINYIN = re.compile(f"(?<![A-Za-z])(?:(?:{_alternatives(PINYIN_INITIALS)})?(?:{_alternatives(PINYIN_FINALS)})"
                    f"|ng|er)[1-5]", re.IGNORECASE)
# Stand-ins while the grammars run: ASCII letters only for annotations (they pass both grammars
# untouched and read as Latin text), bracketed tags for the rest.
ANNOTATION_MARK = "QZXANNOTQ{}QZXANNOTQ"
ANNOTATION_MARKS = re.compile(ANNOTATION_MARK.format("[a-z]+"))
HYPHEN_MARK = "<D>"
HYPHEN_RESTORE = re.compile(r"\s*" + re.escape(HYPHEN_MARK) + r"\s*")
SENTENCE_END = (".", "!", "?", "▁.", "▁?", "▁...")
COMMAS = (",", "▁,")
QUOTES = ("'", "▁'")
MAX_SEGMENT_TOKENS = 120
GLOSSARY_FILE = "glossary.yaml"


def _replace(text: str, table: dict[str, str]) -> str:
    pattern = re.compile("|".join(re.escape(k) for k in table))
    return pattern.sub(lambda m: table[m.group()], text)


def _letters(n: int) -> str:
    """0 -> "a", 25 -> "z", 26 -> "aa": a tag of letters only for the n-th stand-in."""
    tag = ""
    n += 1
    while n:
        n, digit = divmod(n - 1, 26)
        tag = chr(ord("a") + digit) + tag
    return tag


def is_email(text: str) -> bool:
    """One address and nothing else (a single trailing newline allowed, as upstream's `$` does)."""
    return EMAIL.fullmatch(text[:-1] if text.endswith("\n") else text) is not None


def is_chinese(text: str) -> bool:
    """Upstream's choice of the Chinese path: a Han character, no Latin letter, an e-mail address,
    or pinyin with a tone digit."""
    if re.search(f"[{HAN}]", text) or not re.search("[A-Za-z]", text) or is_email(text):
        return True
    return PINYIN.search(text) is not None


def correct_pinyin(syllable: str) -> str:
    """j/q/x + u (or ü) is written with v, upper-cased: "xuan4" -> "XVAN4", "ju3" -> "JV3";
    other syllables come back as written."""
    if syllable[0].lower() not in "jqx":
        return syllable
    rest = syllable[1:-1]
    if rest[:1].lower() in ("u", "ü") and rest[1:].lower() in ("", "n", "e", "an"):
        rest = "v" + rest[1:]
    return (syllable[0] + rest + syllable[-1]).upper()


class Stash:
    """Found strings swapped for stand-ins and swapped back, longest first (so one found inside
    another cannot split it). Every occurrence of a found string is replaced, as upstream does."""

    def __init__(self, found: list[str], mark: Callable[[int], str]) -> None:
        ordered = sorted(dict.fromkeys(found), key=len, reverse=True)  # first occurrence breaks ties
        self.pairs = [(text, mark(i)) for i, text in enumerate(ordered)]

    def hide(self, text: str) -> str:
        for original, mark in self.pairs:
            text = text.replace(original, mark)
        return text

    def show(self, text: str, fix: Callable[[str], str] = lambda s: s) -> str:
        for original, mark in self.pairs:
            text = text.replace(mark, fix(original))
        return text


@dataclass(frozen=True)
class Glossary:
    """The model folder's `glossary.yaml`: a term and its reading, the same for both languages
    (``TTS: T T S``) or per language (``M.2: {en: M dot two, zh: M 二}``; a term without a reading
    for the text's language stays as the glossary writes it). Applied first, longest term first,
    matching case-insensitively; a later (shorter) term may rewrite an earlier one's reading, as
    upstream's does. Readings are used literally."""

    terms: tuple[tuple[str, str | dict[str, str]], ...]

    @classmethod
    def load(cls, path: Path) -> Glossary | None:
        """None when the file is absent or empty; one error naming the file and the key otherwise."""
        if not path.is_file():
            return None
        import yaml

        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise MizuotoError(f"indextts2: {path} is not readable YAML: {exc}") from exc
        if data is None:
            return None
        if not isinstance(data, dict):
            raise MizuotoError(f"indextts2: {path} must map each term to its reading, "
                               f"not be a {type(data).__name__}")
        terms = [(cls._term(path, key), cls._reading(path, key, value)) for key, value in data.items()]
        return cls(tuple(sorted(terms, key=lambda t: len(t[0]), reverse=True)))

    @staticmethod
    def _term(path: Path, key: Any) -> str:
        if not isinstance(key, str) or not key:
            raise MizuotoError(f"indextts2: {path}: the term {key!r} is not text; quote it")
        return key

    @staticmethod
    def _reading(path: Path, key: str, value: Any) -> str | dict[str, str]:
        if isinstance(value, str):
            return value
        if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            return dict(value)
        raise MizuotoError(f"indextts2: {path}: the reading of {key!r} must be text or language: text "
                           f"pairs (en: ..., zh: ...), not {value!r}")

    def apply(self, text: str, lang: str) -> str:
        for term, reading in self.terms:
            spoken = reading if isinstance(reading, str) else reading.get(lang, term)
            text = re.sub(re.escape(term), lambda _m, s=spoken: s, text, flags=re.IGNORECASE)
        return text


class Normalizer:
    """The protections and the punctuation map around the number grammars: WeTextProcessing's own
    (`tn`, on pynini) when it is installed, as upstream runs them on Linux; otherwise the same
    grammars through wetext. Without either, numbers and symbols are read as written."""

    def __init__(self, glossary: Glossary | None = None, grammars: tuple[Any, Any] | None = None) -> None:
        """`grammars`: the (Chinese, English) normalisers; by default WeTextProcessing's when it is
        installed, else wetext's, else none."""
        self.glossary = glossary
        grammars = grammars or wetextprocessing_grammars() or wetext_grammars()
        self._zh, self._en = grammars if grammars else (None, None)

    def __call__(self, text: str) -> str:
        annotations = Stash([m.group() for m in ANNOTATION.finditer(text)],
                            lambda i: ANNOTATION_MARK.format(_letters(i)))
        text = annotations.hide(text)
        chinese = is_chinese(text)
        text = CONTRACTION.sub(r"\1 is", text)
        if self.glossary is not None:
            glossary, lang = self.glossary, "zh" if chinese else "en"
            text = _outside_marks(text, lambda part: glossary.apply(part, lang))
        text = self._chinese(text) if chinese else self._english(text)
        return annotations.show(text)

    def _chinese(self, text: str) -> str:
        text, terms = _hide_hyphens(text.rstrip())
        pinyin = Stash([m.group() for m in PINYIN.finditer(text)], lambda i: f"<py_{_letters(i)}>")
        text = pinyin.hide(text)
        names = Stash(NAME.findall(text), lambda i: f"<name_{_letters(i)}>")
        text = names.hide(text)
        if self._zh is not None:
            text = _grammar(self._zh, text)
        text = pinyin.show(names.show(text), correct_pinyin)
        if terms:
            text = HYPHEN_RESTORE.sub("-", text)
        return _replace(text, ZH_CHAR_MAP)

    def _english(self, text: str) -> str:
        hidden, terms = _hide_hyphens(text)
        if self._en is not None:
            try:
                hidden = _grammar(self._en, hidden)
            except MizuotoError as exc:  # upstream reads such English text as written
                log.warning("%s; read as written", exc)
                return _replace(text, CHAR_MAP)
        if terms:
            hidden = HYPHEN_RESTORE.sub("-", hidden)
        return _replace(hidden, CHAR_MAP)


ZH_FST_FILES = ("zh_tn_tagger.fst", "zh_tn_verbalizer.fst")


@functools.lru_cache(maxsize=1)
def wetextprocessing_grammars() -> tuple[Any, Any] | None:
    """WeTextProcessing's normalisers as upstream builds them on Linux (interjections and erhua
    kept), or None when it is not installed. That Chinese grammar is not the one its wheel ships:
    it is compiled on first use (about a minute and several GB of memory) into a cache folder per
    WeTextProcessing and pynini version, once per machine (see `compiled_grammar_folder`)."""
    try:
        from importlib.metadata import version

        from tn.chinese.normalizer import Normalizer as Chinese
        from tn.english.normalizer import Normalizer as English

        versions = f"wetextprocessing-{version('WeTextProcessing')}-pynini-{version('pynini')}"
    except ImportError:  # PackageNotFoundError too: a `tn` that is not WeTextProcessing's
        return None
    settings = {"remove_interjections": False, "remove_erhua": False}
    built: list[Any] = []

    def compile_into(scratch: Path) -> None:
        built.append(Chinese(cache_dir=str(scratch), **settings))

    folder = compiled_grammar_folder(cache_root() / f"{versions}-zh-tn", ZH_FST_FILES, compile_into)
    chinese = built[0] if built else Chinese(cache_dir=str(folder), **settings)
    return chinese, English(overwrite_cache=False)


def compiled_grammar_folder(folder: Path, files: tuple[str, ...], compile_into: Callable[[Path], None]) -> Path:
    """`folder`, holding `files`, compiled by `compile_into` the first time on this machine.

    The compile writes into a scratch folder beside it that is then renamed into place whole, so
    no process ever reads half a grammar; a lock file makes a second process wait for the first
    one's compile instead of doing it again (where the platform has no `fcntl`, both compile
    and the first rename wins)."""
    if all((folder / f).is_file() for f in files):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(folder.parent / f"{folder.name}.lock"):
        if all((folder / f).is_file() for f in files):  # another process compiled it meanwhile
            return folder
        log.info("indextts2: preparing the Chinese number grammars for this machine (once, about a minute); "
                 "they are kept in %s", folder)
        started = time.perf_counter()
        scratch = Path(tempfile.mkdtemp(prefix=f"{folder.name}.", dir=folder.parent))
        try:
            compile_into(scratch)
            missing = [f for f in files if not (scratch / f).is_file()]
            if missing:
                raise MizuotoError(f"indextts2: compiling the Chinese number grammars wrote no {', '.join(missing)} "
                                   f"in {scratch}")
            if folder.exists():  # an incomplete folder left by an interrupted older version
                shutil.rmtree(folder)
            os.rename(scratch, folder)
        except OSError:
            if not all((folder / f).is_file() for f in files):
                raise
            # another process (without a working lock) renamed its compile in first: same files
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        log.info("indextts2: Chinese number grammars ready in %.0f s", time.perf_counter() - started)
    return folder


@contextlib.contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    """Holds an exclusive lock on `lock_file` (waiting for it) where the platform has `fcntl`."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(lock_file, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class WeText:
    """WeTextProcessing's grammars through wetext (its wheel ships the FSTs). wetext hands back a
    double quote of the text escaped (a backslash before it) whenever its tagger ran; the
    punctuation map turns every double quote into an apostrophe afterwards anyway, so the quote
    is turned first and the grammar never sees one."""

    def __init__(self, **settings: Any) -> None:
        from wetext import Normalizer as WeTextNormalizer

        self.model = WeTextNormalizer(operator="tn", **settings)

    def normalize(self, text: str) -> str:
        return str(self.model.normalize(text.replace('"', "'")))


@functools.lru_cache(maxsize=1)
def wetext_grammars() -> tuple[Any, Any] | None:
    """wetext, with the Chinese settings WeTextProcessing's normaliser has (traditional to
    simplified, full-width to half-width); None when it is not installed."""
    try:
        import wetext  # noqa: F401
    except ImportError:
        log.info("indextts2: neither WeTextProcessing nor wetext is installed; numbers and symbols are read as written")
        return None
    return (WeText(lang="zh", traditional_to_simple=True, full_to_half=True, remove_interjections=False,
                   remove_erhua=False),
            WeText(lang="en"))


def _grammar(model: Any, text: str) -> str:
    """The normaliser's output; wetext's assertion failures (text its tagger makes nothing of)
    as one error."""
    try:
        return str(model.normalize(text))
    except AssertionError as exc:
        raise MizuotoError(f"indextts2: the text normaliser cannot read {text[:60]!r}") from exc


def _outside_marks(text: str, rewrite: Callable[[str], str]) -> str:
    """`rewrite` on the text between annotation stand-ins, never on the stand-ins themselves."""
    parts = [rewrite(part) for part in ANNOTATION_MARKS.split(text)]
    marks = ANNOTATION_MARKS.findall(text)
    return "".join(itertools.chain.from_iterable(itertools.zip_longest(parts, marks, fillvalue="")))


def _hide_hyphens(text: str) -> tuple[str, list[str]]:
    """A technical term keeps its letters and digits for the grammars; only its hyphens hide
    (longest term first, so a shorter one inside it cannot split it)."""
    terms = sorted(dict.fromkeys(TECH_TERM.findall(text)), key=len, reverse=True)
    for term in terms:
        text = text.replace(term, term.replace("-", HYPHEN_MARK))
    return text, terms


def split_cjk(text: str) -> str:
    return " ".join(w.strip().upper() for w in CJK.split(text.strip()) if w.strip())


class TextTokenizer:
    def __init__(self, bpe_model: Path, glossary: Path | None = None) -> None:
        if not bpe_model.is_file():
            raise MizuotoError(f"IndexTTS-2 tokenizer missing: {bpe_model}")
        from sentencepiece import SentencePieceProcessor

        self.sp = SentencePieceProcessor(model_file=str(bpe_model))
        self.normalize = Normalizer(Glossary.load(glossary) if glossary is not None else None)

    def tokens(self, text: str) -> list[str]:
        if not text:
            return []
        if len(text.strip()) != 1:
            text = split_cjk(self.normalize(text))
        return list(self.sp.Encode(text, out_type=str))

    def ids(self, tokens: list[str]) -> list[int]:
        return [self.sp.PieceToId(t) for t in tokens]

    @property
    def unk_id(self) -> int:
        return self.sp.unk_id()

    def segments(self, text: str, max_tokens: int = MAX_SEGMENT_TOKENS) -> list[list[int]]:
        """The text as the id lists of its segments, each at most `max_tokens` long."""
        pieces = split_segments(self.tokens(text), SENTENCE_END, max_tokens)
        return [self.ids(p) for p in pieces]


def split_segments(tokens: list[str], marks: tuple[str, ...], max_tokens: int) -> list[list[str]]:
    """Upstream's splitting: close a segment at a mark (keeping a following quote), re-split a
    segment holding commas (then dashes) on them, cut an over-long one by length; then merge
    neighbours that fit together."""
    segments: list[list[str]] = []
    current: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        current.append(token)
        if not any(c in marks for c in COMMAS) and any(c in current for c in COMMAS):
            sub = split_segments(current, COMMAS, max_tokens)
        elif "-" not in marks and "-" in current:
            sub = split_segments(current, ("-",), max_tokens)
        elif len(current) <= max_tokens:
            if token in marks and len(current) > 2:
                if i < len(tokens) - 1 and tokens[i + 1] in QUOTES:
                    current.append(tokens[i + 1])  # upstream appends the quote without skipping it
                segments.append(current)
                current = []
            i += 1
            continue
        else:
            log.warning("indextts2: a segment of %d tokens is longer than %d; cut by length", len(current), max_tokens)
            sub = [current[j:j + max_tokens] for j in range(0, len(current), max_tokens)]
        segments.extend(sub)
        current = []
        i += 1
    if current:
        segments.append(current)
    merged: list[list[str]] = []
    for segment in segments:
        if not segment:
            continue
        if merged and (len(merged[-1]) + len(segment) <= max_tokens):
            merged[-1] = merged[-1] + segment
        else:
            merged.append(segment)
    return merged
