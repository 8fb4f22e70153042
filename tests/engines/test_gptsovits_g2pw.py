"""GPT-SoVITS's g2pW polyphones from a user's ``G2PWModel`` folder (issue 26, item 4): readings
from the network, the converted graph equal to onnxruntime's, the ``g2pw`` phase exact in every
placement (M55–M57), and the pypinyin fallback named when the folder is absent or incomplete.
The folder is a tiny one the tests write (`g2pw_tiny`)."""
from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

for _package in ("transformers", "torchaudio", "onnx", "onnx2torch", "opencc", "pypinyin", "jieba"):
    pytest.importorskip(_package)

from mizuoto_runtime import Runtime  # noqa: E402
from mizuoto_runtime.audio import Audio  # noqa: E402
from mizuoto_runtime.engines import Sampling  # noqa: E402
from mizuoto_runtime.engines.gptsovits import engine as engine_module  # noqa: E402
from mizuoto_runtime.engines.gptsovits.engine import GptSovitsEngine  # noqa: E402
from mizuoto_runtime.engines.gptsovits.text import chinese, g2pw  # noqa: E402
from mizuoto_runtime.engines.gptsovits.tiny import write as write_voice  # noqa: E402
from mizuoto_runtime.nn import onnx_cache  # noqa: E402

from support import g2pw_tiny  # noqa: E402

SENTENCES = ["我们在银行长大了，还得好好学习。", "他长得很重，行不行？", "音乐让我很快乐，大家都来了。",
             "为了你，我着急地走在地上。", "中国队打中了，我和你相似。"]
REFERENCE = Audio(0.3 * torch.sin(torch.arange(48000) / 6.0).unsqueeze(0), 16000)
SAMPLING = Sampling(seed=5, top_k=15, top_p=1.0, temperature=1.0, repetition_penalty=1.35, max_new_tokens=12)
TARGET = "大家都来了，还得长大。他长得很重，行不行？音乐让我很快乐。"  # g2pW (seed 1) and pypinyin differ


@pytest.fixture(scope="module", autouse=True)
def user_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The engines here keep their converted g2pW in a cache of this module's, not the user's."""
    folder = tmp_path_factory.mktemp("xdg_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(folder))
        yield folder


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two G2PWModel folders (seeds 1 and 2) and a tokenizer that knows their characters."""
    root = tmp_path_factory.mktemp("g2pw")
    g2pw_tiny.write_folder(root / "seed1" / g2pw.FOLDER, seed=1)
    g2pw_tiny.write_folder(root / "seed2" / g2pw.FOLDER, seed=2)
    g2pw_tiny.write_tokenizer(root / "tokenizer")
    return root


