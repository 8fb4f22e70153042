"""Chinese text normalisation as upstream's Chinese frontend does it before G2P (written from
reading GPT-SoVITS's ``zh_normalization``, its copy of PaddleSpeech's text normaliser).

`sentences` cuts text after each sentence mark, once spaces and brackets, quotes and dashes are
gone, and rewrites each sentence in upstream's order: traditional characters as simplified,
full-width letters and digits as ASCII, then dates, clock times and time ranges, unit ranges
(5m~10m), temperatures, unit abbreviations (cm, kg, m, s ... anywhere in the sentence, as
upstream replaces them), arithmetic (``+ - × ÷ =`` between numbers or letters: 3-2 is 三减二),
powers, fractions, percentages, mobile, landline and 400 numbers (digit by digit, 1 as 幺),
number ranges (5~10), negative numbers, version numbers (1.2.3), decimals, a number before a
measure word (``data/zh_normalizer.txt``: read as a cardinal, a lone 2 as 两), other numbers of
three or more digits (digit by digit, 1 as 幺), and the remaining numbers as cardinals; last,
circled numbers and Greek letters as words and the marks upstream drops.

Upstream's quirks are kept, since the phonemes must be upstream's: a unit abbreviation is
replaced wherever its letters stand (so "mm" reads 米米), and a time range reads its second
minute as 半 when the first one is 30.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache

from . import lexicon

DATA_FILE = "zh_normalizer.txt"
DIGITS = "零一二三四五六七八九"
UNITS = ((8, "亿"), (4, "万"), (3, "千"), (2, "百"), (1, "十"))  # (digits below the unit, unit)
POWERS = dict(zip("⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ", "0123456789xyn"))
OPERATORS = {"+": "加", "-": "减", "×": "乘", "÷": "除", "=": "等于"}
# Replaced in this order, wherever they stand (upstream's measure_dict).
UNIT_WORDS = {"cm2": "平方厘米", "cm²": "平方厘米", "cm3": "立方厘米", "cm³": "立方厘米", "cm": "厘米", "db": "分贝",
              "ds": "毫秒", "kg": "千克", "km": "千米", "m2": "平方米", "m²": "平方米", "m³": "立方米", "m3": "立方米",
              "ml": "毫升", "m": "米", "mm": "毫米", "s": "秒"}
# What the last pass reads aloud; the lone "=" is 等 there (等于 between operands above).
LAST_WORDS = {**dict(zip("①②③④⑤⑥⑦⑧⑨⑩", "一二三四五六七八九十")),
              "α": "阿尔法", "β": "贝塔", "γ": "伽玛", "Γ": "伽玛", "δ": "德尔塔", "Δ": "德尔塔", "ε": "艾普西龙",
              "ζ": "捷塔", "η": "依塔", "θ": "西塔", "Θ": "西塔", "ι": "艾欧塔", "κ": "喀帕", "λ": "拉姆达",
              "Λ": "拉姆达", "μ": "缪", "ν": "拗", "ξ": "克西", "Ξ": "克西", "ο": "欧米克伦", "π": "派", "Π": "派",
              "ρ": "肉", "ς": "西格玛", "Σ": "西格玛", "σ": "西格玛", "τ": "套", "υ": "宇普西龙", "φ": "服艾",
              "Φ": "服艾", "χ": "器", "ψ": "普赛", "Ψ": "普赛", "ω": "欧米伽", "Ω": "欧米伽",
              "/": "每", "+": "加", "-": "减", "×": "乘", "÷": "除", "=": "等"}
# Full-width letters and digits only: upstream's table for the ideographic space is keyed by a
# string, which str.translate never looks up, so that space stays (and is dropped later).
_FULL_WIDTH = {ord(c) + 0xFEE0: ord(c) for c in "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"}

_DROPPED_FIRST = re.compile(r"[—《》【】<>{}()（）#&@“”^_|\\]")
_DROPPED_LAST = re.compile(r"[-—《》【】<=>{}()（）#&@“”^_|\\]")
_SENTENCE_MARK = re.compile(r"([：、，；。？！,;?!][”’]?)")

_NUM = r"(?:-?\d+(?:\.\d+)?|\.\d+)"
_POWER_MARKS = "[" + "".join(POWERS) + "]"
_OPERAND = rf"(?:-?\d+(?:\.\d+)?{_POWER_MARKS}*|\.\d+{_POWER_MARKS}*|[A-Za-z]{_POWER_MARKS}*)"
_RANGE_UNIT = "(?:%|°C|℃|度|摄氏度|cm2|cm²|cm3|cm³|cm|db|ds|kg|km|m2|m²|m³|m3|ml|m|mm|s)"
_CLOCK = r"([0-1]?[0-9]|2[0-3]):([0-5][0-9])(?::([0-5][0-9]))?"
_NOT_BESIDE_RANGE = r"[\d+\-×÷=]"

_DATE = re.compile(r"(\d{4}|\d{2})年(?:(0?[1-9]|1[0-2])月)?(?:(0?[1-9]|[12][0-9]|3[01])([日号]))?")
_DATE_NUMERIC = re.compile(r"(\d{4})([- /.])(0[1-9]|1[012])\2(0[1-9]|[12][0-9]|3[01])")
_TIME_RANGE = re.compile(_CLOCK + "[~-]" + _CLOCK)
_TIME = re.compile(_CLOCK)
_UNIT_RANGE = re.compile(_NUM + _RANGE_UNIT + "~" + _NUM + _RANGE_UNIT)
_TEMPERATURE = re.compile(r"(-?)(\d+(?:\.\d+)?)(°C|℃|度|摄氏度)")
_ARITHMETIC = re.compile(f"({_OPERAND})([+\\-×÷=])({_OPERAND})")
_POWER = re.compile(_POWER_MARKS + "+")
_FRACTION = re.compile(r"(-?)(\d+)/(\d+)")
_PERCENT = re.compile(r"(-?)(\d+(?:\.\d+)?)%")
_MOBILE = re.compile(r"(?<!\d)(?:\+?86 ?)?1(?:[38]\d|5[0-35-9]|7[678]|9[89])\d{8}(?!\d)")
_LANDLINE = re.compile(r"(?<!\d)(?:0(?:10|2[1-3]|[3-9]\d{2})-?)?[1-9]\d{6,7}(?!\d)")
_SERVICE = re.compile(r"400-?\d{3}-?\d{4}")
_RANGE = re.compile(f"(?<!{_NOT_BESIDE_RANGE})(-?\\d+(?:\\.\\d+)?)[-~](-?\\d+(?:\\.\\d+)?)(?!{_NOT_BESIDE_RANGE})")
_NEGATIVE = re.compile(r"-(\d+)")
_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?(?:\.\d+)+")
_DECIMAL = re.compile(r"(-?)(\d+\.\d+)|\.(\d+)")
_LONG = re.compile(r"\d{3,}")
_NUMBER = re.compile(r"(-?)(\d+(?:\.\d+)?)|\.(\d+)")


def _grouped(digits: str) -> list[str]:
    """Upstream's reading of a digit string by units, a 零 where leading zeros stand."""
    stripped = digits.lstrip("0")
    if not stripped:
        return []
    if len(stripped) == 1:
        return [DIGITS[0], DIGITS[int(stripped)]] if len(stripped) < len(digits) else [DIGITS[int(stripped)]]
    below, unit = next((below, unit) for below, unit in UNITS if below < len(stripped))
    return _grouped(digits[:-below]) + [unit] + _grouped(digits[-below:])


