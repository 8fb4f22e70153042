"""Japanese text → v2 phonemes with pitch marks, as upstream's Japanese frontend does: OpenJTalk's
full-context labels (pyopenjtalk-plus, which ships its dictionary) read into phones, with ``[``
where the pitch rises, ``]`` where it falls, ``#`` at accent-phrase ends (not in the table: it
becomes UNK, as upstream's cleaner makes it) and ``_`` for pauses; unvoiced vowels in lower case.
Text between Japanese runs (punctuation) is kept as marks.

OpenJTalk runs without pyopenjtalk-plus's own post-processing (``use_vanilla``, which also keeps
Sudachi and its dictionary out), as upstream runs plain pyopenjtalk. Differences from upstream:
pyopenjtalk-plus's dictionary is newer than plain pyopenjtalk's, and upstream adds its own user
dictionary (``ja_userdic``).
"""
from __future__ import annotations

import re
from functools import cache
from typing import Any

from .symbols import PUNCTUATION

_JAPANESE_CHARS = r"A-Za-z\d\u3005\u3040-\u30ff\u4e00-\u9fff\uff11-\uff19\uff21-\uff3a\uff41-\uff5a\uff66-\uff9d"
_JAPANESE = re.compile(f"[{_JAPANESE_CHARS}]")
_NOT_JAPANESE = re.compile(f"[^{_JAPANESE_CHARS}]")
MARK_MAP = {"：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ",", "...": "…"}
_MARKS = "".join(PUNCTUATION)
_REPEATED_MARKS = re.compile(f"([{re.escape(_MARKS)}])([{re.escape(_MARKS)}])+")


@cache
def _openjtalk() -> Any:
    try:
        import pyopenjtalk
    except ImportError as exc:
        from . import install_hint

        raise ImportError(f"the Japanese frontend needs pyopenjtalk-plus ({install_hint()}): {exc}") from exc
    return pyopenjtalk


def normalize(text: str) -> str:
    return _REPEATED_MARKS.sub(r"\1", text)


def _feature(pattern: str, label: str) -> int:
    match = re.search(pattern, label)
    return int(match.group(1)) if match else -50


def prosody(text: str) -> list[str]:
    """Phones and pitch marks of one run of Japanese (without the start and end marks)."""
    jtalk = _openjtalk()
    labels = jtalk.make_label(jtalk.run_frontend(text, use_vanilla=True))
    phones: list[str] = []
    for n, label in enumerate(labels):
        phone = re.search(r"-(.*?)\+", label).group(1)
        if phone in "AEIOU":
            phone = phone.lower()
        if phone == "sil":
            if n == len(labels) - 1 and _feature(r"!(\d+)_", label) == 1:
                phones.append("?")
            continue
        if phone == "pau":
            phones.append("_")
            continue
        phones.append(phone)
        a1 = _feature(r"/A:([0-9\-]+)\+", label)
        a2 = _feature(r"\+(\d+)\+", label)
        a3 = _feature(r"\+(\d+)/", label)
        f1 = _feature(r"/F:(\d+)_", label)
        a2_next = _feature(r"\+(\d+)\+", labels[n + 1])
        if a3 == 1 and a2_next == 1 and phone in "aeiouAEIOUNcl":
            phones.append("#")
        elif a1 == 0 and a2_next == a2 + 1 and a2 != f1:
            phones.append("]")
        elif a2 == 1 and a2_next == 2:
            phones.append("[")
    return phones


def g2p(text: str) -> list[str]:
    text = text.replace("％", "パーセント").lower()
    runs = _NOT_JAPANESE.split(text)
    marks = _NOT_JAPANESE.findall(text)
    phones: list[str] = []
    for i, run in enumerate(runs):
        if _JAPANESE.match(run):
            phones += prosody(run)
        if i < len(marks) and marks[i] != " ":
            phones.append(marks[i].replace(" ", ""))
    return [MARK_MAP.get(p, p) for p in phones]
