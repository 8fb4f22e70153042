"""The Qwen3-TTS engine on tiny random checkpoints (issue 6: M1, M4, M15, M27, M40, M45–M46, M50).

Skipped where the `qwen3tts` extra (`qwen_tts`) is not installed. The M57 placements of every
voice mode are in `engines_native/streaming.py`.
"""
from __future__ import annotations

import hashlib
import json
import math
import shutil
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from mizuoto_runtime import CancelledError, CheckpointError, OomInjector, Runtime
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.audio import Audio, write_wav
from mizuoto_runtime.engines import Sampling
from mizuoto_runtime.memory.report import mb

from conftest import link_checkpoint, require_qwen_tts
from support.interrupt import interrupt_at
from support.oom import allocations_during

require_qwen_tts()

pytestmark = pytest.mark.usefixtures("one_torch_thread")

Checkpoint = Callable[[str], Path]
REFERENCE = Audio(0.3 * torch.sin(torch.arange(16000) / 6.0).unsqueeze(0), 16000)
TRANSCRIPT = "a reference sentence"
TEXT = "Hello from the tiny talker."
FRAMES = 3
SAMPLING = Sampling(seed=7, max_new_tokens=FRAMES + 1, language="english")  # N new tokens give N-1 frames


def say(rt: Runtime, folder: Path, seed: int = 7, **voice: object) -> tuple[torch.Tensor, dict]:
    engine = rt.engine("qwen3tts", folder)
    voice = voice or {"reference": REFERENCE, "transcript": TRANSCRIPT}
    sampling = Sampling(seed=seed, max_new_tokens=FRAMES + 1, language="english")
    audio, meta = rt.say(engine, TEXT, sampling=sampling, **voice)  # type: ignore[arg-type]
    return audio.waveform, meta


def simulated(mb_: int, **settings: object) -> Runtime:
    return Runtime({"compute.simulate_vram_mb": mb_, **{f"compute.{k}": v for k, v in settings.items()}})


# ---- the package's own API -------------------------------------------------------------------
def test_every_mode_equals_the_package_one_call_api(qwen3tts_checkpoint: Checkpoint) -> None:
    """Three phases over our own (meta + safetensors) load == `Qwen3TTSModel.generate_*` over
    `from_pretrained`, sample by sample (M27: strict loading loses nothing)."""
    from qwen_tts import Qwen3TTSModel

    ref = (REFERENCE.waveform[0].numpy(), REFERENCE.sample_rate)
    n = FRAMES + 1
    cases = [
        ("base", {"reference": REFERENCE},
         lambda m: m.generate_voice_clone(text=TEXT, language="english", ref_audio=ref, x_vector_only_mode=True,
                                          max_new_tokens=n)),
        ("base", {"reference": REFERENCE, "transcript": TRANSCRIPT},
         lambda m: m.generate_voice_clone(text=TEXT, language="english", ref_audio=ref, ref_text=TRANSCRIPT,
                                          max_new_tokens=n)),
        ("custom_voice", {"speaker": "bob", "instruct": "speak happily"},
         lambda m: m.generate_custom_voice(text=TEXT, speaker="bob", language="english", instruct="speak happily",
                                           max_new_tokens=n)),
        ("voice_design", {"instruct": "A calm low voice."},
         lambda m: m.generate_voice_design(text=TEXT, instruct="A calm low voice.", language="english",
                                           max_new_tokens=n)),
    ]
    rt = Runtime()
    for model_type, voice, one_call in cases:
        folder = qwen3tts_checkpoint(model_type)
        ours, _ = say(rt, folder, **voice)
        upstream = Qwen3TTSModel.from_pretrained(str(folder))
        torch.manual_seed(7)
        wavs, sample_rate = one_call(upstream)
        assert sample_rate == 24000
        assert torch.equal(ours[0], torch.from_numpy(wavs[0])), f"{model_type} {sorted(voice)} differs from the package"


# ---- phases and placement --------------------------------------------------------------------
def test_a_cached_voice_never_places_the_voice_prompt_components(qwen3tts_checkpoint: Checkpoint) -> None:
    """M4: the voice prompt is cached by reference; cloning it again places only talker and decoder.
    An x-vector clone (no transcript) never places the codec encoder."""
    rt = simulated(256)
    folder = qwen3tts_checkpoint("base")
    first, _ = say(rt, folder)
    placed = {name for action, name, _ in rt.manager.events if action == "place"}
    assert {"qwen3tts:codec_encoder", "qwen3tts:speaker_encoder"} <= placed
    rt.manager.events.clear()
    again, meta = say(rt, folder)
    placed = {name for action, name, _ in rt.manager.events if action == "place"}
    assert placed == {"qwen3tts:talker", "qwen3tts:codec_decoder"}
    assert set(meta["memory"]["components"]) == placed
    assert torch.equal(first, again)

    xvector = simulated(256)
    say(xvector, folder, reference=REFERENCE)
    placed = {name for action, name, _ in xvector.manager.events if action == "place"}
    assert placed == {"qwen3tts:speaker_encoder", "qwen3tts:talker", "qwen3tts:codec_decoder"}


