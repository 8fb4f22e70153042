"""English text → v2 phonemes (ARPAbet with stress), as upstream's English frontend does: tokens
cut by NLTK's tweet tokenizer, homographs read by their part of speech, dictionary lookup, names
for capitalised words, letters read one by one for short unknown words, possessives, compounds
cut with wordsegment, and g2p_en's neural G2P for the rest.

Offline by construction: nothing here imports ``g2p_en`` (its import downloads NLTK data) or
downloads anything. The dictionary is upstream's own, shipped as data (`LEXICON`: CMUdict 0.7b,
the newer CMUdict's words it lacks, upstream's hot words and its names, with sources and
licence in its header); the G2P network's weights are g2p_en's ``checkpoint20.npz``, run by
`G2PNet`, and its homograph list is g2p_en's; a missing file is an error naming it.

Part of speech: upstream tags with NLTK's averaged perceptron tagger, whose data its installer
puts beside Python (on a machine without it, upstream's import tries to download it and then
fails). Here the tagger runs when its data is already on the machine; without it each
homograph takes its first listed reading, said once in the log (`homograph_source`). Numbers,
times, money, units, fractions and ordinals are read as upstream's normaliser reads them
(`read_numbers`).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import logging
import re
import unicodedata
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from .lexicon import DATA, read_lists
from .symbols import PUNCTUATION, SYMBOL_ID, UNK

log = logging.getLogger(__name__)

LEXICON = DATA / "english_lexicon.txt"
SECTIONS = ("base", "fast", "hot", "names")

# Abbreviations whose dictionary reading upstream drops, so they are read letter by letter.
SPELLED = ("ae", "ai", "ar", "ios", "hud", "os")
# Upstream maps these; its other entries (";:：，；" to "," and quotes to "'") are written as
# character classes but matched as literal text, so they never apply: those marks are dropped
# with the other characters the table has no symbol for.
PUNCTUATION_MAP = {"。": ".", "！": "!", "？": "?"}
_PUNCTUATION_RE = re.compile("|".join(re.escape(p) for p in PUNCTUATION_MAP))
_MARKS = "".join(PUNCTUATION)
_REPEATED_MARKS = re.compile(f"([{re.escape(_MARKS)}\\s])([{re.escape(_MARKS)}])+")
# Upstream's corrections to g2p_en's homograph list (reading for the tag, other reading, tag).
HOMOGRAPH_FIXES = {"read": (["R", "IY1", "D"], ["R", "EH1", "D"], "VBP"),
                   "complex": (["K", "AH0", "M", "P", "L", "EH1", "K", "S"],
                               ["K", "AA1", "M", "P", "L", "EH0", "K", "S"], "JJ")}
VOICELESS = ("P", "T", "K", "F", "TH", "HH")
SIBILANT = ("S", "Z", "SH", "ZH", "CH", "JH")

ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
SCALES = ((10 ** 9, "billion"), (10 ** 6, "million"), (1000, "thousand"), (100, "hundred"))


def package_file(package: str, relative: str) -> Path:
    """A data file of an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        from .hints import install_hint

        raise FileNotFoundError(f"the English frontend reads {package}/{relative}, but {package} is not installed "
                                f"({install_hint()})")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise FileNotFoundError(f"the English frontend needs {path}, which is missing")
    return path


# ---- numbers ---------------------------------------------------------------------------------
UNITS = {"m": ("meter", "meters"), "km": ("kilometer", "kilometers"),
         "km/h": ("kilometer per hour", "kilometers per hour"), "ft": ("feet", "feet"), "L": ("liter", "liters"),
         "tbsp": ("tablespoon", "tablespoons"), "tsp": ("teaspoon", "teaspoons"), "h": ("hour", "hours"),
         "min": ("minute", "minutes"), "s": ("second", "seconds"), "°C": ("degree celsius", "degrees celsius"),
         "°F": ("degree fahrenheit", "degrees fahrenheit")}
OPERATORS = {"+": " plus ", "-": " minus ", "×": " times ", "÷": " divided by ", "=": " Equals "}
ORDINAL_ENDINGS = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
                   "nine": "ninth", "twelve": "twelfth"}