def _reader(root: Path, seed: int) -> g2pw.Polyphones:
    from transformers import AutoTokenizer

    folder = root / f"seed{seed}" / g2pw.FOLDER
    net = g2pw.load_net(folder)

    def predict(batches: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        with torch.inference_mode():
            return [net(b) for b in batches]

    return g2pw.Polyphones(g2pw.read_tables(folder), AutoTokenizer.from_pretrained(str(root / "tokenizer")), predict)


@pytest.mark.usefixtures("one_torch_thread")
def test_polyphones_are_read_by_the_network(made: Path) -> None:
    """Each polyphone takes one of its own readings, chosen by the weights: another network reads
    some differently, and nothing else changes (monophones from the table, the rest pypinyin's,
    和 and 似 as upstream lists them: pypinyin's)."""
    first, second = _reader(made, 1)(SENTENCES), _reader(made, 2)(SENTENCES)
    tables = g2pw.read_tables(made / "seed1" / g2pw.FOLDER)
    changed = 0
    for sentence, a, b in zip(SENTENCES, first, second):
        taiwan = g2pw.to_taiwan(sentence)
        assert len(a) == len(b) == len(sentence)
        for char, ra, rb in zip(taiwan, a, b):
            if char in tables.polyphonic:
                allowed = {tables.pinyin(p) for p in g2pw_tiny.POLYPHONIC[char]}
                assert ra in allowed and rb in allowed, (char, ra, rb)
                changed += ra != rb
            else:
                assert ra == rb, (sentence, char)
    assert changed > 0, "the readings do not depend on the network's weights"
    assert first[0][:2] == ["wo3", "men5"]  # 我 from the monophonic table, 們 too
    assert first[4][8] == "he2" and first[4][11] == "si4"  # 和, 似 (table: shi4): pypinyin's, as upstream excepts them


@pytest.mark.usefixtures("one_torch_thread")
def test_the_converted_graph_equals_onnxruntime(made: Path) -> None:
    """Our torch module of ``g2pW.onnx`` gives onnxruntime's probabilities (float32 rounding)
    and the same readings, on every query of the sentences."""
    ort = pytest.importorskip("onnxruntime")
    from transformers import AutoTokenizer

    folder = made / "seed1" / g2pw.FOLDER
    tables, net = g2pw.read_tables(folder), g2pw.load_net(folder)
    assert len(net.memory_units()) == g2pw_tiny.TINY.layers * 6  # q, k, v, out, up, down: each its own layer
    assert net.hidden_size == g2pw_tiny.TINY.hidden
    session = ort.InferenceSession(str(folder / "g2pW.onnx"), providers=["CPUExecutionProvider"])
    tokenizer = AutoTokenizer.from_pretrained(str(made / "tokenizer"))
    for sentence in SENTENCES:
        taiwan = g2pw.to_taiwan(sentence)
        asked = [i for i, c in enumerate(taiwan) if c in tables.polyphonic]
        for batch in g2pw.inputs(tokenizer, tables, taiwan, asked):
            expected = session.run(None, {k: v.numpy() for k, v in batch.items()})[0]
            with torch.inference_mode():
                found = net(batch).numpy()
            assert abs(found - expected).max() < 1e-5, sentence
            assert (found.argmax(1) == expected.argmax(1)).all(), sentence


def _probabilities(net: g2pw.G2PWNet, made: Path) -> list[torch.Tensor]:
    """The network's output for every query of `SENTENCES`."""
    from transformers import AutoTokenizer

    tables = g2pw.read_tables(made / "seed1" / g2pw.FOLDER)
    tokenizer = AutoTokenizer.from_pretrained(str(made / "tokenizer"))
    out = []
    for sentence in SENTENCES:
        taiwan = g2pw.to_taiwan(sentence)
        asked = [i for i, c in enumerate(taiwan) if c in tables.polyphonic]
        with torch.inference_mode():
            out += [net(batch) for batch in g2pw.inputs(tokenizer, tables, taiwan, asked)]
    return out


def _same(a: g2pw.G2PWNet, b: g2pw.G2PWNet) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.usefixtures("one_torch_thread")
def test_the_converted_network_is_kept_and_reused_until_the_file_changes(
        made: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 35: the first load keeps the converted module as safetensors keyed by the ONNX
    file's hash; the second converts nothing from the file and gives the same weights, units and
    outputs; a changed file is converted again; a damaged entry is dropped and rebuilt."""
    folder, cache = tmp_path / g2pw.FOLDER, tmp_path / "cache"
    shutil.copytree(made / "seed1" / g2pw.FOLDER, folder)
    plain = g2pw.load_net(folder)  # no cache: converted, nothing kept
    first = g2pw.load_net(folder, cache)
    [entry] = cache.glob("*.safetensors")
    assert entry.name.startswith(onnx_cache.file_digest(folder / "g2pW.onnx")[:32])

    convert = onnx_cache._convert

    def refused(*args: object) -> object:
        raise AssertionError("converted the ONNX file again")

    monkeypatch.setattr(onnx_cache, "_convert", refused)
    second = g2pw.load_net(folder, cache)
    assert _same(second, plain) and _same(first, plain)
    assert [u.weight.shape for u in second.memory_units()] == [u.weight.shape for u in plain.memory_units()]
    for got, expected in zip(_probabilities(second, made), _probabilities(plain, made), strict=True):
        assert torch.equal(got, expected)

    shutil.copy(made / "seed2" / g2pw.FOLDER / "g2pW.onnx", folder / "g2pW.onnx")  # another network
    with pytest.raises(AssertionError, match="converted the ONNX file again"):
        g2pw.load_net(folder, cache)
    monkeypatch.setattr(onnx_cache, "_convert", convert)
    changed = g2pw.load_net(folder, cache)
    assert _same(changed, g2pw.load_net(made / "seed2" / g2pw.FOLDER)) and not _same(changed, plain)
    assert len(list(cache.glob("*.safetensors"))) == 2

    newest = max(cache.glob("*.safetensors"), key=lambda p: p.stat().st_mtime_ns)
    newest.write_bytes(newest.read_bytes()[:1000])  # cut short
    caplog.set_level(logging.WARNING)
    assert _same(g2pw.load_net(folder, cache), changed)
    assert "dropped the kept conversion" in caplog.text and newest.stat().st_size > 1000


def test_a_text_over_512_tokens_is_cut_around_each_query(made: Path) -> None:
    """Upstream's cut: 510 tokens around each query, kept inside the text; each query's position
    points at its own character."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(made / "tokenizer"))
    tables = g2pw.read_tables(made / "seed1" / g2pw.FOLDER)
    text = "行" + "我們" * 400 + "長"
    batches = g2pw.inputs(tokenizer, tables, text, [0, len(text) - 1])
    assert [tuple(b["input_ids"].shape) for b in batches] == [(1, g2pw.MAX_TOKENS)] * 2
    for batch, char in zip(batches, "行長"):
        assert batch["input_ids"][0, batch["position_ids"][0]] == tokenizer.convert_tokens_to_ids(char)
    assert batches[0]["position_ids"].tolist() == [1] and batches[1]["position_ids"].tolist() == [510]


def test_fixed_readings_are_put_over_the_network() -> None:
    """Upstream's ``correct_pronunciation``: a word of the dictionary takes its readings whole,
    else a character of it takes its own."""
    fixed = g2pw.fixed_readings()
    assert fixed["湖泊"] == ("hu2", "po1") and fixed["唉"] == ("ai4",)
    assert g2pw.correct("湖泊", ["hu2", "bo2"]) == ["hu2", "po1"]
    assert g2pw.correct("唉呀", ["ai1", "ya5"]) == ["ai4", "ya5"]
    assert g2pw.syllables("银行", ["yin2", "hang2"]) == (["", "h"], ["in2", "ang2"])  # strict: y is no initial
    assert g2pw.to_simplified("銀行長") == "银行长"


# ---- the engine: the g2pw phase ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def voice(tmp_path_factory: pytest.TempPathFactory, made: Path) -> Path:
    """A tiny v2 voice with its feature models and, beside it, the seed-1 G2PWModel folder."""
    folder = write_voice(tmp_path_factory.mktemp("gsv_g2pw") / "voice", version="v2")
    shutil.copytree(made / "seed1" / g2pw.FOLDER, folder / g2pw.FOLDER)
    return folder


def _runtime(placement: str) -> Runtime:
    if placement == "plain":
        return Runtime({})
    return Runtime({"compute.simulate_vram_mb": 256, "compute.vram_mode": "none" if placement == "none" else "normal"})


def _say(folder: Path, placement: str) -> tuple[tuple[int, ...], torch.Tensor, torch.Tensor, dict]:
    rt = _runtime(placement)
    engine: GptSovitsEngine = rt.engine("gptsovits", folder)  # type: ignore[assignment]
    if placement == "half":
        for h in engine.handles():
            h.cap_bytes = (h.min_working_set + h.size_bytes) // 2
    ctx = rt.request(seed=SAMPLING.seed)
    voice = engine.voice_prompt(ctx, reference=REFERENCE, transcript="我们还得长大")
    _, target = engine.texts(ctx, TARGET, voice, None, None, None)
    codes = engine.generate(ctx, TARGET, voice, SAMPLING)
    return target.ids, codes.tokens, engine.decode(ctx, codes).waveform, ctx.meta


_plain: list[tuple[tuple[int, ...], torch.Tensor, torch.Tensor, dict]] = []


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("placement", ["none", "half", "whole"])
def test_the_g2pw_phase_is_exact_in_every_placement(voice: Path, placement: str) -> None:
    """M57: with g2pW in the request (its own phase and component), all streamed, half and whole
    give the plain run's phoneme ids, tokens and audio; its weights stream where they must."""
    if not _plain:
        _plain.append(_say(voice, "plain"))
    ids, tokens, wav, meta = _plain[0]
    assert meta["applied"]["chinese_polyphones"].startswith("g2pW (")
    got_ids, got_tokens, got_wav, got_meta = _say(voice, placement)
    assert got_ids == ids and torch.equal(got_tokens, tokens) and torch.equal(got_wav, wav)
    entry = next(c for c in got_meta["memory"]["request"]["components"] if c["name"] == "gptsovits:g2pw")
    assert entry["phases"] == ["g2pw"]
    if placement == "whole":
        assert got_meta["memory"]["streamed_mb"] == 0
    else:
        assert entry["streamed_bytes"] > 0, f"{placement}: g2pW's weights did not stream"


@pytest.mark.usefixtures("one_torch_thread")
def test_the_engine_reads_polyphones_with_g2pw_and_names_the_fallback(
        voice: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, user_cache: Path) -> None:
    """The frontend's Chinese ids follow g2pW's readings where the folder is; without it (or with
    the folder but no ``g2pW.onnx``) pypinyin reads them, the log says why once, and so does
    ``meta.applied.chinese_polyphones``."""
    engine_module._note_polyphone_source.cache_clear()
    caplog.set_level(logging.WARNING)
    alone = tmp_path / "alone"
    shutil.copytree(voice, alone, ignore=shutil.ignore_patterns(g2pw.FOLDER))
    assert _phonemes(voice) != _phonemes(alone)
    assert len(list((user_cache / "mizuoto" / g2pw.CACHE_FOLDER).glob("*.safetensors"))) == 1  # its converted g2pW
    assert _phones(voice) != _phones(alone) == chinese.g2p(chinese.normalize(TARGET))[0]
    applied = _phonemes(alone, applied=True)
    assert "no G2PWModel folder" in applied and "pypinyin" in applied
    assert caplog.text.count("no G2PWModel folder") == 1  # once, though three engines loaded
    shutil.copytree(voice / g2pw.FOLDER, alone / g2pw.FOLDER, ignore=shutil.ignore_patterns("*.onnx"))
    assert "has no g2pW.onnx" in _phonemes(alone, applied=True) and "has no g2pW.onnx" in caplog.text
    (alone / g2pw.FOLDER / "g2pW.onnx").write_bytes(b"not a graph")
    applied = _phonemes(alone, applied=True)
    assert "g2pW.onnx: cannot be converted to a torch module" in applied and applied in caplog.text


def _engine(folder: Path) -> tuple[Runtime, GptSovitsEngine]:
    rt = Runtime({})
    return rt, rt.engine("gptsovits", folder)  # type: ignore[return-value]


def _phonemes(folder: Path, applied: bool = False) -> object:
    rt, engine = _engine(folder)
    ctx = rt.request(seed=1)
    voice = engine.voice_prompt(ctx, reference=REFERENCE, transcript="今天天气好")
    _, target = engine.texts(ctx, TARGET, voice, None, None, None)
    return ctx.meta["applied"]["chinese_polyphones"] if applied else target.ids


def _phones(folder: Path) -> list[str]:
    """The target's Chinese phonemes with the engine's polyphone reader (None: pypinyin)."""
    rt, engine = _engine(folder)
    return chinese.g2p(chinese.normalize(TARGET), engine.polyphones(rt.request(seed=1)))[0]