PHASES = {"codec_encoder": "voice prompt", "speaker_encoder": "voice prompt", "talker": "talker",
          "codec_decoder": "codec decoder"}


def test_meta_memory_reports_each_phase(qwen3tts_checkpoint: Checkpoint) -> None:
    """M50: per component its phase, loaded and full size; partial ones with the reason.

    16 MB device: the codec encoder (10.6 MB + 8 MB of working memory) and the decoder (10.4 MB
    + 13 MB) stream, the budget too small; the speaker encoder and the talker load whole, each
    after the previous phase's components yield. 28 MB: the talker loads whole, then yields
    part of itself to the decoder."""
    folder = qwen3tts_checkpoint("base")
    for device_mb in (16, 28):
        rt = simulated(device_mb)
        _, meta = say(rt, folder)
        engine = rt.engine("qwen3tts", folder)
        handles = {h.name: h for h in engine.handles()}
        memory = meta["memory"]
        assert {key.split(":")[1]: c["phase"] for key, c in memory["components"].items()} == PHASES
        for key, component in memory["components"].items():
            assert component["size_mb"] == mb(handles[key.split(":")[1]].size_bytes)
        yielded = {k: p for k, p in memory["partial"].items() if p["reason"] == "yielded for another component"}
        for key, partial in memory["partial"].items():
            component = memory["components"][key]
            assert partial["size_mb"] == component["size_mb"] and partial["mode"] == "normal"
            if key in yielded:  # whole in its phase, then gave VRAM to a later phase: what it holds now
                assert partial["loaded_mb"] < component["loaded_mb"] == component["size_mb"]
                assert partial["gave_up_for"]
            else:  # partial in its own phase: that phase's figures
                assert partial["loaded_mb"] == component["loaded_mb"]
                assert 0 < partial["loaded_mb"] < partial["size_mb"]
        placed_whole = {name for action, name, n in rt.manager.events
                        if action == "place" and n == handles[name.split(":")[1]].size_bytes}
        if device_mb == 16:
            assert set(memory["partial"]) - set(yielded) == {"qwen3tts:codec_encoder", "qwen3tts:codec_decoder"}
            assert set(yielded) == {"qwen3tts:speaker_encoder", "qwen3tts:talker"}
            for name in ("codec_encoder", "codec_decoder"):
                assert memory["partial"][f"qwen3tts:{name}"]["reason"] == "budget too small"
            assert memory["partial"]["qwen3tts:codec_encoder"]["gave_up_for"] == ["qwen3tts:speaker_encoder"]
            decoder = memory["partial"]["qwen3tts:codec_decoder"]
            ref_frames = math.ceil(REFERENCE.seconds * 24000 / 1920)  # the ICL decoder decodes them too
            assert (decoder["working_mb"] == mb(engine.codec_decoder_memory(ref_frames + FRAMES))
                    and decoder["free_mb"] == 16)
            assert placed_whole == {"qwen3tts:speaker_encoder", "qwen3tts:talker"}
            assert memory["streamed_mb"] > 0
        else:
            talker = memory["partial"]["qwen3tts:talker"]
            assert set(memory["partial"]) == set(yielded)  # nothing was partial in its own phase
            assert talker["reason"] == "yielded for another component"
            assert talker["gave_up_for"] == ["qwen3tts:codec_decoder"]
            assert placed_whole == set(memory["components"]) and memory["streamed_mb"] == 0


def test_code_predictor_is_hot(qwen3tts_checkpoint: Checkpoint) -> None:
    """M15: when the talker does not fit, its code predictor (15 runs per frame) stays resident
    and the talker's own layers (one run per frame) stream."""
    rt = simulated(256)
    engine = rt.engine("qwen3tts", qwen3tts_checkpoint("base"))
    talker = engine.talker
    talker.cap_bytes = (talker.min_working_set + talker.size_bytes) // 2
    say(rt, qwen3tts_checkpoint("base"))
    streamed = {u.name for u in talker.streamed_units}
    layers = {u.name for u in talker.units if u.name.startswith("model.layers.")}
    assert layers <= streamed
    assert any(u.name.startswith("code_predictor.") and u.name not in streamed for u in talker.units)
    assert talker.kind == "sequence" and talker.graphable and talker.copies == 1  # M20, M24


