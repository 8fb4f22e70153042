"""Fish Speech (issue 24): our own model code against upstream's reference data, the two
published layouts, and the engine under the memory runtime (M27, M40, M46, M53, M57).

The reference test reads ``../shared/fixtures/fishspeech`` (beside the repository) and is
skipped where that folder is absent; the rest runs on tiny random checkpoints written by
`engines.fishspeech.tiny` in both official layouts.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import wave
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

pytest.importorskip("tokenizers", reason="Fish Speech's S2-Pro tokenizer.json needs the tokenizers package (an engine "
                                         "requirement, requirements/fishspeech.txt)")

from mizuoto_runtime import OomInjector, Runtime
from mizuoto_runtime.app.checkpoints import scan
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.app.reference_check import check_reference
from mizuoto_runtime.audio import Audio, write_wav
from mizuoto_runtime.engines import Sampling
from mizuoto_runtime.engines.fishspeech import checkpoint, loop, prompt, tiny
from mizuoto_runtime.engines.fishspeech.engine import FishSpeechEngine
from mizuoto_runtime.engines.fishspeech.sampling import S1Sampling, SamplingTensors, penalized
from mizuoto_runtime.errors import ArgumentError, CheckpointError

from conftest import require_engine
from support.oom import allocations_during

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "fishspeech"
REFERENCE = Audio(0.3 * torch.sin(torch.arange(44100) / 6.0).unsqueeze(0), 44100)  # one second, 22 code frames
TRANSCRIPT = "A short reference line."
TEXT = "Hello world, streaming is exact."
FRAMES = 8
SAMPLING = Sampling(seed=11, max_new_tokens=FRAMES, temperature=1.0, top_p=0.9, top_k=30)
PLACEMENTS = ("none", "half", "whole")

Folder = Callable[[str], Path]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Folder:
    require_engine("fishspeech")
    made: dict[str, Path] = {}

    def make(version: str) -> Path:
        if version not in made:
            made[version] = tiny.write(tmp_path_factory.mktemp(version), version=version, dtype=torch.bfloat16)
        return made[version]

    return make


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """The reference was computed with one thread; the shared machine wants it too."""


# ---- upstream's reference data ---------------------------------------------------------------

@pytest.mark.parametrize("variant", ["s2pro"])
def test_equal_to_upstream_on_its_reference_data(variant: str) -> None:
    """Every recorded stage within the fixture README's tolerance; sampled codes identical."""
    require_engine("fishspeech")
    directory = FIXTURES / variant
    if not directory.is_dir():
        pytest.skip(f"no reference data at {directory} (the fixtures sit beside the repository, not in it)")
    out = io.StringIO()
    lines = check_reference("fishspeech", directory, out=out)
    failed = [line.text() for line in lines if not line.passed]
    assert not failed, "\n".join(failed)
    names = {line.name for line in lines}
    assert {"gen.out.default.codes", "codec.out.indices", "llm.out.step_logits", "e2e.out.wav"} <= names


# ---- loading -----------------------------------------------------------------------------------

