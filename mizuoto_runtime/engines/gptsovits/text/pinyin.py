"""Pinyin syllables → the v2 table's Mandarin symbols (opencpop's strict scheme), and pypinyin's
strict initials and finals → whole syllables, as upstream's Chinese frontend spells them.

The scheme splits a syllable at its initial, with these spellings: the apical vowels are ``ir``
(after zh, ch, sh, r) and ``i0`` (after z, c, s); ü is ``v`` (after j, q, x, y and in lv/nv:
``ju`` → ``j v``, ``yuan`` → ``y van``); ``ye`` / ``yan`` are ``y E`` / ``y En``; a syllable
without an initial takes ``AA``, ``EE`` or ``OO`` by its first letter (``ai`` → ``AA ai``).
"""
from __future__ import annotations

INITIALS = ("zh", "ch", "sh", "b", "p", "m", "f", "d", "t", "n", "l", "g", "k", "h", "j", "q", "x", "r", "z",
            "c", "s", "y", "w")
ZERO_INITIAL = {"a": "AA", "e": "EE", "o": "OO"}
RETROFLEX = ("zh", "ch", "sh", "r")
DENTAL = ("z", "c", "s")
PALATAL = ("j", "q", "x", "y")
Y_FINALS = {"e": "E", "an": "En"}
# pypinyin's strict finals after an initial, and whole syllables without one.
WITH_INITIAL = {"uei": "ui", "iou": "iu", "uen": "un"}
ALONE = {"ing": "ying", "i": "yi", "in": "yin", "u": "wu"}
ALONE_FIRST = {"v": "yu", "e": "e", "i": "y", "u": "w"}


def syllable(initial: str, final: str) -> str:
    """The pinyin syllable of pypinyin's strict `initial` and toneless `final`."""
    if initial:
        return initial + WITH_INITIAL.get(final, final)
    if final in ALONE:
        return ALONE[final]
    if final and final[0] in ALONE_FIRST:
        return ALONE_FIRST[final[0]] + final[1:]
    return final


def split(pinyin: str) -> tuple[str, str]:
    """(initial symbol, final symbol without tone) of a toneless pinyin syllable."""
    initial = next((i for i in INITIALS if pinyin.startswith(i) and len(pinyin) > len(i)), "")
    final = pinyin[len(initial):]
    if not initial:
        if final[:1] not in ZERO_INITIAL:
            raise ValueError(f"not a pinyin syllable: {pinyin!r}")
        return ZERO_INITIAL[final[0]], final
    if final == "i" and initial in RETROFLEX:
        return initial, "ir"
    if final == "i" and initial in DENTAL:
        return initial, "i0"
    if initial == "y" and final in Y_FINALS:
        return initial, Y_FINALS[final]
    if initial in PALATAL and final.startswith("u"):
        return initial, "v" + final[1:]
    return initial, final
