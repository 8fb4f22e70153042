"""The Chatterbox engine on tiny random checkpoints in the published layout (issue 34: M1, M4,
M27, M40, M57; equal to upstream).

Skipped where a package of requirements/chatterbox.txt is not installed. Upstream is
`chatterbox.tts.ChatterboxTTS` over the same modules `from_local` builds (at the tiny sizes, which
its `from_local` cannot construct: it hard-codes the published ones), loaded by its own
`load_state_dict(load_file(...))`; its `generate` caps T3 at a hard-coded 1000 tokens, so the tests
call its `T3.inference` with `max_new_tokens=TOKENS` instead, the one setting changed.
"""
from __future__ import annotations

import hashlib
import json
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mizuoto_runtime import CheckpointError, MizuotoError, OomInjector, Runtime
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.audio import Audio, write_wav
from mizuoto_runtime.engines import Sampling, engine_class
from mizuoto_runtime.errors import ArgumentError

from conftest import link_checkpoint, require_engine
from support.oom import allocations_during

pytestmark = pytest.mark.usefixtures("one_torch_thread")

Checkpoint = Callable[..., Path]
REFERENCE = Audio(0.3 * torch.sin(torch.arange(16000) / 6.0).unsqueeze(0), 16000)  # resampled to 24 kHz
TEXT = "Hello there, tiny box."
TOKENS = 24
PLACEMENTS = ("none", "half", "whole")
COMPONENTS = {"s3_tokenizer", "speaker_encoder", "voice_encoder", "talker", "flow", "vocoder"}


def sampling(seed: int = 7) -> Sampling:
    """Upstream's generate() defaults (temperature 0.8, repetition penalty 1.2, top-p 1)."""
    return Sampling(seed=seed, temperature=0.8, repetition_penalty=1.2, top_p=1.0, max_new_tokens=TOKENS)


def runtime(placement: str = "plain") -> Runtime:
    if placement == "plain":
        return Runtime()
    return Runtime({"compute.simulate_vram_mb": 256, "compute.vram_mode": "none" if placement == "none" else "normal"})


def say(rt: Runtime, folder: Path, placement: str = "plain", seed: int = 7, weights: str | None = None,
        **voice: Any) -> tuple[torch.Tensor, dict]:
    engine = rt.engine("chatterbox", folder, weights=weights)
    if placement == "half":
        for h in engine.handles():
            h.cap_bytes = (h.min_working_set + h.size_bytes) // 2
    audio, meta = rt.say(engine, TEXT, sampling=sampling(seed), **voice)
    return audio.waveform, meta


def upstream_tts(folder: Path) -> Any:
    from chatterbox.models.tokenizers import EnTokenizer
    from chatterbox.models.voice_encoder import VoiceEncoder
    from chatterbox.tts import ChatterboxTTS, Conditionals
    from safetensors.torch import load_file

    from mizuoto_runtime.engines.chatterbox import checkpoint

    sizes = checkpoint.sizes_of(folder)
    ve = VoiceEncoder()
    ve.load_state_dict(load_file(folder / "ve.safetensors"))
    t3 = checkpoint.build_t3(sizes)
    t3.load_state_dict(load_file(folder / "t3_cfg.safetensors"))
    s3gen = checkpoint.build_s3gen(sizes)
    s3gen.load_state_dict(load_file(folder / "s3gen.safetensors"), strict=False)
    for m in (ve, t3, s3gen):
        m.eval()
    conds = Conditionals.load(folder / "conds.pt")
    tts = ChatterboxTTS(t3, s3gen, ve, EnTokenizer(str(folder / "tokenizer.json")), "cpu", conds=conds)
    inference = type(t3).inference
    t3.inference = lambda **kw: inference(t3, **{**kw, "max_new_tokens": TOKENS})
    return tts


class Unmarked:
    """A watermarker that leaves the audio as it is (perth's DummyWatermarker rounds it)."""

    @staticmethod
    def apply_watermark(wav: np.ndarray, sample_rate: int) -> np.ndarray:
        return wav


_plain: dict[str, torch.Tensor] = {}


def plain(folder: Path) -> torch.Tensor:
    if "clone" not in _plain:
        _plain["clone"] = say(runtime(), folder, reference=REFERENCE)[0]
    return _plain["clone"]


