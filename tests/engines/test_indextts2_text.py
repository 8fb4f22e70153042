"""IndexTTS-2's text front end (issue 25): upstream's protections around the number grammars
(pronunciation annotations, technical terms, names, pinyin with tones, English contractions,
e-mail addresses), the model folder's glossary, and the token ids that reach the GPT.

Every expected string below is what upstream's own front end (index-tts ee40fa7, with the
glossary GLOSSARY) printed for the input, recorded by hand: upstream is never run here. They were
chosen where WeTextProcessing 1.0.4.1 (upstream's lock), 1.2 and wetext agree, so they hold with
whichever grammars are installed; both installed grammars are checked on them."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import require_engine

if not any(importlib.util.find_spec(p) for p in ("tn", "wetext")):
    pytest.skip("IndexTTS-2's number grammars need WeTextProcessing or wetext", allow_module_level=True)
pytest.importorskip("yaml", reason="the glossary is YAML")

from mizuoto_runtime import MizuotoError  # noqa: E402
from mizuoto_runtime.engines.indextts2.text import (  # noqa: E402
    GLOSSARY_FILE,
    Glossary,
    Normalizer,
    TextTokenizer,
    compiled_grammar_folder,
    wetext_grammars,
    wetextprocessing_grammars,
)

REPO = Path(__file__).resolve().parents[2]

GLOSSARY = """\
M.2:
  en: M dot two
  zh: M 二
PCIe 5.0:
  en: PCIE five
  zh: PCIE 五点零
"C++":
  en: C plus plus
  zh: C 加加
