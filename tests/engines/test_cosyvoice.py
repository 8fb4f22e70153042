"""The CosyVoice engine on tiny random checkpoints in the published layout (issue 22: M1, M4,
M18, M40, M43, M46, M53, M57). Our model code's equality to upstream is tested on the reference
data (`test_cosyvoice_reference.py`); here: the phases give exactly what the plain pipeline
gives, in every placement, under every KV cache kind, after an OOM."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from mizuoto_runtime import CheckpointError, MizuotoError, OomInjector, Runtime
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines import Sampling

from conftest import require_engine
from support.oom import allocations_during

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

Checkpoint = Callable[[int], Path]
TEXT = "Hello there, tiny model."
TOKENS = 24
PLACEMENTS = ("none", "half", "whole")


@pytest.fixture(scope="session")
def cosyvoice_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    require_engine("cosyvoice")
    from mizuoto_runtime.engines.cosyvoice.tiny import write

    made: dict[int, Path] = {}

    def get(version: int) -> Path:
        if version not in made:
            made[version] = write(tmp_path_factory.mktemp(f"cosyvoice{version}"), version=str(version))
        return made[version]

    return get


def runtime(placement: str, **settings: object) -> Runtime:
    if placement != "plain":
        settings.setdefault("compute.simulate_vram_mb", 256)
        settings.setdefault("compute.vram_mode", "none" if placement == "none" else "normal")
    return Runtime(settings)


def say(rt: Runtime, folder: Path, placement: str = "plain", seed: int = 3, weights: str | None = None,
        **voice: object) -> tuple[torch.Tensor, dict]:
    engine = rt.engine("cosyvoice", folder, weights=weights)
    if placement == "half":
        for h in engine.handles():
            h.cap_bytes = (h.min_working_set + h.size_bytes) // 2
    voice = voice or {"speaker": "tiny"}
    audio, meta = rt.say(engine, TEXT, sampling=Sampling(seed=seed, max_new_tokens=TOKENS), **voice)  # type: ignore[arg-type]
    return audio.waveform, meta


_plain: dict[int, torch.Tensor] = {}


def plain(folder: Path, version: int) -> torch.Tensor:
    if version not in _plain:
        _plain[version] = say(Runtime(), folder)[0]
    return _plain[version]


@pytest.mark.parametrize("version", [2, 3])
def test_phases_equal_the_pipeline(cosyvoice_checkpoint: Checkpoint, version: int) -> None:
    """The engine's three phases give what `pipeline` gives in one go (the functions the
    reference checker proves against upstream), and upstream's RNG order: CosyVoice 2's
    vocoder continues the LM's generator."""
    from mizuoto_runtime.engines.cosyvoice.pipeline import SILENT_TOKENS, drop_silent, speech_tokens, token2wav

    folder = cosyvoice_checkpoint(version)
    rt = Runtime()
    engine = rt.engine("cosyvoice", folder)
    voice = engine.voice_prompt(rt.request(), speaker="tiny")
    ids = engine.text_ids(TEXT, voice)
    torch.manual_seed(3)
    with torch.inference_mode():
        gen = speech_tokens(engine.model, ids, voice.data["llm_prompt_text"], voice.data["llm_prompt_token"].long(),
                            max_new_tokens=TOKENS)
        tokens = drop_silent(gen.tokens, SILENT_TOKENS[version])
        _, wav = token2wav(engine.model, tokens, voice.data["prompt_token"], voice.data["prompt_feat"],
                           voice.data["embedding"])
    assert len(tokens) == TOKENS
    assert torch.equal(plain(folder, version), wav)


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("version", [2, 3])
def test_every_placement_is_exact(cosyvoice_checkpoint: Checkpoint, version: int, placement: str) -> None:
    """M57: none / half / whole on the strict simulated device equal the plain CPU run."""
    folder = cosyvoice_checkpoint(version)
    wav, meta = say(runtime(placement), folder, placement)
    assert torch.equal(wav, plain(folder, version)), f"CosyVoice {version} ({placement}) differs from plain"
    memory = meta["memory"]
    assert {k.split(":", 1)[1] for k in memory["components"]} == {"llm", "flow", "vocoder"}
    if placement == "whole":
        assert memory["partial"] == {} and memory["streamed_mb"] == 0
    else:
        assert memory["streamed_mb"] > 0 and "cosyvoice:llm" in memory["partial"]