def cardinal(digits: str) -> str:
    """A digit string read as a number: 10 → 十, 101 → 一百零一, 20000 → 二万, 007 → 七, '' → ''."""
    if not digits:
        return ""
    words = _grouped(digits.lstrip("0")) or [DIGITS[0]]
    if words[:2] == [DIGITS[1], "十"]:  # 一十五 is said 十五
        words = words[1:]
    return "".join(words)


def spelled(digits: str, yao: bool = False) -> str:
    """Digit by digit; `yao`: 1 as 幺, as in numbers that are codes."""
    read = "".join(DIGITS[int(d)] for d in digits)
    return read.replace("一", "幺") if yao else read


def number(text: str) -> str:
    """A number without sign (3, 3.50, .5): a cardinal, then 点 and the decimals digit by digit,
    trailing zeros kept as one."""
    whole, point, decimals = text.partition(".")
    if "." in decimals:
        raise ValueError(f"the number {text!r} has more than one decimal point")
    read = cardinal(whole)
    if decimals.endswith("0"):
        decimals = decimals.rstrip("0") + "0"
    if decimals:
        read = (read or DIGITS[0]) + "点" + spelled(decimals)
    return read


def _clock_part(two: str) -> str:
    """Minutes and seconds: 05 → 零五."""
    return (DIGITS[0] if two.startswith("0") else "") + number(two.lstrip("0"))


def _clock(hour: str, minute: str, second: str | None, half_hour: bool) -> str:
    read = number(hour) + "点"
    if minute.lstrip("0"):
        read += "半" if half_hour else _clock_part(minute) + "分"
    if second and second.lstrip("0"):
        read += _clock_part(second) + "秒"
    return read


def _time(match: re.Match[str]) -> str:
    hour, minute, second = match.group(1, 2, 3)
    return _clock(hour, minute, second, int(minute) == 30)


def _time_range(match: re.Match[str]) -> str:
    """Both ends joined by 至; upstream takes 半 for the second end from the first one's minutes."""
    half = int(match.group(2)) == 30
    return _time(match) + "至" + _clock(*match.group(4, 5, 6), half)


