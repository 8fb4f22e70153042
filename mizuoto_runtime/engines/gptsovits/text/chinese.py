"""Chinese text → v2 phonemes and, per character, how many phonemes it became (``word2ph``, what
the BERT features are repeated by), as upstream's ``chinese2`` frontend does on its pypinyin path.

`normalize` reads numbers, units and symbols aloud as upstream's normaliser does
(`zh_normalizer`), maps punctuation to the table's six marks and drops every other character
that is not a Chinese one. `g2p` cuts each sentence with jieba's part-of-speech tagger, merges
and changes tones (`sandhi`), takes pypinyin's initials and finals, joins 儿 to the syllable
before it, and spells each syllable in the table's symbols (`pinyin`).

Polyphones: with the user's ``G2PWModel`` folder the engine gives `g2p` g2pW's readings
(`g2pw`), as upstream reads them; without it they come from pypinyin's phrase dictionary
(`PINYIN_SOURCE`), as upstream's frontend does without g2pW.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable
from functools import cache
from typing import Any

from . import g2pw, pinyin, sandhi, zh_normalizer
from .symbols import PUNCTUATION

PINYIN_SOURCE = "pypinyin's phrase dictionary (no g2pW)"
PUNCTUATION_MAP = {"：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ",",
                   "...": "…", "$": ".", "/": ",", "—": "-", "~": "…", "～": "…"}
_MARKS = "".join(PUNCTUATION)
_PUNCTUATION_RE = re.compile("|".join(re.escape(p) for p in PUNCTUATION_MAP))
_NOT_KEPT = re.compile(r"[^\u4e00-\u9fa5" + re.escape(_MARKS) + r"]+")
_REPEATED_MARKS = re.compile(f"([{re.escape(_MARKS)}])([{re.escape(_MARKS)}])+")
_SENTENCE_END = re.compile(f"(?<=[{re.escape(_MARKS)}])\\s*")


def normalize(text: str) -> str:
    """`text` as upstream's Chinese frontend gives it to G2P: each sentence normalised
    (`zh_normalizer`), its marks mapped to the table's and every other character that is not a
    Chinese one dropped, and runs of marks cut to their first."""
    text = "".join(_marks(sentence) for sentence in zh_normalizer.sentences(text))
    return _REPEATED_MARKS.sub(r"\1", text)


def _marks(text: str) -> str:
    text = text.replace("嗯", "恩").replace("呣", "母")
    text = _PUNCTUATION_RE.sub(lambda m: PUNCTUATION_MAP[m.group()], text)
    return _NOT_KEPT.sub("", text)


@cache
def _tools() -> tuple[Any, Any, Any]:
    """jieba (its dictionary ships in the package; the first cut builds a cache in the temp
    folder) and pypinyin, imported on first use."""
    try:
        import jieba
        import jieba.posseg
        from pypinyin import Style, lazy_pinyin
    except ImportError as exc:
        from .hints import install_hint

        raise ImportError(f"the Chinese frontend needs jieba and pypinyin ({install_hint()}): {exc}") from exc
    jieba.setLogLevel(logging.WARNING)

    def style(word: str, kind: Any) -> list[str]:
        return lazy_pinyin(word, neutral_tone_with_five=True, style=kind)

    return jieba, (lambda w: style(w, Style.INITIALS), lambda w: style(w, Style.FINALS_TONE3)), jieba.posseg


def _erhua(initials: list[str], finals: list[str], word: str, pos: str) -> tuple[list[str], list[str]]:
    """儿 after a syllable takes its tone (小孩儿 hai2 er2, 点儿 dian3 er3), except in adjectives,
    abbreviations, names and the lexicon's ``not_erhua`` words (女儿, 花儿), unless ``must_erhua``
    lists the word (媳妇儿)."""
    if finals and word[len(finals) - 1] == "儿" and finals[-1] == "er1":
        finals[-1] = "er2"
    not_erhua = sandhi.word_list("not_erhua")
    if word not in sandhi.word_list("must_erhua") and (word in not_erhua or pos in {"a", "j", "nr"}):
        return initials, finals
    if len(finals) != len(word):
        return initials, finals
    if len(word) >= 2 and word[-1] == "儿" and finals[-1] in {"er2", "er5"} and word[-2:] not in not_erhua:
        finals[-1] = "er" + finals[-2][-1]
    return initials, finals


def _symbols(initial: str, final: str) -> list[str]:
    if initial == final:  # punctuation comes through pypinyin as itself
        return [initial]
    toneless, tone = final[:-1], final[-1]
    if tone not in "12345":
        raise ValueError(f"pypinyin gave {initial + final!r}, not a toned syllable")
    head, tail = pinyin.split(pinyin.syllable(initial, toneless))
    return [head, tail + tone]


def g2p(text: str, polyphones: Callable[[list[str]], list[list[str]]] | None = None) -> tuple[list[str], list[int]]:
    """Phonemes and word2ph of `normalize`d text (one word2ph entry per character). `polyphones`
    (g2pW, `g2pw.Polyphones`) reads each sentence's characters instead of pypinyin."""
    jieba, (initials_of, finals_of), posseg = _tools()
    phones: list[str] = []
    word2ph: list[int] = []
    sentences = [re.sub("[a-zA-Z]+", "", s) for s in _SENTENCE_END.split(text) if s.strip()]
    readings: list[list[str] | None] = list(polyphones(sentences)) if polyphones else [None] * len(sentences)
    for sentence, read in zip(sentences, readings):
        words = sandhi.merge_words([(w, p) for w, p in posseg.lcut(sentence)], finals_of)
        end = 0
        for word, pos in words:
            start, end = end, end + len(word)
            if pos == "eng":
                continue
            initials, finals = g2pw.syllables(word, read[start:end]) if read else (initials_of(word), finals_of(word))
            finals = sandhi.modify(word, pos, finals, jieba.lcut_for_search)
            initials, finals = _erhua(initials, finals, word, pos)
            for initial, final in zip(initials, finals):
                symbols = _symbols(initial, final)
                phones += symbols
                word2ph.append(len(symbols))
    return phones, word2ph
