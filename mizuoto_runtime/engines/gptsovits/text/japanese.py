"""Japanese text → v2 phonemes with pitch marks, as upstream's Japanese frontend does: OpenJTalk's
full-context labels read into phones, with ``[`` where the pitch rises, ``]`` where it falls,
``#`` at accent-phrase ends (not in the table: it becomes UNK, as upstream's cleaner makes it) and
``_`` for pauses; unvoiced vowels in lower case. Text between Japanese runs (punctuation) is kept
as marks.

OpenJTalk comes from whichever ``pyopenjtalk`` is installed (issue 26, item 4):

* pyopenjtalk-plus (the default requirement; it ships its dictionary) runs without its own
  post-processing (``use_vanilla``, which also keeps Sudachi and its dictionary out). Its OpenJTalk
  library and dictionary are not upstream's: accent phrases and readings differ from upstream on
  about half of all sentences (measured 45/100 equal; 55/100 with upstream's dictionary swapped in,
  so both the library's rules and the dictionary differ). ``phones`` are the same shape either way.
* plain pyopenjtalk (r9y9's, which upstream requires) with its ``open_jtalk_dic_utf_8-1.11``
  dictionary in place gives upstream's phonemes exactly. It is run as upstream runs it; a missing
  dictionary is an error naming the folder, since plain pyopenjtalk would download it.

Upstream also loads its user dictionary (``ja_userdic``, English words in katakana) when it is
present; its words are Latin, which upstream's language segmentation sends to the English
frontend, so it is not read here.
"""
from __future__ import annotations

import functools
import inspect
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .symbols import PUNCTUATION

_JAPANESE_CHARS = r"A-Za-z\d\u3005\u3040-\u30ff\u4e00-\u9fff\uff11-\uff19\uff21-\uff3a\uff41-\uff5a\uff66-\uff9d"
_JAPANESE = re.compile(f"[{_JAPANESE_CHARS}]")
_NOT_JAPANESE = re.compile(f"[^{_JAPANESE_CHARS}]")
MARK_MAP = {"：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?",
            "\n": ".", "·": ",", "、": ",", "...": "…"}
_MARKS = "".join(PUNCTUATION)
_REPEATED_MARKS = re.compile(f"([{re.escape(_MARKS)}])([{re.escape(_MARKS)}])+")


@functools.cache
def _openjtalk() -> tuple[Any, Callable[[str], Any]]:
    """The installed pyopenjtalk and its frontend as upstream's output needs it run."""
    try:
        import pyopenjtalk
    except ImportError as exc:
        from .hints import install_hint

        raise ImportError(f"the Japanese frontend needs pyopenjtalk-plus ({install_hint()}): {exc}") from exc
    if "use_vanilla" in inspect.signature(pyopenjtalk.run_frontend).parameters:  # pyopenjtalk-plus
        return pyopenjtalk, functools.partial(pyopenjtalk.run_frontend, use_vanilla=True)
    folder = Path(os.fsdecode(pyopenjtalk.OPEN_JTALK_DICT_DIR))
    if not (folder / "sys.dic").is_file():  # plain pyopenjtalk downloads it on first use
        raise FileNotFoundError(f"pyopenjtalk's OpenJTalk dictionary is missing: {folder}/sys.dic (put "
                                "open_jtalk_dic_utf_8-1.11 there, or set OPEN_JTALK_DICT_DIR to its folder)")
    return pyopenjtalk, pyopenjtalk.run_frontend


def normalize(text: str) -> str:
    return _REPEATED_MARKS.sub(r"\1", text)


def _feature(pattern: str, label: str) -> int:
    match = re.search(pattern, label)
    return int(match.group(1)) if match else -50


def prosody(text: str) -> list[str]:
    """Phones and pitch marks of one run of Japanese (without the start and end marks)."""
    jtalk, frontend = _openjtalk()
    labels = jtalk.make_label(frontend(text))
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