def _date(match: re.Match[str]) -> str:
    year, month, day, suffix = match.group(1, 2, 3, 4)
    read = spelled(year) + "年"
    if month:
        read += cardinal(month) + "月"
    if day:
        read += cardinal(day) + suffix
    return read


def _date_numeric(match: re.Match[str]) -> str:
    return f"{spelled(match.group(1))}年{cardinal(match.group(3))}月{cardinal(match.group(4))}日"


def _signed(match: re.Match[str]) -> str:
    """Sign, number and pure decimal (.5) groups of `_DECIMAL` / `_NUMBER`."""
    sign, value, pure_decimal = match.group(1, 2, 3)
    if pure_decimal:
        return number("." + pure_decimal)
    return ("负" if sign else "") + number(value)


def _phone(text: str, parts: Callable[[str], list[str]]) -> str:
    return "，".join(spelled(part, yao=True) for part in parts(text))


@cache
def _measure_words() -> re.Pattern[str]:
    words = sorted(lexicon.entries(DATA_FILE, "measure_words"), key=len, reverse=True)
    return re.compile(r"(\d+)([多余几+])?(" + "|".join(map(re.escape, words)) + ")")


def _counted(match: re.Match[str]) -> str:
    """A number before a measure word: a cardinal, a lone 2 as 两, ``+`` as 多."""
    read = cardinal(match.group(1))
    more = "多" if match.group(2) == "+" else (match.group(2) or "")
    return ("两" if read == "二" else read) + more + match.group(3)


@cache
def _simplified() -> dict[int, str]:
    pairs = (entry.split() for entry in lexicon.entries(DATA_FILE, "traditional"))
    return {ord(traditional): simplified for traditional, simplified in pairs}


def to_simplified(text: str) -> str:
    """Traditional characters as simplified, character by character (upstream's table)."""
    return text.translate(_simplified())


def _replace_all(text: str, words: dict[str, str]) -> str:
    for written, said in words.items():
        text = text.replace(written, said)
    return text


def _arithmetic(text: str) -> str:
    """Operators between operands, again until none is left (1-2-3 → 1减2减3)."""
    while _ARITHMETIC.search(text):
        text = _ARITHMETIC.sub(lambda m: m.group(1) + OPERATORS[m.group(2)] + m.group(3), text)
    return text


def normalize_sentence(sentence: str) -> str:
    """One sentence with its numbers, units and symbols read as words (see the module's docstring)."""
    text = to_simplified(sentence).translate(_FULL_WIDTH)
    text = _DATE.sub(_date, text)
    text = _DATE_NUMERIC.sub(_date_numeric, text)
    text = _TIME_RANGE.sub(_time_range, text)
    text = _TIME.sub(_time, text)
    text = _UNIT_RANGE.sub(lambda m: m.group().replace("~", "至"), text)
    text = _TEMPERATURE.sub(lambda m: ("零下" if m.group(1) else "") + number(m.group(2))
                            + ("摄氏度" if m.group(3) == "摄氏度" else "度"), text)
    text = _replace_all(text, UNIT_WORDS)
    text = _arithmetic(text)
    text = _POWER.sub(lambda m: "的" + "".join(POWERS[c] for c in m.group()) + "次方", text)
    text = _FRACTION.sub(lambda m: ("负" if m.group(1) else "") + f"{number(m.group(3))}分之{number(m.group(2))}",
                         text)
    text = _PERCENT.sub(lambda m: ("负" if m.group(1) else "") + "百分之" + number(m.group(2)), text)
    text = _MOBILE.sub(lambda m: _phone(m.group().strip("+"), str.split), text)
    text = _LANDLINE.sub(lambda m: _phone(m.group(), lambda t: t.split("-")), text)
    text = _SERVICE.sub(lambda m: _phone(m.group(), lambda t: t.split("-")), text)
    text = _RANGE.sub(lambda m: f"{_NUMBER.sub(_signed, m.group(1))}到{_NUMBER.sub(_signed, m.group(2))}", text)
    text = _NEGATIVE.sub(lambda m: "负" + number(m.group(1)), text)
    text = _VERSION.sub(lambda m: "".join("点" if c == "." else DIGITS[int(c)] for c in m.group()), text)
    text = _DECIMAL.sub(_signed, text)
    text = _measure_words().sub(_counted, text)
    text = _LONG.sub(lambda m: spelled(m.group(), yao=True), text)
    text = _NUMBER.sub(_signed, text)
    return _DROPPED_LAST.sub("", _replace_all(text, LAST_WORDS))


def sentences(text: str) -> list[str]:
    """`text` cut after its sentence marks, each sentence normalised."""
    text = _DROPPED_FIRST.sub("", text.replace(" ", ""))
    text = _SENTENCE_MARK.sub(r"\1\n", text).strip()
    return [normalize_sentence(part.strip()) for part in re.split(r"\n+", text)]
