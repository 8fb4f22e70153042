"""CosyVoice's text front end, as upstream's ``CosyVoiceFrontEnd.text_normalize`` does it
with its ``wetext`` front end (issue 22): normalisation, then upstream's sentence split.

Text holding ``<|`` and ``|>`` (special tokens) is left as it is, one sentence. Chinese text:
wetext's normaliser (``remove_erhua=False``), newlines dropped, spaces kept only between two
ASCII characters, ² and ³ spelled out, ``.`` -> ``。``, `` - `` -> ``，``, brackets removed,
trailing commas -> ``。``. Other text: wetext's normaliser, then every run of digits spelled
out in English words by ``inflect`` (upstream's ``spell_out_number``; without inflect the
digits stay). Without ``wetext`` installed the other rules still apply, as upstream's own
fallback does.

Sentences (upstream's ``split_paragraph`` with its front end's settings): the text is cut
after each sentence mark (a closing quote right after one goes with it), then pieces are
packed while a sentence stays within `TOKEN_MAX` (Chinese: characters; other text: BPE
tokens) or is still under `TOKEN_MIN`; a last piece under `MERGE_LEN` joins the one before.
Pieces of punctuation and symbols alone are dropped.
"""
from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from typing import Any

from ...errors import MizuotoError

log = logging.getLogger(__name__)

_CHINESE = re.compile(r"[\u4e00-\u9fff]+")
# upstream's front end: split_paragraph(token_max_n=80, token_min_n=60, merge_len=20, comma_split=False)
TOKEN_MAX, TOKEN_MIN, MERGE_LEN = 80, 60, 20
SENTENCE_MARKS = {"zh": "。？！；：、.?!;", "en": ".?!;:"}
CLOSING_QUOTES = "\"”"


def contains_chinese(text: str) -> bool:
    return bool(_CHINESE.search(text))


@functools.cache
def _only_punctuation() -> Any:
    import regex  # an engine requirement: imported when CosyVoice speaks, not when the engine table loads

    return regex.compile(r"[\p{P}\p{S}]*")


def is_only_punctuation(text: str) -> bool:
    """Empty, or punctuation and symbols only (Unicode categories P and S)."""
    return _only_punctuation().fullmatch(text) is not None


@functools.lru_cache(maxsize=1)
def _normalizers() -> tuple[Any, Any] | None:
    try:
        from wetext import Normalizer
    except ImportError:
        log.warning("cosyvoice: wetext is not installed; text is used without number/date normalisation")
        return None
    return Normalizer(remove_erhua=False), Normalizer()


@functools.lru_cache(maxsize=1)
def _inflect() -> Any | None:
    try:
        import inflect
    except ImportError:
        log.warning("cosyvoice: inflect is not installed; digits in English text are not spelled out")
        return None
    return inflect.engine()


def _wetext(model: Any, text: str) -> str:
    """wetext's normaliser; its own assertion failures (text its tagger makes nothing of, such
    as punctuation alone or a space at either end of a run) as one clear error."""
    try:
        return str(model.normalize(text))
    except AssertionError as exc:
        raise MizuotoError(f"cosyvoice: the text normaliser (wetext) cannot read {text[:60]!r}; "
                           "reword it (upstream's front end fails on it too)") from exc


def keep_ascii_spaces(text: str) -> str:
    """Drop spaces except one between two ASCII non-space characters (upstream's
    ``replace_blank``; its neighbour test wraps around at the start, as Python indexing does)."""
    out = []
    for i, c in enumerate(text):
        if c != " ":
            out.append(c)
        elif i + 1 < len(text) and text[i + 1].isascii() and text[i + 1] != " " \
                and text[i - 1].isascii() and text[i - 1] != " ":
            out.append(c)
    return "".join(out)


def spell_out_numbers(text: str, parser: Any) -> str:
    """Each run of characters that ``str.isdigit`` accepts (superscripts too), as English words."""
    out, start = [], None
    for i, c in enumerate(text + "\0"):  # the sentinel ends a run at the end of the text
        if c.isdigit():
            start = i if start is None else start
            continue
        if start is not None:
            out.append(parser.number_to_words(text[start:i]))
            start = None
        out.append(c)
    return "".join(out)[:-1]


def _normalized(text: str) -> tuple[str, str]:
    """The normalised text and its language for the split (``zh`` or ``en``)."""
    text = text.strip()
    models = _normalizers()
    if contains_chinese(text):
        if models is not None:
            text = _wetext(models[0], text)
        text = keep_ascii_spaces(text.replace("\n", ""))
        text = text.replace("²", "平方").replace("³", "立方")
        text = text.replace(".", "。").replace(" - ", "，")
        for mark in ("（", "）", "【", "】", "`"):
            text = text.replace(mark, "")
        text = text.replace("——", " ")
        return re.sub(r"[，,、]+$", "。", text), "zh"
    if models is not None:
        text = _wetext(models[1], text)
    parser = _inflect()
    return (spell_out_numbers(text, parser) if parser is not None else text), "en"


def _raw(text: str) -> bool:
    """Text upstream's front end leaves alone: empty, or holding special tokens."""
    return not text or "<|" in text and "|>" in text


def normalize(text: str) -> str:
    """The whole text normalised, unsplit (upstream's ``text_normalize(split=False)``)."""
    return text if _raw(text) else _normalized(text)[0]


def sentences(text: str, count_tokens: Callable[[str], int]) -> list[str]:
    """The normalised text as upstream's sentences (``text_normalize(split=True)``).
    `count_tokens` measures non-Chinese text in LM tokens."""
    if _raw(text):
        return [text]
    text, lang = _normalized(text)
    if not text:
        return []
    length = len if lang == "zh" else count_tokens
    return [s for s in pack(cut(text, lang), length) if not is_only_punctuation(s)]


def cut(text: str, lang: str) -> list[str]:
    """`text` (ended by a sentence mark if it lacks one) cut after each mark; a closing quote
    right after a mark stays with it."""
    marks = SENTENCE_MARKS[lang]
    if text[-1] not in marks:
        text += "。" if lang == "zh" else "."
    pieces: list[str] = []
    start = 0
    for i, c in enumerate(text):
        if c not in marks:
            continue
        if i > start:
            pieces.append(text[start:i + 1])
        if i + 1 < len(text) and text[i + 1] in CLOSING_QUOTES:
            # upstream adds the quote to the last piece, even one before an empty cut
            pieces[-1] += text[i + 1]
            start = i + 2
        else:
            start = i + 1
    return pieces


def pack(pieces: list[str], length: Callable[[str], int]) -> list[str]:
    """Consecutive pieces joined: a sentence is closed when it is over `TOKEN_MIN` and the
    next piece would take it over `TOKEN_MAX`; a last sentence under `MERGE_LEN` joins the one
    before."""
    out: list[str] = []
    current = ""
    for piece in pieces:
        if length(current + piece) > TOKEN_MAX and length(current) > TOKEN_MIN:
            out.append(current)
            current = ""
        current += piece
    if current:
        if length(current) < MERGE_LEN and out:
            out[-1] += current
        else:
            out.append(current)
    return out