_small: dict[str, torch.Tensor] = {}


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("weights", ["fp8_e4m3fn", "int8"])
def test_llm_stored_small_streams_exactly(cosyvoice_checkpoint: Checkpoint, weights: str, placement: str) -> None:
    """Issue 36 (M57 with the option on): CosyVoice 2's LM stored in fp8 / int8, every placement
    equals the plain run with the same choice, streams, and says the choice."""
    folder = cosyvoice_checkpoint(2)
    if weights not in _small:
        _small[weights] = say(Runtime(), folder, weights=weights)[0]
    expected = _small[weights]
    assert not torch.equal(expected, plain(folder, 2))  # the choice changes the audio
    wav, meta = say(runtime(placement), folder, placement, weights=weights)
    assert torch.equal(wav, expected), f"{weights} ({placement}): audio differs from the plain run with it"
    assert meta["applied"]["weights"] == {"generate": weights}
    if placement != "whole":
        assert meta["memory"]["streamed_mb"] > 0


@pytest.mark.parametrize("version", [2, 3])
def test_same_seed_same_audio(cosyvoice_checkpoint: Checkpoint, version: int) -> None:
    folder = cosyvoice_checkpoint(version)
    first = say(runtime("none"), folder, "none", seed=5)[0]
    assert torch.equal(first, say(runtime("none"), folder, "none", seed=5)[0])
    assert torch.equal(first, say(Runtime(), folder, seed=5)[0])
    other = say(Runtime(), folder, seed=6)[0]
    n = min(first.shape[-1], other.shape[-1])
    assert not torch.equal(first[..., :n], other[..., :n])


@pytest.mark.parametrize("version", [2, 3])
def test_static_kv_cache_equals_dynamic(cosyvoice_checkpoint: Checkpoint, version: int) -> None:
    """M53: `compute.kv_cache = static` (BufferCache) gives the same audio; the report says which."""
    folder = cosyvoice_checkpoint(version)
    wav, meta = say(Runtime({"compute.kv_cache": "static"}), folder)
    assert torch.equal(wav, plain(folder, version)) and meta["applied"]["kv_cache"] == "static"


