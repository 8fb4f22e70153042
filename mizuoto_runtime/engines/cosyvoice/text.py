"""CosyVoice's text normalisation, as upstream's ``CosyVoiceFrontEnd.text_normalize`` does it
with its ``wetext`` front end (issue 22).

Text holding ``<|`` and ``|>`` (special tokens) is left as it is. Chinese text: wetext's
normaliser (``remove_erhua=False``), newlines dropped, spaces kept only between two ASCII
characters, ² and ³ spelled out, ``.`` -> ``。``, `` - `` -> ``，``, brackets removed, trailing
commas -> ``。``. Other text: wetext's normaliser, then any digits left spelled out in English
words when ``inflect`` is installed (upstream's ``spell_out_number``; without it they stay
digits). Without ``wetext`` installed the rules still apply, as upstream's own fallback does.

Long text is split into sentences by the runtime's text chunking, not here.
"""
from __future__ import annotations

import functools
import logging
import re
from typing import Any

log = logging.getLogger(__name__)

_CHINESE = re.compile(r"[\u4e00-\u9fff]+")


def contains_chinese(text: str) -> bool:
    return bool(_CHINESE.search(text))


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
        return None
    return inflect.engine()


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
    """Each run of digits as English words."""
    return re.sub(r"\d+", lambda m: parser.number_to_words(m.group(0)), text)


def normalize(text: str) -> str:
    if "<|" in text and "|>" in text or not text:
        return text
    text = text.strip()
    models = _normalizers()
    if contains_chinese(text):
        if models is not None:
            text = models[0].normalize(text)
        text = keep_ascii_spaces(text.replace("\n", ""))
        text = text.replace("²", "平方").replace("³", "立方")
        text = text.replace(".", "。").replace(" - ", "，")
        for mark in ("（", "）", "【", "】", "`"):
            text = text.replace(mark, "")
        text = text.replace("——", " ")
        return re.sub(r"[，,、]+$", "。", text)
    if models is not None:
        text = models[1].normalize(text)
    parser = _inflect()
    return spell_out_numbers(text, parser) if parser is not None else text
