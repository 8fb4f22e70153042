"""GPT-SoVITS's offline text frontend: text → v2 phoneme ids, per language run (issue 26, item 4).

`phonemize` cuts the text into runs of one language (`segment`, with the user's language model
when the engine finds it), normalises and converts each with that language's G2P (`chinese`,
`english`, `japanese`), and gives the ids of the v2 table (`symbols`) with, for Chinese runs,
the normalised text and ``word2ph`` that the BERT features are built from (the engine's
``bert`` phase). Edges follow upstream's TTS (its ``cut0``, no cut within a line): in a target
text, repeated ``!?…,.-`` become one, a short first clause gets a leading mark, each line (short
lines joined to the next, lines of marks only dropped) is its own piece with an ending mark, and
a piece over 510 characters is cut after marks; a prompt transcript only gets an ending mark. A
piece of fewer than six phonemes is read again after a leading ``.``. The pieces' runs follow
one another: upstream speaks each piece on its own, the host's chunking decides that here. A
Chinese run holding ``￥`` or ``^`` reads its commas as the pause ``SP2`` or ``SP3`` (upstream's
cleaner).

Nothing downloads: every dictionary and model this reads ships in an installed package or in
this one, or is the user's own file, and a missing one is an error naming the package or file
(`hints.install_hint`).
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
SHORT_LINE = 5  # upstream joins lines shorter than this to the next
LONGEST_PIECE = 510  # a BERT input's characters, less [CLS] and [SEP]
_SPLITS_CLASS = "[" + "".join(re.escape(s) for s in sorted(SPLITS)) + "]"
_REPEATED_MARKS = re.compile(r"([!?…,.\-])([!?…,.\-])+")


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
#: Upstream's cleaner: a Chinese run holding one of these marks reads it as a comma, and then
#: every comma of the run as that pause phoneme (the first mark found decides).
SPECIAL_PAUSES = (("￥", "SP2"), ("^", "SP3"))


def _convert(language: str, text: str, polyphones: Polyphones | None) -> Run:
    if language == "zh":
        from . import chinese

        mark, pause = next(((m, p) for m, p in SPECIAL_PAUSES if m in text), ("", ","))
        norm = chinese.normalize(text.replace(mark, ",") if mark else text)
        phones, word2ph = chinese.g2p(norm, polyphones)
        return Run("zh", norm, tuple(pause if p == "," else p for p in phones), tuple(word2ph))
    if language == "ja":
        from . import japanese

        norm = japanese.normalize(text)
        return Run("ja", norm, tuple(japanese.g2p(norm)), None)
    from . import english

    norm = english.normalize(text)
    return Run("en", norm, tuple(english.g2p(norm)), None)


def _mark(language: str | None) -> str:
    return "." if language == "en" else "。"


def _ending(text: str, language: str | None) -> str:
    return text if text[-1] in SPLITS else text + _mark(language)


def _join_short(lines: list[str]) -> list[str]:
    """Lines joined until each holds `SHORT_LINE` characters; a short rest joins the last."""
    if len(lines) < 2:
        return lines
    joined: list[str] = []
    part = ""
    for line in lines:
        part += line
        if len(part) >= SHORT_LINE:
            joined.append(part)
            part = ""
    if part:
        if joined:
            joined[-1] += part
        else:
            joined.append(part)
    return joined


def _cut_long(text: str) -> list[str]:
    """A piece over `LONGEST_PIECE` characters cut after marks into pieces within it (a clause
    longer than that stays whole; upstream would give an empty piece before it and fail)."""
    pieces, part = [], ""
    for bit in re.split(f"({_SPLITS_CLASS})", text):
        if len(part + bit) > LONGEST_PIECE and part:
            pieces.append(part)
            part = bit
        else:
            part += bit
    return pieces + [part] if part else pieces


def _pieces(text: str, language: str | None, target: bool) -> list[str]:
    """The texts upstream's TTS reads one by one: a prompt as one piece, a target by lines."""
    text = text.strip("\n")
    if not target:
        return [_ending(re.sub(r" {2,}", " ", text), language)] if text else []
    text = _REPEATED_MARKS.sub(r"\1", text).strip("\n")
    first = re.split(_SPLITS_CLASS, text)[0].strip()
    if text and text[0] not in SPLITS and len(first) < SHORT_FIRST_CLAUSE:
        text = _mark(language) + text
    lines = _join_short([line for line in re.sub(r"\n+", "\n", text).split("\n") if line not in ("", " ")])
    pieces = []
    for line in lines:
        if not re.sub(r"\W+", "", line):
            continue
        line = _ending(line, language)
        pieces += [re.sub(r" {2,}", " ", p) for p in (_cut_long(line) if len(line) > LONGEST_PIECE else [line])]
    return pieces


def _piece_runs(piece: str, language: str | None, polyphones: Polyphones | None,
                language_model: Path | None) -> list[Run]:
    runs = [_convert(lang, part, polyphones) for lang, part in segment.split(piece, language, language_model)]
    if sum(len(r.phones) for r in runs) < MIN_PHONES:
        again = segment.split("." + piece, language, language_model)
        runs = [_convert(lang, part, polyphones) for lang, part in again]
    return runs


def phonemize(text: str, language: str | None = None, target: bool = True,
              polyphones: Polyphones | None = None, language_model: Path | None = None) -> list[Run]:
    """The runs of `text` (`language`: auto, zh, en or ja; `target`: the text to speak, else a
    prompt's transcript; `polyphones`: g2pW for Chinese, else pypinyin; `language_model`: the
    user's ``lid.176.bin`` for `segment`)."""
    if not re.sub(r"\W+", "", text):
        raise ArgumentError(f"GPT-SoVITS: {text!r} has no words to speak")
    runs = [run for piece in _pieces(text, language, target)
            for run in _piece_runs(piece, language, polyphones, language_model)]
    if all(p in PUNCTUATION for r in runs for p in r.phones):
        raise ArgumentError(f"GPT-SoVITS: nothing in {text!r} can be read as {language or 'auto'} "
                            f"(this frontend speaks {', '.join(segment.LANGUAGES[1:])})")
    return [r for r in runs if r.phones]