@pytest.mark.parametrize("mode", ["clone", "builtin"])
def test_equals_the_package_generate(chatterbox_checkpoint: Checkpoint, tmp_path: Path, mode: str) -> None:
    """Our three phases over our own load (meta + mmap safetensors) equal upstream's one call,
    `ChatterboxTTS.generate(text, audio_prompt_path=..., exaggeration=...)` after
    `torch.manual_seed`, sample by sample, watermark included; for a reference (read by upstream
    from a float WAV file) and for the folder's built-in voice (conds.pt)."""
    import soundfile

    folder = chatterbox_checkpoint()
    exaggeration = 0.7
    voice: dict[str, Any] = {"voice_options": {"exaggeration": exaggeration}}
    kwargs: dict[str, Any] = {"exaggeration": exaggeration}
    if mode == "clone":
        voice["reference"] = REFERENCE
        path = tmp_path / "ref.wav"
        soundfile.write(path, REFERENCE.waveform[0].numpy(), REFERENCE.sample_rate, subtype="FLOAT")
        kwargs["audio_prompt_path"] = str(path)
    ours, meta = say(runtime(), folder, **voice)
    tts = upstream_tts(folder)
    torch.manual_seed(7)
    theirs = tts.generate(TEXT, **kwargs)
    assert ours.shape[-1] > 0 and ours.abs().max() > 0
    assert torch.equal(ours, theirs), f"{mode} differs from the package"
    placed = {key.split(":", 1)[1] for key in meta["memory"]["components"]}
    encoders = {"s3_tokenizer", "speaker_encoder", "voice_encoder"}
    assert placed == (COMPONENTS if mode == "clone" else COMPONENTS - encoders)  # M1


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_streams_exactly(chatterbox_checkpoint: Checkpoint, placement: str) -> None:
    """M57: none / half / whole on the strict simulated device equal the plain CPU run,
    watermarked audio included (the watermark runs on the CPU after the decoder: the same under
    every placement); the partial placements stream the talker's layers."""
    folder = chatterbox_checkpoint()
    rt = runtime(placement)
    wav, meta = say(rt, folder, placement, reference=REFERENCE)
    assert torch.equal(wav, plain(folder)), f"{placement}: audio differs from the plain CPU run"
    memory = meta["memory"]
    assert {key.split(":", 1)[1] for key in memory["components"]} == COMPONENTS
    if placement == "whole":
        assert memory["partial"] == {} and memory["streamed_mb"] == 0
    else:
        assert "chatterbox:talker" in memory["partial"] and memory["streamed_mb"] > 0
    talker = rt.engine("chatterbox", folder).talker
    assert talker.kind == "sequence" and len(talker.units) == 2  # the Llama layers


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("weights", ["fp8_e4m3fn", "int8"])
def test_talker_stored_small_streams_exactly(chatterbox_checkpoint: Checkpoint, weights: str, placement: str) -> None:
    """Issue 36 (M57 with the option on): T3 stored in fp8 / int8, every placement equals the
    plain run with the same choice, streams, and says the choice."""
    folder = chatterbox_checkpoint()
    if weights not in _plain:
        _plain[weights] = say(runtime(), folder, weights=weights, reference=REFERENCE)[0]
    expected = _plain[weights]
    if weights.startswith("fp8"):  # int8's error is too small to change the tiny T3's 24 sampled tokens
        assert not torch.equal(expected, plain(folder))  # the choice changes the audio
    wav, meta = say(runtime(placement), folder, placement, weights=weights, reference=REFERENCE)
    assert torch.equal(wav, expected), f"{weights} ({placement}): audio differs from the plain run with it"
    assert meta["applied"]["weights"] == {"generate": weights}
    if placement != "whole":
        assert meta["memory"]["streamed_mb"] > 0


def test_the_watermark_is_upstreams_and_on_every_output(chatterbox_checkpoint: Checkpoint) -> None:
    """The output is the decoder's waveform with Perth's implicit watermark applied (upstream's
    default), not the bare waveform."""
    import perth

    folder = chatterbox_checkpoint()
    rt = runtime()
    engine = rt.engine("chatterbox", folder)
    engine.watermarker = Unmarked()  # the bare decoder output
    bare, _ = say(rt, folder, reference=REFERENCE)
    marked = plain(folder)
    assert bare.shape == marked.shape and not torch.equal(bare, marked)
    again = perth.PerthImplicitWatermarker().apply_watermark(bare[0].numpy(), sample_rate=24000)
    assert torch.equal(torch.from_numpy(again).unsqueeze(0), marked)


