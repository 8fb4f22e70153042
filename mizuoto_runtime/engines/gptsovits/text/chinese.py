"""Chinese text → v2 phonemes and, per character, how many phonemes it became (``word2ph``, what
the BERT features are repeated by), as upstream's ``chinese2`` frontend does on its pypinyin path.

`normalize` reads numbers aloud as upstream's normaliser does for dates (2024年, 2024-03-05),
clock times (12:30 → 十二点半), temperatures, fractions, percentages, ranges (5~10), mobile
numbers (digit by digit, 1 as 幺), metric units, decimals, negative numbers and integers; maps
punctuation to the table's six marks and drops every other character
that is not a Chinese one. `g2p` cuts each sentence with jieba's part-of-speech tagger, merges
and changes tones (`sandhi`), takes pypinyin's initials and finals, joins 儿 to the syllable
before it, and spells each syllable in the table's symbols (`pinyin`).

Polyphones: upstream reads them with g2pW (a BERT-based ONNX model) from its ``G2PWModel``
folder; this frontend reads them from pypinyin's phrase dictionary (`PINYIN_SOURCE`), as
upstream does without g2pW, and the engine logs a warning where a user has that folder.

Not carried from upstream's normaliser (PaddleSpeech's): its list of measure words (before which
2 reads 两, and without which a number of three or more digits is read digit by digit; here every
number is a cardinal), landline numbers, arithmetic, powers, version numbers, traditional
characters.
"""
from __future__ import annotations

import logging
import re
from functools import cache
from typing import Any

from . import pinyin, sandhi
from .symbols import PUNCTUATION

log = logging.getLogger(__name__)

PINYIN_SOURCE = "pypinyin's phrase dictionary (no g2pW)"
G2PW_FOLDER = "G2PWModel"  # upstream's g2pW model folder (``GPT_SoVITS/text/G2PWModel``), not run here
PUNCTUATION_MAP = {"：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ",",
                   "...": "…", "$": ".", "/": ",", "—": "-", "~": "…", "～": "…"}
_MARKS = "".join(PUNCTUATION)
_PUNCTUATION_RE = re.compile("|".join(re.escape(p) for p in PUNCTUATION_MAP))
_NOT_KEPT = re.compile(r"[^\u4e00-\u9fa5" + re.escape(_MARKS) + r"]+")
_REPEATED_MARKS = re.compile(f"([{re.escape(_MARKS)}])([{re.escape(_MARKS)}])+")
_SENTENCE_END = re.compile(f"(?<=[{re.escape(_MARKS)}])\\s*")

DIGITS = "零一二三四五六七八九"
PHONE_DIGITS = "零幺二三四五六七八九"  # 1 read yao in numbers said digit by digit
UNITS_NAMED = {"cm²": "平方厘米", "cm2": "平方厘米", "cm³": "立方厘米", "cm3": "立方厘米", "m²": "平方米",
               "m2": "平方米", "m³": "立方米", "m3": "立方米", "cm": "厘米", "mm": "毫米", "km": "千米", "kg": "千克",
               "ml": "毫升", "db": "分贝", "ms": "毫秒", "m": "米", "s": "秒"}
_DATE = re.compile(r"(\d{4})([- /.])(0[1-9]|1[012])\2(0[1-9]|[12][0-9]|3[01])")
_TIME = re.compile(r"(?<!\d)([01]?[0-9]|2[0-3]):([0-5][0-9])(?::([0-5][0-9]))?(?!\d)")
_TEMPERATURE = re.compile(r"(-?)(\d+(?:\.\d+)?)(°C|℃|摄氏度|度)")
_FRACTION = re.compile(r"(-?)(\d+)/(\d+)")
_MOBILE = re.compile(r"(?<!\d)((?:\+?86 ?)?1(?:[38]\d|5[0-35-9]|7[678]|9[89])\d{8})(?!\d)")
_RANGE = re.compile(r"(\d)[~～](?=-?\d)")
_UNIT = re.compile(r"(\d)(" + "|".join(sorted(UNITS_NAMED, key=len, reverse=True)) + r")(?![a-zA-Z])")
UNITS = ((10 ** 8, "亿"), (10 ** 4, "万"), (1000, "千"), (100, "百"), (10, "十"))
_YEAR = re.compile(r"(\d{4})年")
_PERCENT = re.compile(r"(-?)(\d+(?:\.\d+)?)%")
_NUMBER = re.compile(r"(-?)(\d+)(?:\.(\d+))?")


def cardinal(n: int) -> str:
    """An integer read as a number: 10 → 十, 101 → 一百零一, 20000 → 二万."""
    if n < 10:
        return DIGITS[n]
    for value, unit in UNITS:
        if n >= value:
            high, low = divmod(n, value)
            head = "" if (value == 10 and high == 1) else cardinal(high)
            if low == 0:
                return head + unit
            gap = "零" if low < value // 10 else ""
            return head + unit + gap + _cardinal_inner(low)
    raise AssertionError(n)


