"""Mandarin tone sandhi on a sentence's words, as upstream's Chinese frontend applies it (written
from reading its ToneSandhi, which follows PaddleSpeech).

Words come from jieba's part-of-speech cut and are merged first (`merge_words`: 不 with the word
after it, 一 between a repeated verb or before a word, repeated words, runs of third tones of at
most three characters, 儿 with the word before it), so a rule sees the whole unit. Then each
word's finals (pypinyin ``FINALS_TONE3``, neutral tone as 5) change (`modify`): 不 and 一 by the
tone after them, the neutral tone of particles, suffixes and repeated nouns and verbs, and the
third-tone rule inside the word.

The neutral tone also comes from upstream's lexicon (`word_list`, read from
``data/zh_tone_words.txt``): a word, or either half of it, in ``must_neutral`` (朋友, 喜欢, 意思)
ends in the neutral tone, and a word in ``must_not_neutral`` (男子, 想想) keeps the tone of its
repeated syllable or 子/们 suffix. The same file holds the 儿 lists the Chinese frontend reads.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import cache

from . import lexicon

Word = list[str]  # [word, part of speech]
Finals = Callable[[str], list[str]]

PARTICLES = "吧呢哈啊呐噻嘛吖嗨呐哦哒额滴哩哟喽啰耶喔诶"
STRUCTURAL = "的地得"
ASPECT = "了着过"
ASPECT_POS = {"ul", "uz", "ug"}
PLURAL = "们子"
PLACE = "上下里"
PLACE_POS = {"s", "l", "f"}
DIRECTION = "来去"
DIRECTION_BEFORE = "上下进出回过起开"
MEASURE_BEFORE = "几有两半多各整每做是"
YI_PUNCTUATION = "：，；。？！“”‘’':,;.?!"
WORDS_FILE = "zh_tone_words.txt"


@cache
def word_list(name: str) -> frozenset[str]:
    """A list of the lexicon `WORDS_FILE`: ``must_neutral``, ``must_not_neutral``, ``must_erhua``
    or ``not_erhua``."""
    return frozenset(lexicon.entries(WORDS_FILE, name))


def _tone(final: str, tone: str) -> str:
    return final[:-1] + tone


def _all_third(finals: list[str]) -> bool:
    return all(f[-1] == "3" for f in finals)


def split_word(word: str, cut_for_search: Callable[[str], list[str]]) -> list[str]:
    """A word in two: its shortest search sub-word, and the rest on the side it is not on."""
    first = sorted(cut_for_search(word), key=len)[0]
    if word.find(first) == 0:
        return [first, word[len(first):]]
    return [word[: -len(first)], first]


def _bu(word: str, finals: list[str]) -> list[str]:
    if len(word) == 3 and word[1] == "不":  # 看不懂
        finals[1] = _tone(finals[1], "5")
        return finals
    for i, char in enumerate(word):
        if char == "不" and i + 1 < len(word) and finals[i + 1][-1] == "4":  # 不怕
            finals[i] = _tone(finals[i], "2")
    return finals


def _yi(word: str, finals: list[str]) -> list[str]:
    if "一" in word and all(c.isnumeric() for c in word if c != "一"):  # 一零零: read as digits
        return finals
    if len(word) == 3 and word[1] == "一" and word[0] == word[-1]:  # 看一看
        finals[1] = _tone(finals[1], "5")
    elif word.startswith("第一"):
        finals[1] = _tone(finals[1], "1")
    else:
        for i, char in enumerate(word):
            if char == "一" and i + 1 < len(word):
                if finals[i + 1][-1] == "4":  # 一段
                    finals[i] = _tone(finals[i], "2")
                elif word[i + 1] not in YI_PUNCTUATION:  # 一天
                    finals[i] = _tone(finals[i], "4")
    return finals


def _in_must_neutral(word: str) -> bool:
    must = word_list("must_neutral")
    return word in must or word[-2:] in must


def _neutral(word: str, pos: str, finals: list[str], cut_for_search: Callable[[str], list[str]]) -> list[str]:
    kept = word in word_list("must_not_neutral")
    for j in range(1, len(word)):
        if word[j] == word[j - 1] and pos[0] in "nva" and not kept:  # 奶奶, 试试
            finals[j] = _tone(finals[j], "5")
    ge = word.find("个")
    last = word[-1]
    if last in PARTICLES or last in STRUCTURAL:
        finals[-1] = _tone(finals[-1], "5")
    elif len(word) == 1 and word in ASPECT and pos in ASPECT_POS:  # 走了, 看着
        finals[-1] = _tone(finals[-1], "5")
    elif len(word) > 1 and last in PLURAL and pos in {"r", "n"} and not kept:
        finals[-1] = _tone(finals[-1], "5")
    elif len(word) > 1 and last in PLACE and pos in PLACE_POS:  # 桌上, 家里
        finals[-1] = _tone(finals[-1], "5")
    elif len(word) > 1 and last in DIRECTION and word[-2] in DIRECTION_BEFORE:  # 上来, 下去
        finals[-1] = _tone(finals[-1], "5")
    elif (ge >= 1 and (word[ge - 1].isnumeric() or word[ge - 1] in MEASURE_BEFORE)) or word == "个":
        finals[ge] = _tone(finals[ge], "5")
    elif _in_must_neutral(word):  # 朋友
        finals[-1] = _tone(finals[-1], "5")
    parts = split_word(word, cut_for_search)
    halves = [finals[: len(parts[0])], finals[len(parts[0]):]]
    for half, part in zip(halves, parts):
        if _in_must_neutral(part):  # 好/朋友: the lexicon word inside a longer one
            half[-1] = _tone(half[-1], "5")
    return halves[0] + halves[1]


def _third(word: str, finals: list[str], cut_for_search: Callable[[str], list[str]]) -> list[str]:
    if len(word) == 2 and _all_third(finals):
        finals[0] = _tone(finals[0], "2")
    elif len(word) == 3:
        parts = split_word(word, cut_for_search)
        if _all_third(finals):
            if len(parts[0]) == 2:  # 蒙古/包
                finals[0], finals[1] = _tone(finals[0], "2"), _tone(finals[1], "2")
            elif len(parts[0]) == 1:  # 纸/老虎
                finals[1] = _tone(finals[1], "2")
        else:
            halves = [finals[: len(parts[0])], finals[len(parts[0]):]]
            for i, sub in enumerate(halves):
                if _all_third(sub) and len(sub) == 2:  # 所有/人
                    sub[0] = _tone(sub[0], "2")
                elif i == 1 and not _all_third(sub) and sub[0][-1] == "3" and halves[0][-1][-1] == "3":  # 好/喜欢
                    halves[0][-1] = _tone(halves[0][-1], "2")
            finals = halves[0] + halves[1]
    elif len(word) == 4:  # an idiom: two words of two
        finals = [*_third_pair(finals[:2]), *_third_pair(finals[2:])]
    return finals


def _third_pair(finals: list[str]) -> list[str]:
    return [_tone(finals[0], "2"), *finals[1:]] if _all_third(finals) else finals


def modify(word: str, pos: str, finals: list[str], cut_for_search: Callable[[str], list[str]]) -> list[str]:
    finals = _bu(word, list(finals))
    finals = _yi(word, finals)
    finals = _neutral(word, pos, finals, cut_for_search)
    return _third(word, finals, cut_for_search)


# ---- merging words before the rules ------------------------------------------------------------
def _merge_bu(seg: list[Word]) -> list[Word]:
    out: list[Word] = []
    last = ""
    for word, pos in seg:
        if last == "不":
            word = last + word
        if word != "不":
            out.append([word, pos])
        last = word
    if last == "不":
        out.append([last, "d"])
    return out


def _merge_yi(seg: list[Word]) -> list[Word]:
    out: list[Word] = []
    i = 0
    while i < len(seg):  # 听 一 听 → 听一听
        word, pos = seg[i]
        if i >= 1 and word == "一" and i + 1 < len(seg):
            last = out[-1] if out else seg[i - 1]
            after = seg[i + 1]
            if last[0] == after[0] and last[1] == "v" and after[1] == "v":
                out[-1] = [last[0] + "一" + after[0], last[1]]
                i += 2
                continue
        out.append([word, pos])
        i += 1
    merged: list[Word] = []
    for word, pos in out:  # 一 with the word after it
        if merged and merged[-1][0] == "一":
            merged[-1][0] += word
        else:
            merged.append([word, pos])
    return merged


def _merge_repeated(seg: list[Word]) -> list[Word]:
    out: list[Word] = []
    for word, pos in seg:
        if out and word == out[-1][0]:
            out[-1][0] += word
        else:
            out.append([word, pos])
    return out


def _is_reduplication(word: str) -> bool:
    return len(word) == 2 and word[0] == word[1]


def _merge_thirds(seg: list[Word], finals: Finals, whole: bool) -> list[Word]:
    """Runs of third tones of at most three characters: whole words all in tone 3 (`whole`), or
    a word ending and the next starting in tone 3."""
    tones = [finals(word) for word, _ in seg]
    out: list[Word] = []
    merged_last = False
    for i, (word, pos) in enumerate(seg):
        joins = i >= 1 and not merged_last and (
            (_all_third(tones[i - 1]) and _all_third(tones[i])) if whole
            else (tones[i - 1][-1][-1] == "3" and tones[i][0][-1] == "3"))
        merged_last = False
        if joins and not _is_reduplication(seg[i - 1][0]) and len(seg[i - 1][0]) + len(word) <= 3:
            out[-1][0] += word
            merged_last = True
        else:
            out.append([word, pos])
    return out


def _merge_er(seg: list[Word]) -> list[Word]:
    out: list[Word] = []
    for i, (word, pos) in enumerate(seg):
        if i >= 1 and word == "儿" and seg[i - 1][0] != "#":
            out[-1][0] += word
        else:
            out.append([word, pos])
    return out


def merge_words(seg: list[tuple[str, str]], finals: Finals) -> list[Word]:
    words = _merge_repeated(_merge_yi(_merge_bu([[w, p] for w, p in seg])))
    words = _merge_thirds(words, finals, whole=True)
    words = _merge_thirds(words, finals, whole=False)
    return _merge_er(words)