_OPERAND = r"(?:-?\d+(?:\.\d+)?|\.\d+|[A-Za-z])"
_MATH = re.compile(f"({_OPERAND})\\s+([+\\-×÷=])\\s+(?={_OPERAND})")
_UNIT = re.compile(r"\b([0-9]+(\.[0-9]+)?)(km/h|tbsp|tsp|min|km|ft|°C|°F|m|L|h|s)\b")
_MONEY = re.compile(r"([$£])([0-9.,]*[0-9]+)|([0-9.,]*[0-9]+)([$£])")
CURRENCY = {"$": (("dollar", "dollars"), ("cent", "cents")), "£": (("pound", "pounds"), ("penny", "pence"))}


def number_words(n: int) -> str:
    """A cardinal as upstream's inflect reads it without "and": groups of thousands apart by
    commas unless the rest is under a hundred (1,234,567 → one million, two hundred thirty-four
    thousand, five hundred sixty-seven)."""
    if n < 20:
        return ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return TENS[tens] + (f"-{ONES[ones]}" if ones else "")
    if n < 1000:
        high, low = divmod(n, 100)
        return f"{ONES[high]} hundred" + (f" {number_words(low)}" if low else "")
    for value, name in SCALES[:-1]:
        if n >= value:
            high, low = divmod(n, value)
            head = f"{number_words(high)} {name}"
            return head if not low else head + (", " if low >= 100 else " ") + number_words(low)
    raise AssertionError(n)


def ordinal_words(n: int) -> str:
    """first, twenty-second, one hundredth; "and" after hundred as inflect's ordinals have it."""
    words = number_words(n)
    if n > 100 and n % 100:
        words = re.sub(r"hundred (?!and)", "hundred and ", words, count=1) if n < 1000 else words
    head, _, last = words.rpartition(" ")
    stem, dash, unit = last.rpartition("-")
    if unit in ORDINAL_ENDINGS:
        unit = ORDINAL_ENDINGS[unit]
    elif unit.endswith("y"):
        unit = unit[:-1] + "ieth"
    else:
        unit += "th"
    return (head + " " if head else "") + stem + dash + unit