def test_same_seed_same_audio_after_an_oom_in_the_talker(qwen3tts_checkpoint: Checkpoint) -> None:
    """M40: an OOM mid-generation (a streamed copy) reruns the talker exactly, slower. An x-vector
    clone on a 10 MB device: the talker (11.7 MB) streams."""
    folder = qwen3tts_checkpoint("base")
    voice = {"reference": REFERENCE}
    expected, _ = say(Runtime(), folder, **voice)
    different, _ = say(Runtime(), folder, seed=8, **voice)
    assert not torch.equal(expected, different)

    probe = simulated(10)
    with allocations_during(probe, probe.engine("qwen3tts", folder), "generate") as inside:
        streamed, _ = say(probe, folder, **voice)
    assert torch.equal(streamed, expected)
    assert len(inside) > 20  # the talker streams: copies happen while it generates

    rt = simulated(10)
    injector = OomInjector(at=inside[len(inside) // 2])
    rt.devices.fault_hook = injector
    got, meta = say(rt, folder, **voice)
    assert injector.raised == 1 and meta["applied"]["oom_retries"] == 1
    assert torch.equal(got, expected)


def test_progress_per_talker_step_and_interrupt(qwen3tts_checkpoint: Checkpoint) -> None:
    """The host's progress bar moves once per talker step; an interrupt stops the talker and
    leaves no hook behind."""
    rt = Runtime()
    folder = qwen3tts_checkpoint("voice_design")
    engine = rt.engine("qwen3tts", folder)
    steps: list[tuple[int, int]] = []
    rt.say(engine, TEXT, instruct="calm", sampling=SAMPLING, on_progress=lambda d, t: steps.append((d, t)))
    total = FRAMES + 1
    assert steps == [(i, total) for i in range(total + 1)]

    cancel_check, progress = interrupt_at(1)
    with pytest.raises(CancelledError):
        rt.say(engine, TEXT, instruct="calm", sampling=SAMPLING, cancel_check=cancel_check, on_progress=progress)
    assert not engine.tts.model.talker._forward_pre_hooks
    audio, _ = rt.say(engine, TEXT, instruct="calm", sampling=SAMPLING)
    assert audio.waveform.shape[-1] == FRAMES * 1920


def test_voice_arguments_are_checked(qwen3tts_checkpoint: Checkpoint) -> None:
    from mizuoto_runtime import MizuotoError

    rt = Runtime()
    base = rt.engine("qwen3tts", qwen3tts_checkpoint("base"))
    custom = rt.engine("qwen3tts", qwen3tts_checkpoint("custom_voice"))
    design = rt.engine("qwen3tts", qwen3tts_checkpoint("voice_design"))
    ctx = rt.request()
    with pytest.raises(MizuotoError, match="reference audio"):
        base.voice_prompt(ctx)
    with pytest.raises(MizuotoError, match="alice, bob, dylan"):
        custom.voice_prompt(ctx)
    with pytest.raises(MizuotoError, match="Unsupported speakers"):
        custom.voice_prompt(ctx, speaker="carol")
    with pytest.raises(MizuotoError, match="no voice cloning"):
        design.voice_prompt(ctx, REFERENCE)
    voice = custom.voice_prompt(ctx, speaker="alice")
    with pytest.raises(MizuotoError, match="Unsupported languages"):
        custom.generate(ctx, TEXT, voice, Sampling(language="klingon"))
    assert custom.codec_encoder is None and custom.speaker_encoder is None  # nothing to clone with
    assert custom.tts.model.speech_tokenizer.model.encoder is None


# ---- working memory (M45, M46) ---------------------------------------------------------------
def test_estimates_follow_the_request_not_the_worst_case(qwen3tts_checkpoint: Checkpoint) -> None:
    engine = Runtime().engine("qwen3tts", qwen3tts_checkpoint("base"))
    assert engine.frames_for(10, Sampling(max_new_tokens=8192)) == 160  # 16 frames per text token
    assert engine.frames_for(10, Sampling(max_new_tokens=41)) == 40  # N new tokens give N-1 frames
    short = engine.talker_memory(prompt_len=30, frames=160)
    assert short < engine.talker_memory(prompt_len=30, frames=8191) / 20
    assert engine.talker_memory(30, 160) < engine.talker_memory(30, 320)
    # The decoder works in chunks of 300 + 25 frames: only the waveform grows beyond one chunk.
    one_chunk = engine.codec_decoder_memory(325)
    assert engine.codec_decoder_memory(100) < one_chunk
    assert engine.codec_decoder_memory(3000) - one_chunk == 4 * 4 * (3000 - 325) * 1920  # float32, four copies
    for estimate in (engine.codec_encoder_memory, engine.speaker_encoder_memory):
        assert 0 < estimate(24000) < estimate(48000) < 2.1 * estimate(24000)  # from the reference length


LONG_REFERENCE = Audio(REFERENCE.waveform.repeat(1, 5), REFERENCE.sample_rate)  # 63 codes


@pytest.mark.parametrize(("model_type", "voice"), [
    ("base", {"reference": REFERENCE, "transcript": TRANSCRIPT}),  # ICL: the text outlasts the reference's codes
    ("base", {"reference": LONG_REFERENCE, "transcript": TRANSCRIPT}),  # ICL: the codes outlast transcript and text
    ("base", {"reference": REFERENCE}),  # x-vector only
    ("custom_voice", {"speaker": "alice", "instruct": "Cheerful."}),
    ("voice_design", {"instruct": "A calm, low voice."}),
])
def test_the_prompt_layout_is_what_the_package_prefills(qwen3tts_checkpoint: Checkpoint, model_type: str,
                                                        voice: dict) -> None:
    """Issue 35: the talker estimate's prompt is the one `generate` builds — voice cloning
    prefills the reference's codes, not its transcript and the text (they trail, one position
    per frame) — an upper bound of the prefill by at most the tags a request leaves out, and
    the trailing text exactly."""
    rt = Runtime()
    engine = rt.engine("qwen3tts", qwen3tts_checkpoint(model_type))
    layouts, prefills = [], []
    layout = engine.prompt_layout
    engine.prompt_layout = lambda inputs: layouts.append(layout(inputs)) or layouts[-1]

    def prefill(_module: torch.nn.Module, _args: tuple, kwargs: dict) -> None:
        if kwargs["inputs_embeds"].shape[1] > 1:
            prefills.append((kwargs["inputs_embeds"].shape[1], kwargs["trailing_text_hidden"].shape[1]))

    hook = engine.tts.model.talker.register_forward_pre_hook(prefill, with_kwargs=True)
    try:
        rt.say(engine, TEXT, sampling=SAMPLING, **voice)
    finally:
        hook.remove()
    (positions, trailing), = prefills
    # only streamed text trails: voice cloning's, unless the reference's codes outlast it
    assert (trailing == 1) == (model_type != "base" or voice["reference"] is LONG_REFERENCE)
    assert 0 <= layouts[0].positions - positions <= 2  # the speaker and the language tag, where absent
    assert layouts[0].trailing == trailing


# ---- loading (M27) ---------------------------------------------------------------------------
def test_loading_errors_name_what_is_wrong(qwen3tts_checkpoint: Checkpoint, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = qwen3tts_checkpoint("base")
    rt = Runtime()
    with pytest.raises(CheckpointError, match="folder not found"):
        rt.engine("qwen3tts", tmp_path / "nowhere")
    missing = link_checkpoint(folder, tmp_path / "missing",
                              skip=("generation_config.json", "speech_tokenizer/model.safetensors"))
    with pytest.raises(CheckpointError, match="missing generation_config.json, speech_tokenizer/model.safetensors"):
        rt.engine("qwen3tts", missing)

    wrong_type = link_checkpoint(folder, tmp_path / "wrong_type", skip=("config.json",))
    config = json.loads((folder / "config.json").read_text())
    (wrong_type / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(CheckpointError, match="config.json: model_type is 'llama'"):
        rt.engine("qwen3tts", wrong_type)

    # The speech tokenizer's weights where the talker's should be: one error, naming both sides.
    swapped = link_checkpoint(folder, tmp_path / "swapped", skip=("model.safetensors",))
    (swapped / "model.safetensors").symlink_to(folder / "speech_tokenizer" / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        rt.engine("qwen3tts", swapped)
    assert "missing talker.codec_head.weight" in str(err.value) and "unexpected decoder." in str(err.value)

    mismatched = link_checkpoint(folder, tmp_path / "mismatched", skip=("model.safetensors",))
    state = load_file(str(folder / "model.safetensors"))
    state["talker.codec_head.weight"] = state["talker.codec_head.weight"][:-1].clone()
    save_file(state, str(mismatched / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"shape of talker.codec_head.weight: checkpoint \(1087, 256\), "
                                              r"model \(1088, 256\)"):
        rt.engine("qwen3tts", mismatched)
    assert rt.manager.handles == []  # nothing half-registered


def test_bf16_load_converts_in_place(qwen3tts_checkpoint: Checkpoint) -> None:
    """M27: talker and speaker encoder load straight into bf16 (built on meta in bf16, each tensor
    converted as it is copied in) and equal both `from_pretrained(dtype=bf16)` and float32-then-
    convert; the speech tokenizer stays float32; the bf16 engine speaks."""
    from qwen_tts import Qwen3TTSModel

    folder = qwen3tts_checkpoint("base")
    rt = Runtime()
    half = rt.engine("qwen3tts", folder, "bfloat16")
    full = rt.engine("qwen3tts", folder, "float32")
    upstream = Qwen3TTSModel.from_pretrained(str(folder), dtype=torch.bfloat16)
    for name in ("talker", "speaker_encoder"):
        ours = getattr(half.tts.model, name).state_dict()
        theirs = getattr(upstream.model, name).state_dict()
        converted = {k: v.to(torch.bfloat16) if v.is_floating_point() else v
                     for k, v in getattr(full.tts.model, name).state_dict().items()}
        assert ours.keys() == theirs.keys() == converted.keys()
        for key, value in ours.items():
            if key.endswith("inv_freq"):
                continue  # buffers computed at construction, float32 in both
            assert value.dtype == torch.bfloat16, key
            assert torch.equal(value, theirs[key]) and torch.equal(value, converted[key]), key
    codec = half.tts.model.speech_tokenizer.model
    assert {p.dtype for p in codec.parameters()} == {torch.float32}
    audio, _ = rt.say(half, TEXT, reference=REFERENCE, transcript=TRANSCRIPT, sampling=SAMPLING)
    assert audio.waveform.dtype == torch.float32 and audio.waveform.shape[-1] == FRAMES * 1920


# ---- CLI -------------------------------------------------------------------------------------
def test_cli_say_and_tiny_checkpoint(qwen3tts_checkpoint: Checkpoint, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = qwen3tts_checkpoint("base")
    write_wav(tmp_path / "ref.wav", REFERENCE)
    out = tmp_path / "out.wav"
    code = main(["say", "--engine", "qwen3tts", "--model", str(folder), TEXT, "-o", str(out),
                 "--voice", str(tmp_path / "ref.wav"), "--ref-text", TRANSCRIPT, "--language", "english",
                 "--seed", "3", "--max-new-tokens", str(FRAMES + 1), "--setting", "compute.simulate_vram_mb=64"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["sample_rate"] == 24000
    assert "qwen3tts:codec_encoder" in result["memory"]["components"]
    with wave.open(str(out)) as f:
        assert f.getframerate() == 24000 and f.getnframes() == FRAMES * 1920
        samples = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
    assert np.abs(samples).max() > 100  # not silence

    code = main(["say", "--engine", "qwen3tts", "--model", str(qwen3tts_checkpoint("custom_voice")), TEXT,
                 "-o", str(tmp_path / "cv.wav"), "--speaker", "dylan", "--instruct", "whisper", "--language",
                 "chinese", "--max-new-tokens", str(FRAMES + 1)])
    assert code == 0 and json.loads(capsys.readouterr().out)["seconds"] == FRAMES * 0.08

    code = main(["tiny-checkpoint", "--engine", "qwen3tts", str(tmp_path / "again"), "--type", "base"])
    assert code == 0 and "speech_tokenizer/model.safetensors" in json.loads(capsys.readouterr().out)["files"]
    for name in ("model.safetensors", "speech_tokenizer/model.safetensors", "config.json", "vocab.json"):
        digest = [hashlib.sha256((root / name).read_bytes()).hexdigest() for root in (folder, tmp_path / "again")]
        assert digest[0] == digest[1], f"{name} is not byte-identical across runs"
    shutil.rmtree(tmp_path / "again")


@pytest.mark.parametrize("ran", [False, True])
def test_unloading_on_the_simulated_device_leaves_nothing(qwen3tts_checkpoint: Checkpoint, ran: bool) -> None:
    """Issue 10, item 9: unloading an engine whose buffers are strict stand-ins (never placed,
    or moved off) raises nothing and leaves no component registered and nothing on the device."""
    rt = simulated(24)
    folder = qwen3tts_checkpoint("base")
    engine = rt.engine("qwen3tts", folder)
    if ran:
        say(rt, folder)
    assert rt.unload_engine("qwen3tts", folder)
    assert rt.manager.handles == [] and all(h.unloaded for h in engine.handles())
    assert rt.devices.counted_bytes(torch.device("cpu")) == 0
    assert rt.describe()["models"] == []
    again, _ = say(rt, folder)  # the engine loads again and runs
    assert again.numel() > 0
