"""GPT-SoVITS's offline text frontend: text → v2 phoneme ids, per language run (issue 26, item 4).

`phonemize` cuts the text into runs of one language (`segment`, with the user's language model
when the engine finds it), normalises and converts each with that language's G2P (`chinese`,
`english`, `japanese`), and gives the ids of the v2 table (`symbols`) with, for Chinese runs,
the normalised text and ``word2ph`` that the BERT features are built from (the engine's
``bert`` phase). Edge punctuation follows upstream's TTS: a target text gets a leading mark
when its first clause is short and an ending mark, a prompt transcript an ending mark, and a
text of fewer than six phonemes is read again after a leading ``.``.

Nothing downloads: every dictionary and model this reads ships in an installed package or in
this one, or is the user's own file, and a missing one is an error naming the package or file
(`install_hint`).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path

from ....errors import ArgumentError
from . import segment
from .symbols import PUNCTUATION, phoneme_ids

SPLITS = frozenset("，。？！,.?!~:：—…")
MIN_PHONES = 6
SHORT_FIRST_CLAUSE = 4


def install_hint() -> str:
    from ... import install_hint as hint

    return f"install them with: {hint('gptsovits')}"


@dataclasses.dataclass(frozen=True)
class Run:
    """One language run: its normalised text, phonemes, ids and (Chinese) phonemes per character."""

    language: str
    text: str
    phones: tuple[str, ...]
    word2ph: tuple[int, ...] | None

    @property
    def ids(self) -> list[int]:
        return phoneme_ids(list(self.phones))


Polyphones = Callable[[list[str]], list[list[str]]]  # g2pW's readings of sentences (`g2pw.Polyphones`)


def _convert(language: str, text: str, polyphones: Polyphones | None) -> Run:
    if language == "zh":
        from . import chinese

        norm = chinese.normalize(text)
        phones, word2ph = chinese.g2p(norm, polyphones)
        return Run("zh", norm, tuple(phones), tuple(word2ph))
    if language == "ja":
        from . import japanese

        norm = japanese.normalize(text)
        return Run("ja", norm, tuple(japanese.g2p(norm)), None)
    from . import english

    norm = english.normalize(text)
    return Run("en", norm, tuple(english.g2p(norm)), None)


def _edges(text: str, language: str | None, target: bool) -> str:
    mark = "." if language == "en" else "。"
    text = re.sub(r" {2,}", " ", text.strip("\n"))
    first = re.split("[" + "".join(re.escape(s) for s in SPLITS) + "]", text)[0].strip()
    if target and text and text[0] not in SPLITS and len(first) < SHORT_FIRST_CLAUSE:
        text = mark + text
    if text and text[-1] not in SPLITS:
        text += mark
    return text


def phonemize(text: str, language: str | None = None, target: bool = True,
              polyphones: Polyphones | None = None, language_model: Path | None = None) -> list[Run]:
    """The runs of `text` (`language`: auto, zh, en or ja; `target`: the text to speak, else a
    prompt's transcript; `polyphones`: g2pW for Chinese, else pypinyin; `language_model`: the
    user's ``lid.176.bin`` for `segment`)."""
    if not re.sub(r"\W+", "", text):
        raise ArgumentError(f"GPT-SoVITS: {text!r} has no words to speak")
    edged = _edges(text, language, target)
    runs = [_convert(lang, part, polyphones) for lang, part in segment.split(edged, language, language_model)]
    if sum(len(r.phones) for r in runs) < MIN_PHONES:
        again = segment.split("." + edged, language, language_model)
        runs = [_convert(lang, part, polyphones) for lang, part in again]
    if all(p in PUNCTUATION for r in runs for p in r.phones):
        raise ArgumentError(f"GPT-SoVITS: nothing in {text!r} can be read as {language or 'auto'} "
                            f"(this frontend speaks {', '.join(segment.LANGUAGES[1:])})")
    return [r for r in runs if r.phones]
