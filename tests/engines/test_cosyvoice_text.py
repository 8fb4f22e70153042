"""CosyVoice's text front end against upstream's (issue 22): normalisation and the sentence
split of ``CosyVoiceFrontEnd.text_normalize``, with and without wetext.

The tables are data: upstream's ``text_normalize(text, split=True)`` and ``(split=False)`` on
each text, recorded by running upstream's front end (commit ace7c47, wetext 0.1.8, inflect
7.3.1) outside this repository, with a one-token-per-byte tokenizer (the tiny checkpoints').
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mizuoto_runtime import MizuotoError, Runtime
from mizuoto_runtime.engines import Sampling

from conftest import require_engine

pytest.importorskip("regex")
inflect = pytest.importorskip("inflect", reason="inflect spells out English digits (requirements/cosyvoice.txt)")
from mizuoto_runtime.engines.cosyvoice import text  # noqa: E402  (needs regex)

Row = tuple[str, list[str], str]

# (text, upstream's sentences, upstream's unsplit normalised text), the same with wetext or without
BOTH: list[Row] = [
    ('Hello there, tiny model.',
     ['Hello there, tiny model.'],
     'Hello there, tiny model.'),
    ('Hello there',
     ['Hello there.'],
     'Hello there'),
    ('This is the first sentence of a fairly long English paragraph that keeps going. This is the second sentence,'
     ' which also has a good number of words in it. A third sentence follows here,'
     ' just to make the text longer than eighty tokens. Short one. And a final short bit.',
     ['This is the first sentence of a fairly long English paragraph that keeps going.',
      ' This is the second sentence, which also has a good number of words in it.',
      ' A third sentence follows here, just to make the text longer than eighty tokens.',
      ' Short one. And a final short bit.'],
     'This is the first sentence of a fairly long English paragraph that keeps going. This is the second sentence,'
     ' which also has a good number of words in it. A third sentence follows here,'
     ' just to make the text longer than eighty tokens. Short one. And a final short bit.'),
    ('One. Two. Three. Four. Five. Six. Seven. Eight. Nine. Ten. Eleven. Twelve. Thirteen. Fourteen. Fifteen.'
     ' Sixteen. Seventeen. Eighteen. Nineteen. Twenty.',
     ['One. Two. Three. Four. Five. Six. Seven. Eight. Nine. Ten. Eleven. Twelve.',
      ' Thirteen. Fourteen. Fifteen. Sixteen. Seventeen. Eighteen. Nineteen. Twenty.'],
     'One. Two. Three. Four. Five. Six. Seven. Eight. Nine. Ten. Eleven. Twelve. Thirteen. Fourteen. Fifteen.'
     ' Sixteen. Seventeen. Eighteen. Nineteen. Twenty.'),
    ('Hi.',
     ['Hi.'],
     'Hi.'),
    ('Hello<|endofprompt|>world. Again.',
     ['Hello<|endofprompt|>world. Again.'],
     'Hello<|endofprompt|>world. Again.'),
    ('收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐，笑容如花儿般绽放。',
     ['收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐，笑容如花儿般绽放。'],
     '收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐，笑容如花儿般绽放。'),
    ('我们走吧。你说呢？好！这是一个很长的句子，它包含了很多很多的字，目的是让整段文字的长度超过八十个字符，从而触发分句的逻辑。第二个长句子也在这里，它同样包含了足够多的汉字，以便我们检查合并的规则是否与上游完全一致。最后一句。',
     ['我们走吧。你说呢？好！这是一个很长的句子，它包含了很多很多的字，目的是让整段文字的长度超过八十个字符，'
      '从而触发分句的逻辑。',
      '第二个长句子也在这里，它同样包含了足够多的汉字，以便我们检查合并的规则是否与上游完全一致。最后一句。'],
     '我们走吧。你说呢？好！这是一个很长的句子，它包含了很多很多的字，目的是让整段文字的长度超过八十个字符，从而触发分句的逻辑。第二个长句子也在这里，它同样包含了足够多的汉字，以便我们检查合并的规则是否与上游完全一致。最后一句。'),
    ('他说：“你好。”然后离开了。她问“为什么？”没有人回答，',
     ['他说：“你好。”然后离开了。她问“为什么？”没有人回答。'],
     '他说：“你好。”然后离开了。她问“为什么？”没有人回答。'),
    ('中文 和 English 混合 text 的 句子, 还有 AI 技术.',
     ['中文和English混合text的句子,还有AI技术。'],
     '中文和English混合text的句子,还有AI技术。'),
    ('第一行\n第二行\n第三行',
     ['第一行第二行第三行。'],
     '第一行第二行第三行'),
    ('，。！',
     [],
     '，。！'),
]
# with wetext installed, where it differs from without
WETEXT: list[Row] = BOTH + [
    ('It costs 25 dollars and 3 cents, on May 5th 2024.',
     ['It costs twenty five dollars and three cents, on May fifth twenty twenty four.'],
     'It costs twenty five dollars and three cents, on May fifth twenty twenty four.'),
    ('The year 1999 was long. We had 12 cats! Did you know? I have 3 dogs; they eat 2 meals: breakfast and dinner',
     ['The year nineteen ninety nine was long. We had twelve cats! Did you know?',
      ' I have three dogs; they eat two meals: breakfast and dinner.'],
     'The year nineteen ninety nine was long. We had twelve cats! Did you know? I have three dogs;'
     ' they eat two meals: breakfast and dinner'),
    ('He said "Stop." Then he left. "Why?" she asked. The end is near, and it comes fast.',
     ['He said \\"Stop.\\" Then he left. \\"Why?\\" she asked. The end is near, and it comes fast.'],
     'He said \\"Stop.\\" Then he left. \\"Why?\\" she asked. The end is near, and it comes fast.'),
    ('今天是2024年5月3日，气温25°C，我买了3.5公斤苹果，花了12.50元。',
     ['今天是二零二四年五月三日，气温二十五摄氏度，我买了三点五公斤苹果，花了十二点五零元。'],
     '今天是二零二四年五月三日，气温二十五摄氏度，我买了三点五公斤苹果，花了十二点五零元。'),
    ('面积是10m²，体积是5m³。（注释）【标题】——结束 - 开始',
     ['面积是十平方米，体积是五立方米。注释标题 结束-开始。'],
     '面积是十平方米，体积是五立方米。注释标题 结束-开始'),
    ('用户说：This is CosyVoice 2 test、测试、',
     ['用户说：This is CosyVoice二test、测试。'],
     '用户说：This is CosyVoice二test、测试。'),
]
# texts wetext itself fails on (upstream raises its AssertionError)
WETEXT_FAILS = ['Room 101 is on floor ² and the x³ term matters, 4²=16.', '!!! ... ???', '   spaces   around   ']
# without wetext (upstream's front end when wetext cannot be imported), where it differs from with
PLAIN: list[Row] = BOTH + [
    ('It costs 25 dollars and 3 cents, on May 5th 2024.',
     ['It costs twenty-five dollars and three cents, on May fiveth two thousand and twenty-four.'],
     'It costs twenty-five dollars and three cents, on May fiveth two thousand and twenty-four.'),
    ('The year 1999 was long. We had 12 cats! Did you know? I have 3 dogs; they eat 2 meals: breakfast and dinner',
     ['The year one thousand, nine hundred and ninety-nine was long.',
      ' We had twelve cats! Did you know? I have three dogs; they eat two meals:',
      ' breakfast and dinner.'],
     'The year one thousand, nine hundred and ninety-nine was long. We had twelve cats! Did you know?'
     ' I have three dogs; they eat two meals: breakfast and dinner'),
    ('He said "Stop." Then he left. "Why?" she asked. The end is near, and it comes fast.',
     ['He said "Stop." Then he left. "Why?" she asked. The end is near, and it comes fast.'],
     'He said "Stop." Then he left. "Why?" she asked. The end is near, and it comes fast.'),
    ('Room 101 is on floor ² and the x³ term matters, 4²=16.',
     ['Room one hundred and one is on floor zero and the xzero term matters, four=sixteen.'],
     'Room one hundred and one is on floor zero and the xzero term matters, four=sixteen.'),
    ('!!! ... ???',
     [' . ?'],
     '!!! ... ???'),
    ('   spaces   around   ',
     ['spaces   around.'],
     'spaces   around'),
    ('今天是2024年5月3日，气温25°C，我买了3.5公斤苹果，花了12.50元。',
     ['今天是2024年5月3日，气温25°C，我买了3。5公斤苹果，花了12。50元。'],
     '今天是2024年5月3日，气温25°C，我买了3。5公斤苹果，花了12。50元。'),
    ('面积是10m²，体积是5m³。（注释）【标题】——结束 - 开始',
     ['面积是10m平方，体积是5m立方。注释标题 结束-开始。'],
     '面积是10m平方，体积是5m立方。注释标题 结束-开始'),
    ('用户说：This is CosyVoice 2 test、测试、',
     ['用户说：This is CosyVoice 2 test、测试。'],
     '用户说：This is CosyVoice 2 test、测试。'),
]


def byte_tokens(s: str) -> int:
    return len(s.encode("utf-8"))


@pytest.fixture
def no_wetext(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(text, "_normalizers", lambda: None)


@pytest.mark.parametrize(("raw", "expected", "whole"), WETEXT)
def test_sentences_equal_upstreams_with_wetext(raw: str, expected: list[str], whole: str) -> None:
    pytest.importorskip("wetext")
    assert text.sentences(raw, byte_tokens) == expected
    assert text.normalize(raw) == whole


@pytest.mark.parametrize("raw", WETEXT_FAILS)
def test_text_wetext_cannot_read_is_one_clear_error(raw: str) -> None:
    pytest.importorskip("wetext")
    with pytest.raises(MizuotoError, match="wetext"):
        text.sentences(raw, byte_tokens)


@pytest.mark.usefixtures("no_wetext")
@pytest.mark.parametrize(("raw", "expected", "whole"), PLAIN)
def test_sentences_equal_upstreams_without_wetext(raw: str, expected: list[str], whole: str) -> None:
    assert text.sentences(raw, byte_tokens) == expected
    assert text.normalize(raw) == whole


def test_split_settings_are_upstreams() -> None:
    """split_paragraph(token_max_n=80, token_min_n=60, merge_len=20, comma_split=False)."""
    assert (text.TOKEN_MAX, text.TOKEN_MIN, text.MERGE_LEN) == (80, 60, 20)
    assert "，" not in text.SENTENCE_MARKS["zh"] and "," not in text.SENTENCE_MARKS["en"]


FIRST = "This is the first sentence of a fairly long English paragraph that keeps going."
SECOND = "This is the second sentence, which also has a good number of words in it."


@pytest.mark.usefixtures("one_torch_thread")
def test_engine_speaks_each_sentence(tmp_path: Path) -> None:
    """The engine splits as upstream does (LM tokens of its own tokenizer), runs one LM per
    sentence, and the first sentence's audio is what that sentence alone gives."""
    require_engine("cosyvoice")
    from mizuoto_runtime.engines.cosyvoice.tiny import write

    rt = Runtime()
    engine = rt.engine("cosyvoice", write(tmp_path, version="2"))
    both = f"{FIRST} {SECOND}"
    assert engine.sentences(both) == text.sentences(both, lambda s: len(engine.tokenizer.encode(s)))
    assert engine.sentences(both) == [FIRST, " " + SECOND]
    sampling = Sampling(seed=4, max_new_tokens=6)
    voice = engine.voice_prompt(rt.request(), speaker="tiny")
    codes = engine.generate(rt.request(), both, voice, sampling)
    lengths = [n for n, _ in codes.extra["sentences"]]
    assert len(lengths) == 2 and sum(lengths) == codes.tokens.shape[1]
    together = rt.say(engine, both, speaker="tiny", sampling=sampling)[0].waveform
    alone = rt.say(engine, FIRST, speaker="tiny", sampling=sampling)[0].waveform
    assert together.shape[-1] > alone.shape[-1]
    assert torch.equal(together[..., :alone.shape[-1]], alone)
    with pytest.raises(MizuotoError, match="punctuation only"):
        engine.sentences("，。！")