@pytest.mark.parametrize("version", [2, 3])
def test_oom_mid_lm_reruns_exactly(cosyvoice_checkpoint: Checkpoint, version: int) -> None:
    """M40: an OOM in the middle of the talker phase (a streamed copy) reruns it with the same
    draws: the audio is the plain run's."""
    folder = cosyvoice_checkpoint(version)
    probe = runtime("none")
    engine = probe.engine("cosyvoice", folder)
    with allocations_during(probe, engine, "generate") as inside:
        probe.say(engine, TEXT, speaker="tiny", sampling=Sampling(seed=3, max_new_tokens=TOKENS))
    assert len(inside) >= 4  # the streamed layers are copied in while it generates
    rt = runtime("none")
    injector = OomInjector(at=inside[len(inside) // 2])
    rt.devices.fault_hook = injector
    wav, meta = say(rt, folder, "none")
    assert injector.raised == 1 and meta["applied"]["oom_retries"] == 1
    assert torch.equal(wav, plain(folder, 2 if version == 2 else 3))


def test_talker_memory_follows_the_request(cosyvoice_checkpoint: Checkpoint) -> None:
    """M46: KV positions = prompt + min(20 x text tokens, max_new_tokens)."""
    rt = Runtime()
    engine = rt.engine("cosyvoice", cosyvoice_checkpoint(2))
    voice = engine.voice_prompt(rt.request(), speaker="tiny")
    ids = engine.text_ids(TEXT, voice)
    long, short = engine.plan(ids, voice, 10_000), engine.plan(ids, voice, 7)
    prompt = 2 + ids.shape[1] + voice.data["llm_prompt_text"].shape[1] + voice.data["llm_prompt_token"].shape[1]
    assert long.prompt_positions == prompt and long.tokens_at_most == 20 * ids.shape[1] and short.tokens_at_most == 7
    assert engine.talker_memory(long)["kv_cache"] > engine.talker_memory(short)["kv_cache"]


def test_modes_and_voice_errors(cosyvoice_checkpoint: Checkpoint) -> None:
    folder = cosyvoice_checkpoint(3)
    rt = Runtime()
    engine = rt.engine("cosyvoice", folder)
    ctx = rt.request()
    instruct = engine.voice_prompt(ctx, speaker="tiny", instruct="Speak slowly.")
    ids = instruct.data["llm_prompt_text"][0].tolist()
    assert engine.tokenizer.decode(ids) == "You are a helpful assistant. Speak slowly."
    assert engine.tokenizer.token_id("<|endofprompt|>") in ids and instruct.data["llm_prompt_token"].shape[1] == 0
    assert say(rt, folder, speaker="tiny", instruct="Speak slowly.")[0].shape[-1] > 0
    with pytest.raises(MizuotoError, match="no speaker 'bob'.*it has: tiny"):
        engine.voice_prompt(ctx, speaker="bob")
    with pytest.raises(MizuotoError, match="at most 30 s"):
        engine.voice_prompt(ctx, Audio(torch.zeros(1, 16000 * 31), 16000), "a transcript")
    with pytest.raises(MizuotoError, match="needs a voice"):
        engine.voice_prompt(ctx)


def test_folder_without_voice_files_keeps_its_speakers(cosyvoice_checkpoint: Checkpoint, tmp_path: Path) -> None:
    from conftest import link_checkpoint

    folder = link_checkpoint(cosyvoice_checkpoint(2), tmp_path / "cv", skip=("campplus.onnx",))
    rt = Runtime()
    engine = rt.engine("cosyvoice", folder)
    assert [h.name for h in engine.handles()] == ["llm", "flow", "vocoder"]
    with pytest.raises(MizuotoError, match="lacks campplus.onnx; use a speaker saved in spk2info.pt"):
        engine.voice_prompt(rt.request(), REFERENCE, "a transcript")
    assert engine.voice_prompt(rt.request(), speaker="tiny").data["embedding"].shape == (1, 192)


def test_yaml_is_data_and_unknown_tags_are_named(cosyvoice_checkpoint: Checkpoint, tmp_path: Path) -> None:
    from conftest import link_checkpoint

    folder = link_checkpoint(cosyvoice_checkpoint(2), tmp_path / "bad", skip=("cosyvoice2.yaml",))
    text = (cosyvoice_checkpoint(2) / "cosyvoice2.yaml").read_text()
    (folder / "cosyvoice2.yaml").write_text(text.replace("cosyvoice.hifigan.generator.HiFTGenerator",
                                                         "os.system"))
    with pytest.raises(CheckpointError, match=r"hift: unknown tag !new:os.system"):
        Runtime().engine("cosyvoice", folder)
    (folder / "cosyvoice2.yaml").unlink()
    with pytest.raises(CheckpointError, match="expected exactly one of cosyvoice2.yaml, cosyvoice3.yaml"):
        Runtime().engine("cosyvoice", folder)


def test_describe_checkpoint_lists_speakers(cosyvoice_checkpoint: Checkpoint, tmp_path: Path) -> None:
    from mizuoto_runtime.engines.cosyvoice.engine import CosyVoiceEngine

    info = CosyVoiceEngine.describe_checkpoint(cosyvoice_checkpoint(3))
    assert info is not None and info.label == "CosyVoice3" and info.speakers == ["tiny"]
    assert CosyVoiceEngine.describe_checkpoint(tmp_path) is None


def test_cli_say_and_tiny_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_engine("cosyvoice")
    assert main(["tiny-checkpoint", str(tmp_path / "cv3"), "--engine", "cosyvoice", "--version", "3"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert "cosyvoice3.yaml" in written["files"] and "CosyVoice-BlankEN/model.safetensors" in written["files"]
    out = tmp_path / "out.wav"
    code = main(["say", TEXT, "--engine", "cosyvoice", "--model", str(tmp_path / "cv3"), "--speaker", "tiny",
                 "--max-new-tokens", "12", "-o", str(out), "--setting", "compute.simulate_vram_mb=64",
                 "--setting", "compute.vram_mode=none"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and out.is_file() and result["sample_rate"] == 24000 and result["memory"]["streamed_mb"] > 0
    assert result["applied"]["vocoder_fallback"].startswith("none")


@pytest.mark.parametrize("version", [2, 3])
def test_cfg_halves_share_each_copy(cosyvoice_checkpoint: Checkpoint, version: int) -> None:
    """M18: both CFG halves run through each estimator unit in one batch of two, so a streamed
    unit is copied once per Euler step: each extra step costs exactly the streamed estimator
    units' bytes."""
    folder = cosyvoice_checkpoint(version)
    streamed: dict[int, int] = {}
    per_step = 0
    for steps in (2, 5):
        rt = runtime("none")
        engine = rt.engine("cosyvoice", folder)
        engine.model.flow.decoder.n_timesteps = steps
        ctx = rt.request(seed=1)
        voice = engine.voice_prompt(ctx, speaker="tiny")
        engine.decode(ctx, engine.generate(ctx, TEXT, voice, Sampling(seed=1, max_new_tokens=8)))
        flow = engine.flow
        estimator = {id(m) for m in engine.model.flow.decoder.estimator.memory_units()}
        units = [u for u in flow.streamed_units if id(u.module) in estimator]
        assert units, "no estimator unit streamed"
        per_step = sum(u.nbytes for u in units)
        streamed[steps] = flow.streamer.streamed_bytes_of(flow)
    assert streamed[5] - streamed[2] == 3 * per_step


REFERENCE = Audio(0.3 * torch.sin(torch.arange(48000) / 7.0).unsqueeze(0) * torch.linspace(0.2, 1, 48000), 16000)


@pytest.mark.parametrize("version", [2, 3])
def test_cloning_voice_is_cached(cosyvoice_checkpoint: Checkpoint, version: int) -> None:
    """Zero-shot and cross-lingual voices from reference audio (CAM++ and the speech tokenizer
    as torch modules); M4: the same reference again places neither, and speaks the same."""
    folder = cosyvoice_checkpoint(version)
    rt = runtime("none", **{"compute.simulate_vram_mb": 64})
    engine = rt.engine("cosyvoice", folder)
    first, meta = say(rt, folder, "none", reference=REFERENCE, transcript="a reference sentence")
    placed = {k.split(":", 1)[1] for k in meta["memory"]["components"]}
    assert placed == {"campplus", "speech_tokenizer", "llm", "flow", "vocoder"}
    voice = next(iter(engine.voices.values())).data
    assert voice["prompt_feat"].shape[1] == 2 * voice["prompt_token"].shape[1] > 0
    assert voice["embedding"].shape == (1, 192) and "llm_prompt_token" in voice
    rt.manager.events.clear()
    again, meta = say(rt, folder, "none", reference=REFERENCE, transcript="a reference sentence")
    placed = {name for action, name, _ in rt.manager.events if action == "place"}
    assert "cosyvoice:campplus" not in placed and "cosyvoice:speech_tokenizer" not in placed
    assert "cosyvoice:llm" in placed and torch.equal(first, again)
    cross = engine.voice_prompt(rt.request(), REFERENCE)  # cross-lingual: no prompt in the LM
    assert "llm_prompt_text" not in cross.data and cross.data["prompt_token"].shape[1] > 0


def test_voice_modules_equal_onnxruntime(cosyvoice_checkpoint: Checkpoint) -> None:
    """CAM++ and the speech tokenizer as torch modules compute what onnxruntime computes from
    the same ONNX files (the tiny ones; the published files are not available offline)."""
    ort = pytest.importorskip("onnxruntime")
    from mizuoto_runtime.engines.cosyvoice.voice import load_campplus, load_speech_tokenizer

    folder = cosyvoice_checkpoint(2)
    feat = torch.randn(1, 50, 80, generator=torch.Generator().manual_seed(0))
    session = ort.InferenceSession(str(folder / "campplus.onnx"))
    want = torch.from_numpy(session.run(None, {"input": feat.numpy()})[0])
    got = load_campplus(folder / "campplus.onnx").graph(feat)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    mel = torch.randn(1, 128, 40, generator=torch.Generator().manual_seed(1))
    session = ort.InferenceSession(str(folder / "speech_tokenizer_v2.onnx"))
    want = session.run(None, {"feats": mel.numpy(), "feats_length": torch.tensor([40], dtype=torch.int32).numpy()})[0]
    tokenizer = load_speech_tokenizer(folder / "speech_tokenizer_v2.onnx")
    assert not tokenizer.packaged  # not the published layout: converted as a graph
    assert torch.equal(tokenizer.model(mel, torch.tensor([40], dtype=torch.int32)), torch.from_numpy(want))


def upstream_kept(head: list[float], top_p: float) -> int:
    """Upstream's nucleus loop: keep while the running sum (float32, added in order) < top_p."""
    import numpy as np

    cum, kept = np.float32(0.0), 0
    for value in head:
        if kept and not cum < np.float32(top_p):
            break
        cum, kept = np.float32(cum + np.float32(value)), kept + 1
    return kept


def test_kept_mask_adds_in_float32_as_upstream() -> None:
    """The nucleus's kept count on the device equals upstream's float32 loop, also where a
    float64 sum (or torch's CPU cumsum, which accumulates in double) would keep fewer: tiny
    probabilities that a float32 sum of 0.79999995 absorbs."""
    from mizuoto_runtime.engines.cosyvoice.lm import kept_mask

    absorbed = torch.tensor([0.79999995] + [2e-8] * 24, dtype=torch.float32)
    assert int(kept_mask(absorbed, 0.8).sum()) == upstream_kept(absorbed.tolist(), 0.8) == 25
    cumsum = torch.cat([torch.zeros(1), absorbed.cumsum(0)[:-1]])
    assert int((cumsum < 0.8).sum()) < 25  # what a cumsum would have kept
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        concentration = float(torch.rand(1, generator=g)) * 4
        head = (torch.randn(400, generator=g) * concentration).softmax(0).sort(descending=True).values[:25]
        mask = kept_mask(head, 0.8)
        kept = upstream_kept(head.tolist(), 0.8)
        assert mask.tolist() == [True] * kept + [False] * (25 - kept)


def test_draw_is_torch_multinomial() -> None:
    """`draw` gives multinomial(1, replacement=True)'s id and leaves the generator where it
    leaves it; over the kept head with the rest zeroed it draws the same id."""
    from mizuoto_runtime.engines.cosyvoice.lm import draw

    g = torch.Generator().manual_seed(1)
    for trial in range(200):
        p = (torch.randn(2 + trial % 30, generator=g) * 2).softmax(0).sort(descending=True).values
        kept = 1 + trial % p.numel()
        torch.manual_seed(trial)
        expected, after = p[:kept].multinomial(1, replacement=True).item(), torch.rand(1)
        torch.manual_seed(trial)
        assert int(draw(p[:kept])) == expected and torch.equal(torch.rand(1), after)
        torch.manual_seed(trial)
        assert int(draw(torch.where(torch.arange(p.numel()) < kept, p, 0))) == expected