def test_oom_mid_talker_reruns_exactly(chatterbox_checkpoint: Checkpoint) -> None:
    """M40: an OOM in the middle of the talker (a streamed layer's copy) reruns the phase with the
    same draws: the audio is the plain run's."""
    folder = chatterbox_checkpoint()
    probe = runtime("none")
    with allocations_during(probe, probe.engine("chatterbox", folder), "generate") as inside:
        assert torch.equal(say(probe, folder, reference=REFERENCE)[0], plain(folder))
    assert len(inside) > TOKENS  # a copy per layer per token
    rt = runtime("none")
    injector = OomInjector(at=inside[len(inside) // 2])
    rt.devices.fault_hook = injector
    wav, meta = say(rt, folder, reference=REFERENCE)
    assert injector.raised == 1 and meta["applied"]["oom_retries"] == 1
    assert torch.equal(wav, plain(folder))


def test_a_cached_voice_is_not_encoded_again_and_exaggeration_needs_no_encoding(
        chatterbox_checkpoint: Checkpoint) -> None:
    """M4: the same reference again places no encoder, at another exaggeration too (it is T3's
    emotion input only), which changes the audio; the seed changes it too."""
    folder = chatterbox_checkpoint()
    rt = runtime("none")
    first, _ = say(rt, folder, reference=REFERENCE)
    rt.manager.events.clear()
    # far from the default: in the random tiny T3 one conditioning position moves the draws little
    excited, _ = say(rt, folder, reference=REFERENCE, voice_options={"exaggeration": 5.0})
    placed = {name for action, name, _ in rt.manager.events if action == "place"}
    assert not placed & {"chatterbox:s3_tokenizer", "chatterbox:speaker_encoder", "chatterbox:voice_encoder"}
    assert "chatterbox:talker" in placed
    assert torch.equal(first, plain(folder))
    assert not torch.equal(first[..., :excited.shape[-1]], excited[..., :first.shape[-1]])
    other, _ = say(rt, folder, seed=8, reference=REFERENCE)
    assert not torch.equal(first[..., :other.shape[-1]], other[..., :first.shape[-1]])


def test_loading_and_voice_errors_name_what_is_wrong(chatterbox_checkpoint: Checkpoint, tmp_path: Path) -> None:
    folder = chatterbox_checkpoint()
    rt = Runtime()
    with pytest.raises(CheckpointError, match="folder not found"):
        rt.engine("chatterbox", tmp_path / "nowhere")
    partial = link_checkpoint(folder, tmp_path / "partial", skip=("s3gen.safetensors",))
    with pytest.raises(CheckpointError, match="missing s3gen.safetensors"):
        rt.engine("chatterbox", partial)
    (partial / "s3gen.safetensors").symlink_to(folder / "ve.safetensors")
    with pytest.raises(CheckpointError, match="has no tensor tokenizer.encoder.conv1.weight"):
        rt.engine("chatterbox", partial)
    assert engine_class("chatterbox").describe_checkpoint(partial) is not None  # the files are there
    assert engine_class("chatterbox").describe_checkpoint(tmp_path) is None
    no_voice = link_checkpoint(folder, tmp_path / "no-voice", skip=("conds.pt",))
    engine = rt.engine("chatterbox", no_voice)
    ctx = rt.request()
    with pytest.raises(MizuotoError, match="no built-in voice"):
        engine.voice_prompt(ctx)
    with pytest.raises(MizuotoError, match="no named speakers"):
        engine.voice_prompt(ctx, speaker="alice")
    with pytest.raises(ArgumentError, match="no voice description"):
        engine.voice_prompt(ctx, REFERENCE, instruct="calm")
    for bad in (-1.0, float("nan"), "high", True):
        with pytest.raises(ArgumentError, match="exaggeration must be a finite number >= 0"):
            engine.voice_prompt(ctx, REFERENCE, exaggeration=bad)  # type: ignore[arg-type]


def test_bf16_talker_loads_in_place(chatterbox_checkpoint: Checkpoint) -> None:
    """M27: T3 loads straight into bfloat16 and equals float32-then-convert; S3Gen and the voice
    encoder stay float32; a bfloat16 checkpoint loads bit for bit; the engine speaks."""
    rt = Runtime()
    half = rt.engine("chatterbox", chatterbox_checkpoint(), "bfloat16")
    full = rt.engine("chatterbox", chatterbox_checkpoint(), "float32")
    ours, theirs = half.models.t3.state_dict(), full.models.t3.state_dict()
    for key, value in ours.items():
        if value.is_floating_point():
            assert value.dtype == torch.bfloat16 and torch.equal(value, theirs[key].to(torch.bfloat16)), key
    assert {p.dtype for p in half.models.s3gen.parameters()} == {torch.float32}
    saved = rt.engine("chatterbox", chatterbox_checkpoint("bfloat16"), "bfloat16")
    assert all(torch.equal(v, saved.models.t3.state_dict()[k]) for k, v in ours.items())
    # It speaks in bfloat16 (the voice's float32 conditionals go to T3 in its precision).
    audio, _ = rt.say(half, TEXT, sampling=sampling(), reference=REFERENCE)
    assert audio.waveform.abs().max() > 0


def test_sizes_are_read_back_from_the_headers(chatterbox_checkpoint: Checkpoint) -> None:
    """The published sizes build upstream's own `T3()` / `S3Gen()` (no part rebuilt), and a
    folder's sizes are read back from its safetensors headers."""
    from chatterbox.models.s3gen import S3Gen
    from chatterbox.models.t3 import T3

    from mizuoto_runtime.engines.chatterbox import checkpoint, tiny

    assert checkpoint.sizes_of(chatterbox_checkpoint()) == tiny.TINY
    assert checkpoint.llama_config_name(checkpoint.PUBLISHED) == "Llama_520M"
    for ours, theirs in ((checkpoint.build_t3(checkpoint.PUBLISHED), T3()),
                         (checkpoint.build_s3gen(checkpoint.PUBLISHED), S3Gen())):
        shapes = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
        assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == shapes


def test_cli_say_and_tiny_checkpoint(chatterbox_checkpoint: Checkpoint, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "tiny-chatterbox"
    assert main(["tiny-checkpoint", "--engine", "chatterbox", str(folder)]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert {"ve.safetensors", "t3_cfg.safetensors", "s3gen.safetensors", "tokenizer.json", "conds.pt"} <= set(files)
    for name in files:
        digest = [hashlib.sha256((root / name).read_bytes()).hexdigest() for root in (folder, chatterbox_checkpoint())]
        assert digest[0] == digest[1], f"{name} is not byte-identical across runs"
    write_wav(tmp_path / "ref.wav", REFERENCE)
    out = tmp_path / "out.wav"
    code = main(["say", "--engine", "chatterbox", "--model", str(folder), TEXT, "-o", str(out), "--voice",
                 str(tmp_path / "ref.wav"), "--max-new-tokens", str(TOKENS), "--exaggeration", "0.9",
                 "--setting", "compute.simulate_vram_mb=256", "--setting", "compute.vram_mode=none"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["sample_rate"] == 24000 and result["memory"]["streamed_mb"] > 0
    with wave.open(str(out)) as f:
        assert f.getframerate() == 24000 and f.getnframes() > 0
        assert np.abs(np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")).max() > 10
    caplog.clear()  # another engine refuses it, naming it
    assert main(["say", "--engine", "demo", TEXT, "-o", str(out), "--exaggeration", "0.9"]) == 2
    assert "takes no exaggeration" in caplog.text


def test_a_script_speaks_line_by_line_in_each_characters_voice_and_exaggeration(
        chatterbox_checkpoint: Checkpoint) -> None:
    """A two-character script (one voice per pass: VOICES_PER_PASS stays 1) speaks each line as
    `say` speaks it alone with that character's reference and exaggeration, and seed + line."""
    from mizuoto_runtime.app.scripts.runner import CharacterVoice, speak_script
    from mizuoto_runtime.app.scripts.syntax import parse_script

    assert engine_class("chatterbox").VOICES_PER_PASS == 1  # no dialogue pass: Chatterbox speaks one voice
    folder = chatterbox_checkpoint()
    other = Audio(0.3 * torch.sin(torch.arange(16000) / 9.0).unsqueeze(0), 16000)
    voices = {None: CharacterVoice(REFERENCE, options={"exaggeration": 0.3}),
              "Bob": CharacterVoice(other, options={"exaggeration": 1.2})}
    script = parse_script("Hello there.\n[Bob] Hi, how are you?", ["Bob"])
    rt = runtime()
    engine = rt.engine("chatterbox", folder)
    out = speak_script(rt, engine, script, voices, sampling())
    assert len(out.lines) == 2
    for index, (line, audio) in enumerate(zip(script.lines, out.lines)):
        voice = voices[line.character]
        single = Runtime()
        alone, _ = single.say(single.engine("chatterbox", folder), line.text, reference=voice.reference,
                              sampling=sampling(7 + index), voice_options=voice.options)
        assert torch.equal(audio.waveform, alone.waveform), f"line {index} differs from its run alone"
    assert not torch.equal(out.lines[0].waveform[..., :10], out.lines[1].waveform[..., :10])


# ---- Chatterbox Multilingual: the same folder's t3_mtl23ls_v2.safetensors -------------------------

@pytest.fixture(scope="module")
def multilingual(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny folder with both models, as the published repository has them; the loader's choice
    of the multilingual model is its T3 file."""
    require_engine("chatterbox")
    from mizuoto_runtime.engines.chatterbox import tiny

    folder = tiny.write(tmp_path_factory.mktemp("chatterbox-mtl"), version="multilingual")
    return folder / "t3_mtl23ls_v2.safetensors"


MTL_TEXT = "Bonjour, petite boite."


def mtl_sampling(seed: int = 7) -> Sampling:
    """The multilingual generate()'s defaults (repetition penalty 2.0), in French."""
    return Sampling(seed=seed, temperature=0.8, repetition_penalty=2.0, top_p=1.0, max_new_tokens=TOKENS,
                    language="French")


def mtl_say(rt: Runtime, choice: Path, placement: str = "plain") -> tuple[torch.Tensor, dict]:
    engine = rt.engine("chatterbox", choice)
    if placement == "half":
        for h in engine.handles():
            h.cap_bytes = (h.min_working_set + h.size_bytes) // 2
    audio, meta = rt.say(engine, MTL_TEXT, reference=REFERENCE, sampling=mtl_sampling())
    return audio.waveform, meta


_mtl_plain: dict[str, torch.Tensor] = {}


def test_multilingual_equals_the_package_generate(multilingual: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Our phases over the multilingual model equal upstream's `ChatterboxMultilingualTTS.generate(
    text, "fr", audio_prompt_path=...)` (its modules loaded as its from_local loads them: ve.pt and
    s3gen.pt with weights_only=True, the T3 file; its own MTLTokenizer), sample for sample."""
    import soundfile
    from chatterbox.models.tokenizers import MTLTokenizer
    from chatterbox.models.voice_encoder import VoiceEncoder
    from chatterbox.mtl_tts import ChatterboxMultilingualTTS
    from safetensors.torch import load_file

    from mizuoto_runtime.engines.chatterbox import checkpoint

    ours, _ = mtl_say(runtime(), multilingual)
    _mtl_plain["plain"] = ours
    folder = multilingual.parent
    s3gen_state = torch.load(folder / "s3gen.pt", weights_only=True)
    sizes = checkpoint.sizes_of(folder, True, {k: tuple(v.shape) for k, v in s3gen_state.items()})
    ve = VoiceEncoder()
    ve.load_state_dict(torch.load(folder / "ve.pt", weights_only=True))
    t3 = checkpoint.build_t3(sizes, multilingual=True)
    t3.load_state_dict(load_file(folder / "t3_mtl23ls_v2.safetensors"))
    s3gen = checkpoint.build_s3gen(sizes)
    s3gen.load_state_dict(s3gen_state)
    for m in (ve, t3, s3gen):
        m.eval()
    # Upstream's tokenizer downloads Cangjie5_TC.json when built: offline, it goes without (Chinese only).
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    tokenizer = MTLTokenizer(str(folder / "grapheme_mtl_merged_expanded_v1.json"))
    tts = ChatterboxMultilingualTTS(t3, s3gen, ve, tokenizer, "cpu")
    inference = type(t3).inference
    t3.inference = lambda **kw: inference(t3, **{**kw, "max_new_tokens": TOKENS})
    path = tmp_path / "ref.wav"
    soundfile.write(path, REFERENCE.waveform[0].numpy(), REFERENCE.sample_rate, subtype="FLOAT")
    torch.manual_seed(7)
    theirs = tts.generate(MTL_TEXT, "fr", audio_prompt_path=str(path))
    assert ours.shape[-1] > 0 and torch.equal(ours, theirs)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_multilingual_streams_exactly(multilingual: Path, placement: str) -> None:
    """M57 for the multilingual model (14 layers; the alignment analyzer's hooks on three of them)."""
    expected = _mtl_plain.get("plain")
    if expected is None:
        expected = _mtl_plain.setdefault("plain", mtl_say(runtime(), multilingual)[0])
    wav, meta = mtl_say(runtime(placement), multilingual, placement)
    assert torch.equal(wav, expected), f"{placement}: audio differs from the plain CPU run"
    if placement == "whole":
        assert meta["memory"]["streamed_mb"] == 0
    else:
        assert "chatterbox:talker" in meta["memory"]["partial"] and meta["memory"]["streamed_mb"] > 0


def test_the_folder_offers_both_models_and_languages_are_checked(multilingual: Path,
                                                                 chatterbox_checkpoint: Checkpoint) -> None:
    cls = engine_class("chatterbox")
    entries = cls.checkpoint_entries(multilingual.parent)
    assert [(name, info.label) for name, info in entries] == [
        ("", "Chatterbox"), ("t3_mtl23ls_v2.safetensors", "Chatterbox Multilingual")]
    assert entries[1][1].languages[:3] == ["auto", "ar", "da"] and "fr" in entries[1][1].languages
    assert [name for name, _ in cls.checkpoint_entries(chatterbox_checkpoint())] == [""]  # English files only
    rt = Runtime()
    voice = rt.engine("chatterbox", multilingual).voice_prompt(rt.request(), REFERENCE)
    with pytest.raises(ArgumentError, match="'Klingon' is not one Chatterbox Multilingual speaks"):
        rt.engine("chatterbox", multilingual).generate(rt.request(), MTL_TEXT, voice,
                                                       Sampling(language="Klingon", max_new_tokens=2))
    english = rt.engine("chatterbox", chatterbox_checkpoint())
    with pytest.raises(ArgumentError, match="speaks English only, got language 'French'"):
        english.generate(rt.request(), TEXT, english.voice_prompt(rt.request(), REFERENCE),
                         Sampling(language="French", max_new_tokens=2))


WITHOUT_PKG_RESOURCES = """
import sys, json
sys.modules["pkg_resources"] = None  # setuptools >= 81 (ComfyUI's environments): the import fails
import numpy as np
import perth  # imported first without its watermarker, as another package may
assert perth.PerthImplicitWatermarker is None
from mizuoto_runtime.engines.chatterbox.checkpoint import import_upstream
import_upstream()
assert sys.modules["pkg_resources"] is None  # nothing stays behind
x = (0.1 * np.sin(np.arange(18240) / 5)).astype(np.float32)
print(json.dumps(perth.PerthImplicitWatermarker().apply_watermark(x, sample_rate=24000).tolist()))
"""


def test_the_watermark_works_where_setuptools_has_no_pkg_resources() -> None:
    """resemble-perth finds its model with pkg_resources, which setuptools >= 81 no longer has:
    Chatterbox's import gives it a stand-in, and the watermark is the one it gives with it."""
    require_engine("chatterbox")
    import os
    import subprocess
    import sys

    import perth

    from mizuoto_runtime.engines.chatterbox.checkpoint import import_upstream

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", WITHOUT_PKG_RESOURCES], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    import_upstream()
    x = (0.1 * np.sin(np.arange(18240) / 5)).astype(np.float32)
    expected = perth.PerthImplicitWatermarker().apply_watermark(x, sample_rate=24000)
    assert np.array_equal(np.array(json.loads(done.stdout.strip().splitlines()[-1]), dtype=np.float32), expected)