"C#": C sharp
CMake: C Make
TTS: T T S
AHCI: A H C I
"""

PROTECTED = {
    # <word|reading> passes the grammars untouched (the digit in a reading stays a digit)
    "这个<行|XING2>业很好": "这个<行|XING2>业很好",
    "他<长|ZHANG3>大了，有<2|LIANG3>个孩子": "他<长|ZHANG3>大了,有<2|LIANG3>个孩子",
    "<银行|YIN2 HANG2>在3楼": "<银行|YIN2 HANG2>在三楼",
    "I read <read|RED> 3 books": "I read <read|RED> three books",
    "<a|b>-5": "<a|b>-five",
    # a technical term's hyphen is not a minus; its digits are still read
    "GPT-5-Nano 是 GPT-5 模型家族中最小且速度最快的变体": "GPT-五-Nano 是 GPT-五 模型家族中最小且速度最快的变体",
    "GPT-5-Nano is the smallest and fastest variant in the GPT-5 model family.":
        "GPT-five-Nano is the smallest and fastest variant in the GPT-five model family.",
    "我用Qwen-2.5和Llama-3做实验": "我用Qwen-二点五和Llama-三做实验",
    # a phone number starts with a digit: the grammars read it
    "电话：135-4567-8900": "电话,一三五四五六七八九零零",
    # a name (its whole run of Han characters) is kept as written, traditional characters too,
    # while the rest is simplified as WeTextProcessing's Chinese normaliser does
    "他說喬治·華盛頓是總統，有3個孩子": "他說喬治-華盛頓是總統,有三个孩子",
    "電話號碼是一二三": "电话号码是一二三",
    # pinyin with a tone digit: kept, j/q/x + u written with v and upper-cased
    "晕XUAN4是一种GAN3觉": "晕XVAN4是一种GAN3觉",
    "这个字读jve2还是jue2": "这个字读JVE2还是JVE2",
    "xu1 qu4 ju3 lv4": "XV1 QV4 JV3 lv4",
    "受不liao3你了": "受不liao3你了",
    "ni3 hao3": "ni3 hao3",
    # not pinyin: read as numbers
    "用beta1测试": "用beta一测试",
    "have you ever been to beta2?": "have you ever been to beta two?",
    # English contractions, with no word boundary (as upstream)
    "where's the money?": "where is the money?",
    "Here's the thing: there's no time.": "Here is the thing, there is no time.",
    "今天是个好日子 it's a good day": "今天是个好日子 it is a good day",
    "visit's": "visit is",
    # an e-mail address alone is read by the Chinese grammars, inside English text by the English
    "联系邮箱是abc@qq.com": "联系邮箱是abc@qq.com",
    "Email me at test@example.com": "Email me at test at example dot com",
    # double quotes come back as apostrophes, never escaped with a backslash (wetext's own habit)
    'He said "I have 3 cats".': "He said 'I have three cats'.",
    '他说"你好"，然后走了3步': "他说'你好',然后走了三步",
}

GLOSSED = {
    "我在用C++和C#写CMake脚本": "我在用C 加加和C sharp写C Make脚本",
    "I use C++ every day": "I use C plus plus every day",
    "M.2 接口和PCIe 5.0": "M 二 接口和PCIE 五点零",
    "Use PCIe 5.0 now": "Use PCIE five now",
    "pcie 5.0很快": "PCIE 五点零很快",
    "TTS is great, so is AHCI": "T T S is great, so is A H C I",
    "2025/09/08 IndexTTS-2 全球发布": "二零二五年九月八日 IndexT T S-二 全球发布",
    "<TTS|T T S>和tts": "<TTS|T T S>和T T S",
}


@pytest.fixture(scope="module", params=["WeTextProcessing", "wetext"])
def grammars(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    """Each installed backend: WeTextProcessing (Linux, compiled once per machine) and wetext."""
    found = wetextprocessing_grammars() if request.param == "WeTextProcessing" else wetext_grammars()
    if found is None:
        pytest.skip(f"{request.param} is not installed")
    return found


@pytest.fixture(scope="module")
def normalize(grammars: tuple[Any, Any]) -> Normalizer:
    return Normalizer(grammars=grammars)


@pytest.fixture(scope="module")
def glossary_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("indextts2") / GLOSSARY_FILE
    path.write_text(GLOSSARY, encoding="utf-8")
    return path


@pytest.mark.parametrize("text", list(PROTECTED))
def test_protected_text_normalises_as_upstream(normalize: Normalizer, text: str) -> None:
    assert normalize(text) == PROTECTED[text]


@pytest.mark.parametrize("text", list(GLOSSED))
def test_the_glossary_reads_terms_per_language(glossary_file: Path, grammars: tuple[Any, Any], text: str) -> None:
    """Per-language readings, matched case-insensitively, longest term first, applied before the
    protections and the grammars; never inside a <word|reading> annotation."""
    glossary = Glossary.load(glossary_file)
    assert Normalizer(glossary, grammars)(text) == GLOSSED[text]


def test_wetextprocessing_is_the_default_where_installed() -> None:
    """With WeTextProcessing installed (Linux x86_64) its own normalisers run by default, as
    upstream's on Linux; elsewhere wetext's."""
    expected = "tn.chinese.normalizer" if importlib.util.find_spec("tn") else "mizuoto_runtime.engines.indextts2.text"
    assert type(Normalizer()._zh).__module__ == expected


# Where WeTextProcessing 1.0.4.1 (upstream's lock) reads differently from wetext, as upstream
# printed it on Linux: grammars that were not upstream's Linux ones would fail here.
LINUX_ONLY = {"这台电脑有16GB内存和512GB硬盘": "这台电脑有十六GB内存和五幺二GB硬盘", "房号1203": "房号一千两百零三"}


def test_wetextprocessing_reads_as_upstreams_lock() -> None:
    found = wetextprocessing_grammars()
    if found is None:
        pytest.skip("WeTextProcessing is not installed")
    assert {text: Normalizer(grammars=found)(text) for text in LINUX_ONLY} == LINUX_ONLY


def fake_compile(calls: list[str], pause: float = 0.0) -> Any:
    def compile_into(scratch: Path) -> None:
        calls.append(scratch.name)
        time.sleep(pause)
        for name in ("a.fst", "b.fst"):
            (scratch / name).write_text(name)
    return compile_into


def test_the_grammar_is_compiled_once_per_machine(tmp_path: Path) -> None:
    """Compiled into a scratch folder, renamed into place, found there afterwards; two processes
    at once (threads here: the lock is per open file) compile once, the second waits."""
    folder, calls = tmp_path / "cache" / "zh-tn", []
    threads = [threading.Thread(target=compiled_grammar_folder,
                                args=(folder, ("a.fst", "b.fst"), fake_compile(calls, 0.3))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and (folder / "b.fst").read_text() == "b.fst"
    assert compiled_grammar_folder(folder, ("a.fst", "b.fst"), fake_compile(calls)) == folder and len(calls) == 1
    assert sorted(p.name for p in folder.parent.iterdir()) == ["zh-tn", "zh-tn.lock"]  # no scratch left


def test_an_incomplete_grammar_folder_is_compiled_again(tmp_path: Path) -> None:
    folder, calls = tmp_path / "zh-tn", []
    folder.mkdir()
    (folder / "a.fst").write_text("half")
    compiled_grammar_folder(folder, ("a.fst", "b.fst"), fake_compile(calls))
    assert len(calls) == 1 and (folder / "a.fst").read_text() == "a.fst"


def test_a_compile_that_writes_nothing_is_one_error_and_leaves_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "zh-tn"
    with pytest.raises(MizuotoError, match="b.fst"):
        compiled_grammar_folder(folder, ("a.fst", "b.fst"), lambda scratch: (scratch / "a.fst").write_text("a"))
    assert not folder.exists() and [p.name for p in tmp_path.iterdir()] == ["zh-tn.lock"]


SOAK_SENTENCES = ["他说2025年9月8日发布，价格是1/2折，电话：135-4567-8900", "GPT-5-Nano 是 GPT-5 模型",
                  "I have 3 cats and $4.50.", "晕XUAN4是一种GAN3觉，温度-3℃"]


@pytest.mark.soak
def test_a_fresh_compile_reads_as_the_cached_grammar(tmp_path: Path) -> None:
    """WeTextProcessing's Chinese grammar compiled from nothing (about a minute, several GB) in a
    new cache folder reads every sentence as the machine's cached one does."""
    found = wetextprocessing_grammars()
    if found is None:
        pytest.skip("WeTextProcessing is not installed")
    cached = [Normalizer(grammars=found)(s) for s in SOAK_SENTENCES]
    script = ("import sys\nfrom mizuoto_runtime.engines.indextts2.text import Normalizer\nn = Normalizer()\n"
              "print('\\n'.join(n(s) for s in sys.argv[1:]))")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script, *SOAK_SENTENCES], env=env, capture_output=True, text=True,
                          check=True)
    assert done.stdout.splitlines() == cached
    assert len(list((tmp_path / "mizuoto").glob("wetextprocessing-*-zh-tn/zh_tn_tagger.fst"))) == 1