def _cardinal_inner(n: int) -> str:
    """Like `cardinal`, but 10-19 inside a larger number keep their 一 (一百一十)."""
    return "一" + cardinal(n) if 10 <= n < 20 else cardinal(n)


def _digits(text: str) -> str:
    return "".join(DIGITS[int(d)] for d in text)


def _number(match: re.Match[str]) -> str:
    sign, whole, fraction = match.group(1), match.group(2), match.group(3)
    read = cardinal(int(whole)) if not (len(whole) > 1 and whole.startswith("0")) else _digits(whole)
    if fraction:
        read += "点" + _digits(fraction)
    return ("负" if sign else "") + read


def _time(match: re.Match[str]) -> str:
    hour, minute, second = match.group(1), match.group(2), match.group(3)
    read = cardinal(int(hour)) + "点"
    if int(minute):
        read += "半" if int(minute) == 30 else _clock(minute) + "分"
    if second and int(second):
        read += _clock(second) + "秒"
    return read


def _clock(two: str) -> str:
    """Minutes and seconds: 05 → 零五, 15 → 十五."""
    return ("零" if two.startswith("0") else "") + cardinal(int(two))


def _phone(match: re.Match[str]) -> str:
    return "".join(PHONE_DIGITS[int(d)] for d in match.group(1).lstrip("+").replace(" ", ""))


def read_numbers(text: str) -> str:
    text = _DATE.sub(lambda m: f"{_digits(m.group(1))}年{cardinal(int(m.group(3)))}月{cardinal(int(m.group(4)))}日",
                     text)
    text = _TIME.sub(_time, text)
    text = _TEMPERATURE.sub(lambda m: ("零下" if m.group(1) else "") + _number(_NUMBER.match(m.group(2))) + "度",
                            text)
    text = _UNIT.sub(lambda m: m.group(1) + UNITS_NAMED[m.group(2)], text)
    text = _FRACTION.sub(lambda m: ("负" if m.group(1) else "") + f"{cardinal(int(m.group(3)))}分之"
                                                                 f"{cardinal(int(m.group(2)))}", text)
    text = _MOBILE.sub(_phone, text)
    text = _RANGE.sub(r"\1到", text)
    text = _YEAR.sub(lambda m: _digits(m.group(1)) + "年", text)
    text = _PERCENT.sub(lambda m: ("负" if m.group(1) else "") + "百分之" + _number(_NUMBER.match(m.group(2))), text)
    return _NUMBER.sub(_number, text)


def _half_width(text: str) -> str:
    """Full-width ASCII (Ａ, １, ％) as ASCII; the ideographic space as a space."""
    return "".join(chr(ord(c) - 0xFEE0) if 0xFF01 <= ord(c) <= 0xFF5E and c not in "！，：；？～" else
                   (" " if c == "\u3000" else c) for c in text)


def normalize(text: str) -> str:
    text = read_numbers(_half_width(text))
    text = text.replace("嗯", "恩").replace("呣", "母")
    text = _PUNCTUATION_RE.sub(lambda m: PUNCTUATION_MAP[m.group()], text)
    text = _NOT_KEPT.sub("", text)
    return _REPEATED_MARKS.sub(r"\1", text)


@cache
def _tools() -> tuple[Any, Any, Any]:
    """jieba (its dictionary ships in the package; the first cut builds a cache in the temp
    folder) and pypinyin, imported on first use."""
    try:
        import jieba
        import jieba.posseg
        from pypinyin import Style, lazy_pinyin
    except ImportError as exc:
        from . import install_hint

        raise ImportError(f"the Chinese frontend needs jieba and pypinyin ({install_hint()}): {exc}") from exc
    jieba.setLogLevel(logging.WARNING)
    log.info("GPT-SoVITS Chinese polyphones: %s", PINYIN_SOURCE)

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


def g2p(text: str) -> tuple[list[str], list[int]]:
    """Phonemes and word2ph of `normalize`d text (one word2ph entry per character)."""
    jieba, (initials_of, finals_of), posseg = _tools()
    phones: list[str] = []
    word2ph: list[int] = []
    for sentence in (s for s in _SENTENCE_END.split(text) if s.strip()):
        sentence = re.sub("[a-zA-Z]+", "", sentence)
        words = sandhi.merge_words([(w, p) for w, p in posseg.lcut(sentence)], finals_of)
        for word, pos in words:
            if pos == "eng":
                continue
            finals = sandhi.modify(word, pos, finals_of(word), jieba.lcut_for_search)
            initials, finals = _erhua(initials_of(word), finals, word, pos)
            for initial, final in zip(initials, finals):
                symbols = _symbols(initial, final)
                phones += symbols
                word2ph.append(len(symbols))
    return phones, word2ph