def _year_or_number(n: int) -> str:
    """1000-2999 as years are read (nineteen eighty-four, two thousand five), as upstream does."""
    if 1000 < n < 3000:
        if n == 2000:
            return "two thousand"
        if 2000 < n < 2010:
            return "two thousand " + number_words(n % 100)
        if n % 100 == 0:
            return number_words(n // 100) + " hundred"
        high, low = divmod(n, 100)
        return number_words(high) + " " + (f"oh {number_words(low)}" if low < 10 else number_words(low))
    return number_words(n)


def _time(match: re.Match[str]) -> str:
    hours, minutes = int(match.group(1)), int(match.group(2))
    period = "a.m." if hours < 12 else "p.m."
    hours = hours - 12 if hours > 12 else hours
    return f"{number_words(hours)} o'clock {period}" if not minutes else \
        f"{number_words(hours)} {number_words(minutes)} {period}"


def _unit(match: re.Match[str]) -> str:
    number, fraction, unit = match.group(1), match.group(2), match.group(3)
    one = fraction is None and int(number) == 1
    return f"{number} {UNITS[unit][0 if one else 1]}"


def _money(match: re.Match[str]) -> str:
    symbol = match.group(1) or match.group(4)
    amount = match.group(2) or match.group(3)
    (one, many), (small_one, small_many) = CURRENCY[symbol]
    parts = amount.split(".")
    if len(parts) > 2:
        return f"{amount} {many}"
    whole = int(parts[0].replace(",", "")) if parts[0] else 0
    small = int(parts[1].ljust(2, "0")) if len(parts) > 1 and parts[1] else 0
    said = [f"{whole} {one if whole == 1 else many}"] if whole else []
    said += [f"{small} {small_one if small == 1 else small_many}"] if small else []
    return " and ".join(said) or f"zero {many}"


def _decimal(match: re.Match[str]) -> str:
    whole, fraction = match.group(1).split(".")
    return whole + " point " + " ".join(fraction.strip())


def _fraction(match: re.Match[str]) -> str:
    top, bottom = int(match.group(1)), int(match.group(2))
    if bottom == 1:
        return number_words(top)
    if bottom == 2:
        return f"{number_words(top)} {'half' if top == 1 else 'halves'}"
    return f"{number_words(top)} {ordinal_words(bottom)}{'s' if top > 1 else ''}"


def read_numbers(text: str) -> str:
    """Numbers as upstream's English normaliser reads them, in its order: list numbers ("1. "),
    arithmetic, negative numbers, thousands separators, clock times, units, money, decimals,
    fractions, ordinals, then cardinals (years read as years)."""
    text = re.sub(r"\b([0-9]+)\. ", lambda m: ordinal_words(int(m.group(1))) + ", ", text)
    while _MATH.search(text):
        text = _MATH.sub(lambda m: m.group(1) + OPERATORS[m.group(2)], text)
    text = re.sub(r"(?:^|\s+)-(\d+)", r"negative \1", text)
    text = re.sub(r"([0-9][0-9,]+[0-9])", lambda m: m.group(1).replace(",", ""), text)
    text = re.sub(r"\b([01]?[0-9]|2[0-3]):([0-5][0-9])\b", _time, text)
    text = _UNIT.sub(_unit, text)
    text = _MONEY.sub(_money, text)
    text = re.sub(r"([0-9]+\.\s*[0-9]+)", _decimal, text)
    text = re.sub(r"([0-9]+)/([0-9]+)", _fraction, text)
    text = re.sub(r"([0-9]+)(st|nd|rd|th)", lambda m: ordinal_words(int(m.group(1))), text)
    return re.sub(r"[0-9]+", lambda m: _year_or_number(int(m.group())), text)


def normalize(text: str) -> str:
    text = _PUNCTUATION_RE.sub(lambda m: PUNCTUATION_MAP[m.group()], text)
    text = read_numbers(text)
    text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    text = text.replace("%", " percent")
    text = re.sub(r"[^ A-Za-z'.,?!\-]", "", text)
    text = re.sub(r"(?i)i\.e\.", "that is", text)
    text = re.sub(r"(?i)e\.g\.", "for example", text)
    text = re.sub(r"(?<!^)(?<![\s])([A-Z])", r" \1", text)  # CamelCase and ALLCAPS: one word per capital
    return _REPEATED_MARKS.sub(r"\1", text)


# ---- the neural G2P for unknown words --------------------------------------------------------
class G2PNet:
    """g2p_en's GRU encoder-decoder: letters → ARPAbet, greedy, at most 20 phones."""

    GRAPHEMES = ("<pad>", "<unk>", "</s>", *"abcdefghijklmnopqrstuvwxyz")
    PHONEMES = ("<pad>", "<unk>", "<s>", "</s>", "AA0", "AA1", "AA2", "AE0", "AE1", "AE2", "AH0", "AH1", "AH2",
                "AO0", "AO1", "AO2", "AW0", "AW1", "AW2", "AY0", "AY1", "AY2", "B", "CH", "D", "DH", "EH0", "EH1",
                "EH2", "ER0", "ER1", "ER2", "EY0", "EY1", "EY2", "F", "G", "HH", "IH0", "IH1", "IH2", "IY0", "IY1",
                "IY2", "JH", "K", "L", "M", "N", "NG", "OW0", "OW1", "OW2", "OY0", "OY1", "OY2", "P", "R", "S", "SH",
                "T", "TH", "UH0", "UH1", "UH2", "UW", "UW0", "UW1", "UW2", "V", "W", "Y", "Z", "ZH")
    START, END, MAX_PHONES = 2, 3, 20

    def __init__(self, path: Path) -> None:
        with np.load(path) as data:  # allow_pickle stays False: arrays only
            self.w = {k: data[k].astype(np.float32) for k in data.files}

    @staticmethod
    def _cell(x: np.ndarray, h: np.ndarray, w_ih: np.ndarray, w_hh: np.ndarray, b_ih: np.ndarray,
              b_hh: np.ndarray) -> np.ndarray:
        gi, gh = x @ w_ih.T + b_ih, h @ w_hh.T + b_hh
        split = gi.shape[-1] * 2 // 3
        rz = 1 / (1 + np.exp(-(gi[:, :split] + gh[:, :split])))
        r, z = np.split(rz, 2, -1)
        n = np.tanh(gi[:, split:] + r * gh[:, split:])
        return (1 - z) * n + z * h

    def __call__(self, word: str) -> list[str]:
        w = self.w
        index = {g: i for i, g in enumerate(self.GRAPHEMES)}
        ids = [index.get(c, 1) for c in word] + [index["</s>"]]
        h = np.zeros((1, w["enc_w_hh"].shape[1]), np.float32)
        for i in ids:
            h = self._cell(w["enc_emb"][[i]], h, w["enc_w_ih"], w["enc_w_hh"], w["enc_b_ih"], w["enc_b_hh"])
        out: list[str] = []
        prev = self.START
        for _ in range(self.MAX_PHONES):
            h = self._cell(w["dec_emb"][[prev]], h, w["dec_w_ih"], w["dec_w_hh"], w["dec_b_ih"], w["dec_b_hh"])
            prev = int((h @ w["fc_w"].T + w["fc_b"]).argmax())
            if prev == self.END:
                break
            out.append(self.PHONEMES[prev])
        return out


# ---- lexicon ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Lexicon:
    """Upstream's English dictionary (`LEXICON`'s sections applied in order) and its names."""

    words: dict[str, list[str]]
    names: dict[str, list[str]]


def read_lexicon(path: Path) -> Lexicon:
    """`LEXICON`: the base (CMUdict 0.7b), then the newer CMUdict's words the base lacks, then
    upstream's hot words over both, less the abbreviations it spells; names apart."""
    found = read_lists(path)
    missing = [name for name in SECTIONS if name not in found]
    if missing:
        raise ValueError(f"{path}: no section {', '.join(missing)}; is it the lexicon this frontend ships?")
    sections = {name: dict(_entry(line) for line in found[name]) for name in SECTIONS}
    words = dict(sections["base"])
    for word, phones in sections["fast"].items():
        words.setdefault(word, phones)
    words.update(sections["hot"])
    for word in SPELLED:
        words.pop(word, None)
    return Lexicon(words, sections["names"])


def _entry(line: str) -> tuple[str, list[str]]:
    word, *phones = line.split()
    return word, phones


Homograph = tuple[list[str], list[str], str]


def read_homographs(path: Path) -> dict[str, Homograph]:
    """g2p_en's ``word|reading1|reading2|tag`` lines (reading1 where a word's part-of-speech tag
    starts with tag), with upstream's two corrections."""
    found: dict[str, Homograph] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            word, first, second, tag = line.strip().split("|")
            found[word.lower()] = (first.split(), second.split(), tag)
    found.update(HOMOGRAPH_FIXES)
    return found


def choose(homograph: Homograph, tag: str | None) -> list[str]:
    """A homograph's reading for a token's tag, as g2p_en chooses (a tag shorter than the listed
    one and starting it also takes the first reading: ``VB`` for read's ``VBP``); without a
    tagger (`tag` None), the first reading."""
    first, second, listed = homograph
    if tag is None or tag.startswith(listed) or (len(tag) < len(listed) and listed.startswith(tag)):
        return first
    return second


# ---- part-of-speech tags for homographs ------------------------------------------------------
TAGGER_RESOURCE = "taggers/averaged_perceptron_tagger_eng/"
TAGGER_FALLBACK = "the first listed reading of each homograph (no NLTK tagger data)"


@cache
def _tagger() -> Any:
    """NLTK's averaged perceptron tagger when its data is already on this machine (NLTK's data
    path: ``NLTK_DATA``, ``~/nltk_data``, the environment's ``nltk_data``...), else None, said
    once. Nothing is downloaded: upstream's g2p_en import downloads it instead."""
    import nltk.data

    try:
        nltk.data.find(TAGGER_RESOURCE)
    except LookupError:
        log.warning("GPT-SoVITS English: NLTK's tagger data (%s) is not on this machine, so homographs "
                    "(read, used, record...) take their first listed reading, not the one their part of "
                    "speech picks", TAGGER_RESOURCE.rstrip("/"))
        return None
    from nltk.tag.perceptron import PerceptronTagger

    return PerceptronTagger()


def homograph_source() -> str:
    """How homographs are read on this machine (for logs and reports)."""
    return TAGGER_FALLBACK if _tagger() is None else f"NLTK's averaged perceptron tagger ({TAGGER_RESOURCE})"


def tags(tokens: list[str]) -> list[str | None]:
    """Each token's Penn Treebank tag, or None for all of them without the tagger."""
    tagger = _tagger()
    if tagger is None:
        return [None] * len(tokens)
    return [tag for _, tag in tagger.tag(tokens)]


class EnglishG2P:
    """Upstream's English G2P: tokens as NLTK's tweet tokenizer cuts them, homographs by their
    tag, dictionary and names, short unknown words spelled, possessives, compounds cut with
    wordsegment, and `G2PNet` for the rest."""

    def __init__(self) -> None:
        try:
            import wordsegment
            from nltk.tokenize.casual import TweetTokenizer
        except ImportError as exc:
            from .hints import install_hint

            raise ImportError(f"the English frontend needs wordsegment and nltk ({install_hint()})") from exc
        wordsegment.load()  # its unigram and bigram counts ship in the package
        self.segment = wordsegment.segment
        self.tokenize = TweetTokenizer().tokenize
        self.lexicon = read_lexicon(LEXICON)
        self.homographs = read_homographs(package_file("g2p_en", "homographs.en"))
        self.net = G2PNet(package_file("g2p_en", "checkpoint20.npz"))

    def word(self, original: str) -> list[str]:
        word, words = original.lower(), self.lexicon.words
        if len(word) > 1 and word in words:
            return words[word]
        if original.istitle() and word in self.lexicon.names:
            return self.lexicon.names[word]
        if len(word) <= 3:  # short unknown words are spelled out
            return [p for c in word for p in (["EY1"] if c == "a" else words[c] if c.isalpha() else [c])]
        if re.fullmatch(r"[a-z]+'s", word):
            phones = list(self.word(word[:-2]))
            ending = ["S"] if phones[-1] in VOICELESS else ["AH0", "Z"] if phones[-1] in SIBILANT else ["Z"]
            return phones + ending
        parts = self.segment(word)
        if len(parts) == 1:
            return self.net(word)
        return [p for part in parts for p in self.word(part)]

    def __call__(self, text: str) -> list[str]:
        tokens = self.tokenize(text)
        phones: list[str] = []
        for token, tag in zip(tokens, tags(tokens)):
            word = token.lower()
            if re.search("[a-z]", word) is None:
                phones.append(word)
            elif len(word) == 1:
                phones += ["EY1"] if token == "A" else self.lexicon.words[word]
            elif word in self.homographs:
                phones += choose(self.homographs[word], tag)
            else:
                phones += self.word(token)
        return [_table_phone(p) for p in phones if _table_phone(p)]


def _table_phone(phone: str) -> str:
    """A phone as the table has it: ``<unk>`` is UNK, an apostrophe a dash, the rest (g2p_en's
    markers, the stressless UW, a dictionary line's comment words) dropped as upstream drops them."""
    if phone == "<unk>":
        return UNK
    if phone == "'":
        return "-"
    return phone if phone in SYMBOL_ID and phone != "UW" else ""


@cache
def _g2p() -> EnglishG2P:
    return EnglishG2P()


def g2p(text: str) -> list[str]:
    """Phonemes of `normalize`d text; fewer than four get a leading comma, as upstream's cleaner adds."""
    phones = _g2p()(text)
    return [","] + phones if len(phones) < 4 else phones