def test_a_missing_or_empty_glossary_is_none(tmp_path: Path) -> None:
    assert Glossary.load(tmp_path / GLOSSARY_FILE) is None
    (tmp_path / GLOSSARY_FILE).write_text("# no terms yet\n", encoding="utf-8")
    assert Glossary.load(tmp_path / GLOSSARY_FILE) is None


@pytest.mark.parametrize(("content", "named"), [
    ("TTS: [T, T, S]\n", "'TTS'"),
    ("TTS:\n", "'TTS'"),
    ("M.2:\n  en: 2\n", "'M.2'"),
    ("5.0: five\n", "5.0"),
    ("- TTS\n", "list"),
    ("TTS: [unclosed\n", "not readable YAML"),
])
def test_a_bad_glossary_is_one_error_naming_file_and_key(tmp_path: Path, content: str, named: str) -> None:
    path = tmp_path / GLOSSARY_FILE
    path.write_text(content, encoding="utf-8")
    with pytest.raises(MizuotoError) as info:
        Glossary.load(path)
    assert str(path) in str(info.value) and named in str(info.value)


# What the SentencePiece model below is trained on (fixed here, so adding a case elsewhere does
# not change its ids): a few sentences after upstream's normaliser and CJK split.
BPE_CORPUS = [
    "这 个 <行|XING2> 业 很 好", "他 <长|ZHANG3> 大 了 , 有 <2|LIANG3> 个 孩 子", "XV1 QV4 JV3 LV4",
    "GPT-五-NANO 是 GPT-五 模 型 家 族 中 最 小 且 速 度 最 快 的 变 体", "I USE C PLUS PLUS EVERY DAY",
    "我 在 用 C 加 加 和 C SHARP 写 C MAKE 脚 本", "晕 XVAN4 是 一 种 GAN3 觉", "WHERE IS THE MONEY?",
]


def write_bpe(folder: Path) -> Path:
    """A small BPE model (deterministic: one thread)."""
    spm = pytest.importorskip("sentencepiece", reason="IndexTTS-2's tokenizer is SentencePiece")
    (folder / "corpus.txt").write_text("\n".join(BPE_CORPUS * 3) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(folder / "corpus.txt"), model_prefix=str(folder / "bpe"),
                                   vocab_size=200, model_type="bpe", character_coverage=1.0, bos_id=0,
                                   eos_id=1, unk_id=2, pad_id=-1, hard_vocab_limit=False, num_threads=1,
                                   minloglevel=2)
    return folder / "bpe.model"


TOKEN_IDS = {
    "这个<行|XING2>业很好": [76, 15, 6, 124, 195, 124, 146, 94, 24, 46, 63, 57],
    "xu1 qu4 ju3 lv4": [21, 156, 89, 138, 87, 132, 88, 138],
    "GPT-5-Nano 是 GPT-5 模型": [22, 137, 124, 151, 124, 137, 92, 17, 22, 137, 124, 151, 70, 55],
    "我在用C++和C#写CMake脚本": [65, 54, 71, 4, 16, 16, 53, 4, 106, 51, 4, 102, 74, 69],
    "a": [124, 2],
}


def test_token_ids_are_upstreams(tmp_path: Path, glossary_file: Path) -> None:
    """The ids the GPT gets: normalised, every CJK character its own upper-cased word, then
    SentencePiece (one character alone skips the normaliser)."""
    tokenizer = TextTokenizer(write_bpe(tmp_path), glossary_file)
    got = {text: tokenizer.ids(tokenizer.tokens(text)) for text in TOKEN_IDS}
    assert got == TOKEN_IDS


def test_the_engine_reads_the_glossary_in_its_model_folder(tmp_path: Path) -> None:
    """`glossary.yaml` beside `config.yaml` is read when the engine loads (as upstream's); a bad
    one stops the load with the error naming it."""
    require_engine("indextts2")
    from mizuoto_runtime import Runtime
    from mizuoto_runtime.engines.indextts2.tiny import write

    folder = write(tmp_path / "indextts2")
    (folder / GLOSSARY_FILE).write_text(GLOSSARY, encoding="utf-8")
    engine = Runtime().engine("indextts2", folder)
    assert engine.tokenizer.normalize("I use C++ every day") == "I use C plus plus every day"
    (folder / GLOSSARY_FILE).write_text("C++: [C, plus, plus]\n", encoding="utf-8")
    with pytest.raises(MizuotoError, match=r"glossary\.yaml.*'C\+\+'"):
        Runtime().engine("indextts2", folder)
