"""The v2 phoneme table: a phoneme's id is its index, as GPT-SoVITS v2 / v2Pro number them.

Upstream builds the table from its inventories: the sorted set of the pad ``_``, the Mandarin
initials and toned finals (opencpop's scheme, with ``AA``/``EE``/``OO`` for syllables without an
initial), the OpenJTalk phones, the punctuation and pause marks and the ARPAbet phones; then
``[`` and ``]`` (Japanese pitch rise and fall); then Korean and Cantonese symbols, which this
frontend never produces (only their count matters: none comes before an id we give). The
inventories are written here from the phonetics they describe, and the table is built the same
way; `tests/engines/test_gptsovits_text.py` checks the ids upstream's frontend is recorded to give.
"""
from __future__ import annotations

PAD = "_"
UNK = "UNK"
PUNCTUATION = ("!", "?", "…", ",", ".", "-")
PAUSES = ("SP", "SP2", "SP3", UNK)

ZH_INITIALS = ("AA", "EE", "OO", "b", "c", "ch", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "q", "r", "s",
               "sh", "t", "w", "x", "y", "z", "zh")
# Finals without tone: ``i0`` after z/c/s, ``ir`` after zh/ch/sh/r, ``E``/``En`` in ye/yan, ``v*`` for ü.
ZH_FINALS = ("E", "En", "a", "ai", "an", "ang", "ao", "e", "ei", "en", "eng", "er", "i", "i0", "ia", "ian", "iang",
             "iao", "ie", "in", "ing", "iong", "ir", "iu", "o", "ong", "ou", "u", "ua", "uai", "uan", "uang", "ui",
             "un", "uo", "v", "van", "ve", "vn")
TONES = "12345"
JA_PHONES = ("I", "N", "U", "a", "b", "by", "ch", "cl", "d", "dy", "e", "f", "g", "gy", "h", "hy", "i", "j", "k",
             "ky", "m", "my", "n", "ny", "o", "p", "py", "r", "ry", "s", "sh", "t", "ts", "u", "v", "w", "y", "z")
ARPA_VOWELS = ("AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW")
ARPA_CONSONANTS = ("B", "CH", "D", "DH", "F", "G", "HH", "JH", "K", "L", "M", "N", "NG", "P", "R", "S", "SH", "T",
                   "TH", "V", "W", "Y", "Z", "ZH")
# Upstream's ARPAbet set also holds two vowels without stress.
ARPA = tuple(f"{v}{s}" for v in ARPA_VOWELS for s in "012") + ("ER", "IH") + ARPA_CONSONANTS
PITCH_MARKS = ("[", "]")
KOREAN_COUNT = 29  # after the pitch marks; never produced here
CANTONESE_COUNT = 379
TABLE_SIZE = 732  # what the T2S phoneme embedding of v2 / v2Pro holds


def _table() -> list[str]:
    zh_finals = [f + t for f in ZH_FINALS for t in TONES]
    base = sorted({PAD, *ZH_INITIALS, *zh_finals, *JA_PHONES, *PUNCTUATION, *PAUSES, *ARPA})
    return base + list(PITCH_MARKS)


SYMBOLS: tuple[str, ...] = tuple(_table())
SYMBOL_ID: dict[str, int] = {s: i for i, s in enumerate(SYMBOLS)}
assert len(SYMBOLS) + KOREAN_COUNT + CANTONESE_COUNT == TABLE_SIZE


def phoneme_ids(phones: list[str]) -> list[int]:
    """Ids of `phones`; a phone outside the table is ``UNK``, as upstream's cleaner makes it."""
    return [SYMBOL_ID.get(p, SYMBOL_ID[UNK]) for p in phones]