@pytest.mark.parametrize("version", FishSpeechEngine.VERSIONS)
def test_both_layouts_load_and_half_precision_holds_no_float32(folder: Folder, version: str,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """M27: bf16 straight from the files (S2-Pro's bf16 shards, S1-mini's bf16 model.pth); the
    codec's float32 file lands in bf16 too, folded one weight at a time; the same values as
    float32-then-convert. The licence is logged once per load."""
    path = folder(version)
    assert checkpoint.detect_version(path) == version
    with caplog.at_level(logging.INFO, logger="mizuoto_runtime.engines.fishspeech.checkpoint"):
        half = checkpoint.load_dual_ar(path, torch.bfloat16)
    licences = [r.getMessage() for r in caplog.records if "Licence" in r.getMessage()]
    assert len(licences) == 1 and ("Research License" if version == "s2-pro" else "CC-BY-NC-SA-4.0") in licences[0]
    full = checkpoint.load_dual_ar(path, torch.float32)
    for module in (half.slow, half.fast):
        assert {p.dtype for p in module.parameters()} == {torch.bfloat16}
    for (name, a), (_, b) in zip(half.slow.state_dict().items(), full.slow.state_dict().items()):
        assert torch.equal(a, b.to(torch.bfloat16)), name
    folded: list[weakref.ref[torch.Tensor]] = []
    fold = checkpoint.fold

    def spy(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert v.dtype == torch.float32  # the codec file is float32, as released
        alive = [r for r in folded if r() is not None]
        assert len(alive) <= 1, f"{len(alive)} folded float32 weights alive at once"  # the one being copied
        out = fold(g, v)
        folded.append(weakref.ref(out))
        return out

    checkpoint.fold = spy  # type: ignore[assignment]
    try:
        encoder, decoder = checkpoint.load_codec(path, torch.bfloat16)
    finally:
        checkpoint.fold = fold  # type: ignore[assignment]
    assert len(folded) > 20
    assert {p.dtype for p in [*encoder.parameters(), *decoder.parameters()]} == {torch.bfloat16}


def test_pth_wrappers_and_prefixes_load(folder: Folder, tmp_path: Path) -> None:
    """``state_dict`` wrappers, the ``model.`` prefix, split wq/wk/wv (S1-mini) and the
    ``generator.`` prefix (codec) load to the same weights as the flat files."""
    src = folder("s1-mini")
    flat = torch.load(src / "model.pth", weights_only=True)
    split = {}
    for key, value in flat.items():
        if key.endswith("attention.wqkv.weight") and not key.startswith("fast_"):
            q, k, v = value.split([64, 32, 32])  # tiny: 4 heads x 16, 2 kv heads x 16
            base = key[: -len("wqkv.weight")]
            split.update({f"{base}wq.weight": q, f"{base}wk.weight": k, f"{base}wv.weight": v})
        else:
            split[key] = value
    for name in ("config.json", "tokenizer.tiktoken", "special_tokens.json"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    torch.save({"state_dict": {f"model.{k}": v for k, v in split.items()}}, tmp_path / "model.pth")
    codec = torch.load(src / "codec.pth", weights_only=True)
    torch.save({"state_dict": {**{f"generator.{k}": v for k, v in codec.items()},
                               "discriminator.x": torch.zeros(1)}}, tmp_path / "codec.pth")
    a, b = checkpoint.load_dual_ar(src, torch.float32), checkpoint.load_dual_ar(tmp_path, torch.float32)
    for (name, x), (_, y) in zip(a.slow.state_dict().items(), b.slow.state_dict().items()):
        assert torch.equal(x, y), name
    (ea, _), (eb, _) = checkpoint.load_codec(src, torch.float32), checkpoint.load_codec(tmp_path, torch.float32)
    for (name, x), (_, y) in zip(ea.state_dict().items(), eb.state_dict().items()):
        assert torch.equal(x, y), name


def test_loading_errors_name_what_is_wrong(folder: Folder, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a Fish Speech checkpoint folder"):
        checkpoint.load_dual_ar(tmp_path, torch.float32)
    src = folder("s1-mini")
    for name in ("config.json", "tokenizer.tiktoken", "special_tokens.json", "codec.pth"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    state = torch.load(src / "model.pth", weights_only=True)
    state["layers.0.attention.wo.weight"] = torch.zeros(3, 3)
    del state["norm.weight"]
    torch.save(state, tmp_path / "model.pth")
    with pytest.raises(CheckpointError, match=r"missing norm\.weight.*shape of layers\.0\.attention\.wo\.weight"):
        checkpoint.load_dual_ar(tmp_path, torch.float32)
    codec = torch.load(src / "codec.pth", weights_only=True)
    del codec["decoder.model.0.conv.parametrizations.weight.original0"]
    torch.save(codec, tmp_path / "codec.pth")
    with pytest.raises(CheckpointError, match="decoder.model.0.conv.parametrizations.weight.original1"):
        checkpoint.load_codec(tmp_path, torch.float32)


# ---- the loop ----------------------------------------------------------------------------------

def _frames(model: checkpoint.DualAR, kind: str, sync_every: int, max_new: int = 40) -> loop.Generated:
    cfg = model.config
    rows = prompt.encode(prompt.system_message(None, None) + prompt.user_message(TEXT) + prompt.assistant_turn(),
                         model.tokenizer, cfg.num_codebooks)
    st = SamplingTensors.build(temperature=1.0, top_p=0.9, top_k=30, vocab_size=cfg.vocab_size,
                               semantic_begin=cfg.semantic_begin_id, semantic_end=cfg.semantic_end_id,
                               im_end_id=model.im_end_id, dtype=torch.float32, device="cpu")
    sampler = loop.FrameSampler(model.fast, st, torch.Generator().manual_seed(2), "cpu")
    with torch.inference_mode():
        return loop.generate(model.slow, sampler, rows, max_new, model.slow.new_cache("cpu", kind), model.im_end_id,
                             sync_every=sync_every)


def test_the_host_looks_once_per_block_and_the_cache_kind_changes_nothing(folder: Folder) -> None:
    """The stop is found at the same frame whatever the block (frames past it are dropped); a
    static cache (M53) and one grown per step give the same frames on the CPU."""
    model = checkpoint.load_dual_ar(folder("s1-mini"), torch.float32)
    base = _frames(model, "static", 1)
    assert base.stopped and base.computed == base.frames.shape[1]
    for kind, every in (("static", 8), ("dynamic", 3), ("dynamic", 64)):
        got = _frames(model, kind, every)
        assert torch.equal(got.frames, base.frames) and got.stopped
        assert got.computed >= got.frames.shape[1]


def test_s1_penalty_window_is_upstreams_block() -> None:
    """S1: the decode frames from max(0, i - 16) as a 16-column block, zero-padded while fewer."""
    history = torch.arange(1, 3 * 20 + 1).view(3, 20)
    assert torch.equal(S1Sampling.window(history[:, :0]), torch.zeros(3, 16, dtype=history.dtype))
    five = S1Sampling.window(history[:, :5])
    assert torch.equal(five[:, :5], history[:, :5]) and not five[:, 5:].any()
    assert torch.equal(S1Sampling.window(history[:, :19]), history[:, 3:19])
    logits = torch.tensor([2.0, -2.0, 1.0])
    assert torch.equal(penalized(logits.clone(), torch.tensor([0, 1, 1]), torch.tensor(2.0)),
                       torch.tensor([1.0, -4.0, 1.0]))


def test_text_splits_into_batches_by_speaker() -> None:
    assert prompt.batches("no tags here") == ["no tags here"]
    text = "<|speaker:0|>Hi there. <|speaker:1|>Hello! " * 4
    batches = prompt.batches(text, chunk_bytes=40)
    assert all(b.startswith("<|speaker:") for b in batches) and len(batches) == 8
    assert len(prompt.batches(text)) == 2  # at most 5 speakers' turns per batch


# ---- the engine --------------------------------------------------------------------------------

def _runtime(placement: str) -> Runtime:
    if placement == "plain":
        return Runtime({})
    return Runtime({"compute.simulate_vram_mb": 256, "compute.vram_mode": "none" if placement == "none" else "normal"})


def _engine(rt: Runtime, path: Path, placement: str, weights: str | None = None) -> FishSpeechEngine:
    engine = rt.engine("fishspeech", path, weights=weights)
    assert isinstance(engine, FishSpeechEngine)
    if placement == "half":
        for h in engine.handles():
            h.cap_bytes = (h.min_working_set + h.size_bytes) // 2
    return engine


def _say(rt: Runtime, engine: FishSpeechEngine, text: str = TEXT) -> tuple[torch.Tensor, torch.Tensor, dict, int]:
    ctx = rt.request(seed=11)
    voice = engine.voice_prompt(ctx, reference=REFERENCE, transcript=TRANSCRIPT)
    codes = engine.generate(ctx, text, voice, SAMPLING)
    audio = engine.decode(ctx, codes)
    return codes.tokens, audio.waveform, ctx.meta, codes.extra["frames_computed"]


_plain: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


def _plain_run(folder: Folder, version: str) -> tuple[torch.Tensor, torch.Tensor]:
    if version not in _plain:
        rt = _runtime("plain")
        _plain[version] = _say(rt, _engine(rt, folder(version), "plain"))[:2]
    return _plain[version]


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("version", FishSpeechEngine.VERSIONS)
def test_every_placement_equals_the_plain_run(folder: Folder, version: str, placement: str) -> None:
    """M57: all streamed, half-way and whole on the strict device give the plain CPU run's codes
    and audio; the same seed gives the same audio."""
    expected_codes, expected_wav = _plain_run(folder, version)
    rt = _runtime(placement)
    engine = _engine(rt, folder(version), placement)
    codes, wav, meta, _ = _say(rt, engine)
    assert codes.shape[0] == 10 and 0 < codes.shape[1] <= FRAMES - 1 and wav.shape[-1] == codes.shape[1] * 2048
    assert torch.equal(codes, expected_codes), f"{version} ({placement}): codes differ from the plain run"
    assert torch.equal(wav, expected_wav), f"{version} ({placement}): audio differs from the plain run"
    memory = meta["memory"]
    if placement == "whole":
        assert memory["partial"] == {} and memory["streamed_mb"] == 0
    else:
        assert {k.split(":", 1)[1] for k in memory["partial"]} == {"codec_encoder", "talker", "codec_decoder"}
        assert memory["streamed_mb"] > 0
    assert meta["applied"]["talker_loop"] == "lean"


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("weights", ["fp8_e4m3fn", "int8"])
def test_talker_stored_small_streams_exactly(folder: Folder, weights: str, placement: str) -> None:
    """Issue 36 (M57 with the option on): the S2-Pro talker stored in fp8 / int8, every placement
    equals the plain run with the same choice, streams, and says the choice."""
    if weights not in _plain:
        rt = _runtime("plain")
        _plain[weights] = _say(rt, _engine(rt, folder("s2-pro"), "plain", weights))[:2]
    expected_codes, expected_wav = _plain[weights]
    assert not torch.equal(expected_wav, _plain_run(folder, "s2-pro")[1])  # the choice changes the audio
    rt = _runtime(placement)
    codes, wav, meta, _ = _say(rt, _engine(rt, folder("s2-pro"), placement, weights))
    assert torch.equal(codes, expected_codes), f"{weights} ({placement}): codes differ from the plain run with it"
    assert torch.equal(wav, expected_wav), f"{weights} ({placement}): audio differs from the plain run with it"
    assert meta["applied"]["weights"] == {"generate": weights}
    if placement != "whole":
        assert meta["memory"]["streamed_mb"] > 0


def test_with_the_fast_transformer_hot_each_frame_copies_the_streamed_slow_layers(folder: Folder) -> None:
    """M15: half-way, the fast transformer stays resident; each frame copies exactly the slow
    transformer's streamed units once (the streamer's byte counter over the talker phase)."""
    rt = _runtime("half")
    engine = _engine(rt, folder("s2-pro"), "half")
    ctx = rt.request(seed=11)
    voice = engine.voice_prompt(ctx, reference=REFERENCE, transcript=TRANSCRIPT)
    talker = engine.talker
    codes = engine.generate(ctx, TEXT, voice, SAMPLING)
    fast_layers = {id(m) for m in engine.model.fast.fast_layers}
    streamed = talker.streamed_units
    assert streamed and not any(id(u.module) in fast_layers for u in streamed)
    slow_bytes = sum(u.nbytes for u in streamed)
    assert talker.streamer.streamed_bytes_of(talker) == codes.extra["frames_computed"] * slow_bytes


def test_an_injected_oom_reruns_exactly(folder: Folder) -> None:
    """M40: an OOM in the middle of the talker phase reruns it from the same seed: same codes."""
    expected = _plain_run(folder, "s2-pro")
    probe = _runtime("none")
    engine = _engine(probe, folder("s2-pro"), "none")
    with allocations_during(probe, engine, "generate") as inside:
        _say(probe, engine)
    assert len(inside) > 10
    rt = _runtime("none")
    engine = _engine(rt, folder("s2-pro"), "none")
    injector = OomInjector(at=inside[len(inside) // 2])
    rt.devices.fault_hook = injector
    codes, wav, meta, _ = _say(rt, engine)
    rt.devices.fault_hook = None
    assert injector.raised == 1 and meta["applied"]["oom_retries"] == 1
    assert torch.equal(codes, expected[0]) and torch.equal(wav, expected[1])


def test_estimates_follow_the_request(folder: Folder) -> None:
    """M45/M46: positions from the prompt and the text, capped by max_new_tokens; memory grows
    with both; a static cache reserves its doubled buffer."""
    rt = _runtime("plain")
    engine = _engine(rt, folder("s2-pro"), "plain")
    ctx = rt.request(seed=1)
    voice = engine.voice_prompt(ctx, reference=REFERENCE, transcript=TRANSCRIPT)
    short_prompt, short = engine.plan_positions("Hi.", voice, Sampling(max_new_tokens=2048))
    long_prompt, long = engine.plan_positions("Hello there, " * 20, voice, Sampling(max_new_tokens=2048))
    assert short == 2 * len("Hi.") and long > short and long_prompt > short_prompt > 22  # 22 reference frames
    assert engine.plan_positions("Hello there, " * 20, voice, Sampling(max_new_tokens=5))[1] == 5
    assert engine.talker_memory(long_prompt, long, "dynamic") > engine.talker_memory(short_prompt, short,
                                                                                              "dynamic")
    assert engine.talker_memory(100, 100, "static") > engine.talker_memory(100, 100, "dynamic")
    assert engine.decoder_memory(40) > engine.decoder_memory(4) > 0
    assert engine.voice_prompt_memory(88200) > engine.voice_prompt_memory(44100) > 0


def test_voice_arguments_are_checked(folder: Folder) -> None:
    rt = _runtime("plain")
    engine = _engine(rt, folder("s2-pro"), "plain")
    ctx = rt.request(seed=1)
    with pytest.raises(ArgumentError, match="transcript"):
        engine.voice_prompt(ctx, reference=REFERENCE)
    with pytest.raises(Exception, match="no speaker name or instruct"):
        engine.voice_prompt(ctx, speaker="alice")
    voice = engine.voice_prompt(ctx)  # no reference: a voice of the model's own
    codes = engine.generate(ctx, TEXT, voice, SAMPLING)
    assert codes.tokens.shape[0] == 10
    cached = engine.voice_prompt(ctx, reference=REFERENCE, transcript=TRANSCRIPT)
    assert engine.voice_prompt(ctx, reference=REFERENCE, transcript=TRANSCRIPT) is cached  # M4


# ---- the CLI and the checkpoint lists ---------------------------------------------------------

@pytest.mark.parametrize("version", FishSpeechEngine.VERSIONS)
def test_cli_tiny_checkpoint_and_say(folder: Folder, version: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`mizuoto tiny-checkpoint --engine fishspeech --version ...` writes the official file set,
    byte-identical on every run; `mizuoto say` clones the voice on a small simulated device."""
    code = main(["tiny-checkpoint", "--engine", "fishspeech", "--version", version, "--dtype", "bfloat16",
                 "--seed", str(tiny.SEED), str(tmp_path / "ckpt")])
    files = set(json.loads(capsys.readouterr().out)["files"])
    expected = ({"config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
                 "model-00002-of-00002.safetensors", "tokenizer.json", "codec.pth"} if version == "s2-pro" else
                {"config.json", "model.pth", "tokenizer.tiktoken", "special_tokens.json", "codec.pth"})
    assert code == 0 and files == expected
    for name in sorted(files):
        digest = [hashlib.sha256((root / name).read_bytes()).hexdigest()
                  for root in (folder(version), tmp_path / "ckpt")]
        assert digest[0] == digest[1], f"{name} is not byte-identical across runs"
    write_wav(tmp_path / "ref.wav", REFERENCE)
    out = tmp_path / "out.wav"
    code = main(["say", "--engine", "fishspeech", "--model", str(tmp_path / "ckpt"), TEXT, "-o", str(out),
                 "--voice", str(tmp_path / "ref.wav"), "--ref-text", TRANSCRIPT, "--seed", "3",
                 "--max-new-tokens", str(FRAMES), "--setting", "compute.simulate_vram_mb=24",
                 "--setting", "compute.vram_mode=none"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["sample_rate"] == 44100 and result["memory"]["streamed_mb"] > 0
    assert "fishspeech:talker" in result["memory"]["partial"]
    with wave.open(str(out)) as f:
        assert f.getframerate() == 44100 and f.getnframes() % 2048 == 0 and f.getnframes() > 0


def test_checkpoint_lists_name_each_release(folder: Folder, tmp_path: Path) -> None:
    """The loader's dropdown finds both layouts (from their files, no weights read) and names them."""
    for version in FishSpeechEngine.VERSIONS:
        (tmp_path / version).symlink_to(folder(version), target_is_directory=True)
    (tmp_path / "not-fish").mkdir()
    (tmp_path / "not-fish" / "config.json").write_text("{}")
    assert FishSpeechEngine.describe_checkpoint(folder("s2-pro")).label == "S2-Pro"  # type: ignore[union-attr]
    assert FishSpeechEngine.describe_checkpoint(folder("s1-mini")).label == "S1-mini"  # type: ignore[union-attr]
    assert FishSpeechEngine.describe_checkpoint(tmp_path / "not-fish") is None
    catalog = scan([tmp_path], ["fishspeech"])
    assert {(c.value, c.info.label) for c in catalog.of("fishspeech")} == {("s2-pro", "S2-Pro"), ("s1-mini", "S1-mini")}
