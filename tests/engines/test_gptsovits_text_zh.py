"""GPT-SoVITS's Chinese frontend against upstream's (issue 26, item 4): the neutral-tone and 儿
word lists, and the normaliser (measure words, numbers read digit by digit, arithmetic, phone
numbers, units, traditional characters, Greek letters, time ranges). Every expected value below
is what upstream's ``chinese2`` gives on its path without g2pW (text_normalize, then g2p),
recorded outside the repository; nothing here runs upstream.

The normaliser is plain Python and runs everywhere; the G2P cases need jieba and pypinyin
(requirements/gptsovits.txt) and skip without them.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from mizuoto_runtime.engines.gptsovits.text import chinese, lexicon, sandhi, zh_normalizer
from mizuoto_runtime.engines.gptsovits.text.symbols import phoneme_ids

needs_g2p = pytest.mark.skipif(
    any(importlib.util.find_spec(p) is None for p in ("jieba", "pypinyin")),
    reason="jieba and pypinyin are not installed (requirements/gptsovits.txt)")


@needs_g2p
@pytest.mark.parametrize(("text", "expected"), [
    # must_neutral words, also as the second half of a longer word (好朋友)
    ("我的好朋友喜欢吃东西。", "w o3 d e5 h ao3 p eng2 y ou5 x i3 h uan5 ch ir1 d ong1 x i5 ."),
    ("这件衣服的意思，事情很麻烦。", "zh e4 j ian4 y i1 f u5 d e5 y i4 s i05 , sh ir4 q ing5 h en3 m a2 f an5 ."),
    ("小伙子很结实。", "x iao3 h uo5 z i05 h en3 j ie1 sh ir5 ."),
    # must_not_neutral: 学子 and 石子 keep 子's tone, 想想 its repeated syllable's
    ("我们都是学子。", "w o3 m en5 d ou1 sh ir4 x ve2 z i03 ."),
    ("电子和原子，瓜子和石子。", "d ian4 z i05 h e2 y van2 z i05 , g ua1 z i05 h e2 sh ir2 z i03 ."),
    ("人人都想想。", "r en2 r en2 d ou1 x iang2 x iang3 ."),
    # 儿: not_erhua words read er2, must_erhua words take the syllable before's tone, others too
    ("女儿和花儿，鸟儿和婴儿。", "n v3 EE er2 h e2 h ua1 EE er2 , n iao3 EE er2 h e2 y ing1 EE er2 ."),
    ("媳妇儿在胡同儿里。", "x i2 f u5 EE er5 z ai4 h u2 t ong5 EE er5 l i3 ."),
    ("小孩儿等一会儿，有点儿。", "x iao3 h ai2 EE er2 d eng3 y i2 h ui4 EE er4 , y ou2 d ian3 EE er3 ."),
    ("一天不去，看一看，第一。", "y i4 t ian1 b u2 q v4 , k an4 y i5 k an4 , d i4 y i1 ."),
])
def test_g2p_gives_upstreams_phonemes(text: str, expected: str) -> None:
    phones, word2ph = chinese.g2p(chinese.normalize(text))
    assert " ".join(phones) == expected
    assert sum(word2ph) == len(phones) and len(word2ph) == len(chinese.normalize(text))


@needs_g2p
@pytest.mark.parametrize(("text", "ids"), [
    ("我的好朋友喜欢吃东西。", [316, 232, 127, 134, 158, 119, 245, 146, 318, 244, 317, 168, 158, 274, 125, 211, 127,
                           235, 317, 170, 3]),
    ("女儿和花儿。", [227, 298, 33, 151, 158, 131, 158, 260, 33, 151, 3]),
])
def test_phoneme_ids_are_upstreams(text: str, ids: list[int]) -> None:
    phones, _ = chinese.g2p(chinese.normalize(text))
    assert phoneme_ids(phones) == ids


@pytest.mark.parametrize(("text", "normalised"), [
    ("我买了2斤苹果和3两茶叶。", "我买了两斤苹果和三两茶叶."),  # a 2 before a measure word is 两
    ("他住在302室，这是第100次。", "他住在三零二室,这是第幺零零次."),  # no measure word: digit by digit
    ("一共有1,234,567人。", "一共有一,二三四,五百六十七人."),
    ("20多个人，2+个。", "二十多个人,两多个."),
    ("请拨打010-12345678。", "请拨打零幺零减幺二三四五六七八."),  # arithmetic comes before phone numbers
    ("请拨打400-123-4567。", "请拨打四零零减幺二三减四五六七."),
    ("手机13812345678。", "手机幺三八幺二三四五六七八."),
    ("GPT-SoVITS很好用。", "减很好用."),
    ("3+5=8，x²+y²=r²。", "三加五等于八,的二次方加的二次方等于的二次方."),
    ("版本1.2.3发布了。", "版本一点二点三发布了."),
    ("请注意——前方施工。", "请注意前方施工."),
    ("时速120km/h。", "时速一百二十千米每."),
    ("长25mm。", "长二十五米米."),  # units are replaced wherever their letters stand, m before mm
    ("α和β，①和②。", "阿尔法和贝塔,一和二."),
    ("這個軟體很好。", "这个软体很好."),
    ("我今年２５岁，涨了５０％。", "我今年二十五岁,涨了五十."),  # full-width digits, not full-width marks
    ("会议8:30-9:15开始。", "会议八点半至九点半开始."),  # the second end's 半 comes from the first's minutes
    ("1/4的人，-3度，-5元，.5和3.50。", "四分之一的人,零下三度,负五元,零点五和三点五零."),
    ("98年3月5号，2024-03-05。", "九八年三月五号,二零二四年三月五日."),
    ("5~10天，15℃~25℃。", "五到十天,十五度至二十五度."),
    ("你好\u3000世界。", "你好世界."),
])
def test_normalisation_is_upstreams(text: str, normalised: str) -> None:
    assert chinese.normalize(text) == normalised


@pytest.mark.parametrize(("digits", "read"), [
    ("0", "零"), ("000", "零"), ("10", "十"), ("15", "十五"), ("101", "一百零一"), ("110", "一百一十"),
    ("1005", "一千零五"),
    ("20000", "二万"), ("100000", "十万"), ("123456", "十二万三千四百五十六"), ("100050000", "一亿零五万"), ("", "")])
def test_cardinals(digits: str, read: str) -> None:
    assert zh_normalizer.cardinal(digits) == read


def test_number_with_two_points_is_named() -> None:
    with pytest.raises(ValueError, match="'1.2.3' has more than one decimal point"):
        zh_normalizer.number("1.2.3")


def test_the_word_lists_are_read_from_the_data_file() -> None:
    assert len(sandhi.word_list("must_neutral")) == 420 and "朋友" in sandhi.word_list("must_neutral")
    assert {"男子", "想想"} <= sandhi.word_list("must_not_neutral")
    assert "女儿" in sandhi.word_list("not_erhua") and "媳妇儿" in sandhi.word_list("must_erhua")
    assert len(lexicon.entries(zh_normalizer.DATA_FILE, "traditional")) == 2706


def test_a_missing_or_malformed_data_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lexicon, "DATA", tmp_path)
    with pytest.raises(FileNotFoundError, match="absent.txt"):
        lexicon.lists("absent.txt")
    (tmp_path / "headless.txt").write_text("# a comment\n朋友\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"headless.txt:2: an entry before any \[list\] line"):
        lexicon.lists("headless.txt")
    (tmp_path / "other.txt").write_text("[words]\n朋友\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"other.txt has no \[must_neutral\] list \(it has \['words'\]\)"):
        lexicon.entries("other.txt", "must_neutral")
