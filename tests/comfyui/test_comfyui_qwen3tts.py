"""Qwen3-TTS in a running ComfyUI server: tiny checkpoints of the three types (random weights,
the official folder layout) under the server's `models/mizuoto/qwen3tts/`.

* What ComfyUI lists needs only the checkpoints' configs: `/object_info` offers each folder with
  its type, and the speakers and languages of the tiny checkpoints; a wrong choice is refused
  when the prompt is queued. The checkpoints are written by any Python that has `qwen_tts`.
* Running a graph needs `qwen_tts` in ComfyUI's own Python (those tests skip, saying so,
  otherwise): the phase graph LoadAudio → Voice Clone → Text → Speech Codes → Speech Codes →
  Audio → SaveAudio, and the three Qwen3-TTS templates with their checkpoint set to a tiny one.

The checkpoints are written into the server's temporary base folder before the server starts,
never into the ComfyUI tree.
"""
from __future__ import annotations

import json
import struct
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comfyui_harness import (
    COMFYUI_PATH,
    COMFYUI_PYTHON,
    REFERENCE_WAV,
    REPO,
    ComfyServer,
    qwen_tts_problem,
    requires_comfyui,
    running_server,
    ui_to_api,
    write_tiny_qwen3tts,
)

pytestmark = requires_comfyui

TINY = {"base": "qwen3tts/tiny-base", "custom_voice": "qwen3tts/tiny-cv", "voice_design": "qwen3tts/tiny-design"}
CHECKPOINT = TINY["base"]  # a grouping folder, then the checkpoint
CHOICES = ["qwen3tts/tiny-base", "qwen3tts/tiny-cv (CustomVoice)", "qwen3tts/tiny-design (VoiceDesign)"]
SPEAKERS = ["alice", "bob", "dylan"]
LANGUAGES = ["auto", "chinese", "english", "german"]
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920  # 12.5 frames per second
MAX_NEW_TOKENS = 8  # N new tokens give at most N - 1 frames
RUN_TIMEOUT_S = 300.0
TEMPLATES = REPO / "example_workflows"

QWEN_TTS_PROBLEM = qwen_tts_problem(COMFYUI_PYTHON) if COMFYUI_PATH else None
runs_qwen3tts = pytest.mark.skipif(QWEN_TTS_PROBLEM is not None,
                                   reason=f"ComfyUI cannot run Qwen3-TTS: {QWEN_TTS_PROBLEM}")


def write_checkpoints(root: Path) -> None:
    for model_type, name in TINY.items():
        write_tiny_qwen3tts(root / "models" / "mizuoto" / name, model_type)


@pytest.fixture(scope="module")
def qwen_server() -> Iterator[ComfyServer]:
    with running_server("mizuoto-comfyui-qwen-", write_checkpoints) as server:
        yield server


def clone_prompt(*, seed: int, prefix: str, instruct: str = "", language: str = "english") -> dict[str, Any]:
    """Load TTS Engine → Voice Clone (reference from LoadAudio, no transcript: x-vector clone) →
    Text → Speech Codes → Speech Codes → Audio → SaveAudio (FLAC) and Save Audio (WAV)."""
    engine = ["1", 0]
    return {
        "1": {"class_type": "MizuotoEngineLoader",
              "inputs": {"engine": "qwen3tts", "checkpoint": CHECKPOINT, "dtype": "float32"}},
        "2": {"class_type": "LoadAudio", "inputs": {"audio": REFERENCE_WAV}},
        "3": {"class_type": "MizuotoVoicePrompt",
              "inputs": {"engine": engine, "reference": ["2", 0], "instruct": instruct}},
        "4": {"class_type": "MizuotoTalker",
              "inputs": {"engine": engine, "voice": ["3", 0], "text": "Hello from the tiny model.", "seed": seed,
                         "temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05,
                         "max_new_tokens": MAX_NEW_TOKENS, "do_sample": True, "language": language}},
        "5": {"class_type": "MizuotoDecoder", "inputs": {"engine": engine, "codes": ["4", 0], "allow_fallback": False}},
        "6": {"class_type": "SaveAudio", "inputs": {"audio": ["5", 0], "filename_prefix": prefix}},
        "7": {"class_type": "MizuotoSaveWav", "inputs": {"audio": ["5", 0], "filename_prefix": prefix + "_wav"}},
    }


def flac_stream_info(path: Path) -> tuple[int, int]:
    """(sample rate, total samples) from a FLAC file's STREAMINFO block, which comes first."""
    data = path.read_bytes()
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0, "not a FLAC file starting with STREAMINFO"
    packed = struct.unpack(">Q", data[18:26])[0]  # STREAMINFO bytes 10-17 (after a 4-byte block header)
    return packed >> 44, packed & ((1 << 36) - 1)  # 20 bits rate, 3 channels, 5 bits per sample, 36 samples


def wav_stream_info(path: Path) -> tuple[int, int]:
    """(sample rate, total samples) of a WAV file, as Save Audio (WAV) writes them."""
    with wave.open(str(path), "rb") as f:
        return f.getframerate(), f.getnframes()


def messages(history: dict[str, Any]) -> dict[str, Any]:
    return dict(history["status"]["messages"])


def test_the_checkpoint_is_one_choice_without_its_subfolders(qwen_server: ComfyServer) -> None:
    options = qwen_server.get("/object_info/MizuotoEngineLoader")["MizuotoEngineLoader"]["input"]["required"]
    choices = options["checkpoint"][1]["options"]
    assert CHECKPOINT in choices and "qwen3tts" not in choices
    assert not [c for c in choices if c.startswith(CHECKPOINT + "/")], choices  # no speech_tokenizer/


def test_dropdowns_offer_the_tiny_checkpoints_with_their_types_speakers_and_languages(qwen_server: ComfyServer) -> None:
    info = qwen_server.get("/object_info")
    tts = info["MizuotoTTS"]["input"]["optional"]
    assert tts["checkpoint"][1]["options"] == ["none", "demo-small", *CHOICES]  # the demo engine's, then ours
    assert tts["speaker"][1]["options"] == ["none", *SPEAKERS]
    assert tts["language"][1]["options"] == LANGUAGES
    assert info["MizuotoVoicePrompt"]["input"]["optional"]["speaker"][1]["options"] == ["none", *SPEAKERS]
    assert info["MizuotoTalker"]["input"]["optional"]["language"][1]["options"] == LANGUAGES
    # Per engine, what the web extension narrows the lists to.
    engines = qwen_server.get("/mizuoto/checkpoints")["engines"]
    qwen = {c["value"]: c for c in engines["qwen3tts"]["choices"]}
    assert list(qwen) == CHOICES
    assert [qwen[c]["label"] for c in CHOICES] == ["Base", "CustomVoice", "VoiceDesign"]
    assert qwen[CHOICES[1]]["speakers"] == SPEAKERS and qwen[CHOICES[0]]["speakers"] == []
    assert all(c["languages"] == LANGUAGES for c in qwen.values())
    assert [c["value"] for c in engines["demo"]["choices"]] == ["none", "demo-small"]


def tts_prompt(**inputs: Any) -> dict[str, Any]:
    widgets = {"text": "Hello there.", "seed": 1, "temperature": 0.9, "top_k": 50, "top_p": 1.0,
               "repetition_penalty": 1.05, "max_new_tokens": MAX_NEW_TOKENS, "do_sample": True,
               "allow_fallback": False}
    return {"1": {"class_type": "MizuotoTTS", "inputs": {**widgets, **inputs}},
            "2": {"class_type": "SaveAudio", "inputs": {"audio": ["1", 0], "filename_prefix": "audio/refused"}}}


@pytest.mark.parametrize(("inputs", "refusal"), [
    ({"engine_name": "qwen3tts", "checkpoint": CHECKPOINT, "speaker": "alice"},
     "speaker 'alice': checkpoint 'qwen3tts/tiny-base' has no built-in speakers"),
    ({"engine_name": "qwen3tts", "checkpoint": CHOICES[1], "language": "klingon"},
     "language 'klingon': checkpoint 'qwen3tts/tiny-cv (CustomVoice)' takes auto, chinese, english, german"),
    ({"engine_name": "demo", "checkpoint": CHOICES[1]}, "is for Qwen3-TTS, not Demo"),
    ({"engine_name": "qwen3tts", "checkpoint": "none"}, "Qwen3-TTS needs a checkpoint folder; Qwen3-TTS can load: "),
])
def test_a_choice_that_does_not_fit_is_refused_when_queued(qwen_server: ComfyServer, inputs: dict[str, Any],
                                                           refusal: str) -> None:
    answer = qwen_server.post_raw("/prompt", {"prompt": tts_prompt(**inputs)})
    details = [e["details"] for e in answer["node_errors"]["1"]["errors"]]
    assert any(refusal in d for d in details), details


@runs_qwen3tts
def test_x_vector_clone_graph_saves_audio(qwen_server: ComfyServer) -> None:
    history = qwen_server.wait_history(qwen_server.queue(clone_prompt(seed=1, prefix="audio/qwen_clone")),
                                       RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", messages(history)
    saved = {node: [qwen_server.output / item["subfolder"] / item["filename"] for item in output.get("audio", [])]
             for node, output in history["outputs"].items() if output.get("audio")}
    assert set(saved) == {"6", "7"} and all(len(files) == 1 for files in saved.values()), history["outputs"]
    rate, samples = flac_stream_info(saved["6"][0])
    assert rate == SAMPLE_RATE and 0 < samples <= (MAX_NEW_TOKENS - 1) * SAMPLES_PER_FRAME, (rate, samples)
    with wave.open(str(saved["7"][0])) as wav:  # the same audio as a 16-bit PCM WAV
        assert (wav.getframerate(), wav.getnframes(), wav.getsampwidth()) == (SAMPLE_RATE, samples, 2)
    for node in ("3", "4", "5"):  # each phase placed its components and reported them (M50)
        assert history["outputs"][node]["text"][0].startswith("loaded "), history["outputs"][node]
    names = {m["name"] for m in qwen_server.get("/mizuoto/runtime")["models"]}
    assert {"speaker_encoder", "codec_encoder", "talker", "codec_decoder"} <= names


@runs_qwen3tts
@pytest.mark.parametrize(("change", "node_type", "refusal"), [
    ({"instruct": "A calm, low voice."}, "MizuotoVoicePrompt", "takes no speaker or instruct"),
    ({"language": "klingon"}, "MizuotoTalker", "Unsupported languages: ['klingon']"),
])
def test_instruct_and_language_reach_the_engine(qwen_server: ComfyServer, change: dict[str, str], node_type: str,
                                                refusal: str) -> None:
    """A Base checkpoint refuses instruct, and the package refuses a language it does not know:
    the node's input got to the engine (each fails before any generation)."""
    history = qwen_server.wait_history(qwen_server.queue(clone_prompt(seed=1, prefix="audio/refused", **change)),
                                       RUN_TIMEOUT_S)
    error = messages(history).get("execution_error", {})
    assert history["status"]["status_str"] == "error" and error.get("node_type") == node_type, error
    assert refusal in error["exception_message"]


@runs_qwen3tts
@pytest.mark.parametrize(("template", "model_type"), [
    ("Text to Speech - Qwen3-TTS CustomVoice (built-in speakers)", "custom_voice"),
    ("Voice Clone - Qwen3-TTS Base (from a reference recording)", "base"),
    ("Voice Design - Qwen3-TTS VoiceDesign (describe the voice)", "voice_design"),
])
def test_qwen3tts_templates_speak_with_a_tiny_checkpoint(qwen_server: ComfyServer, template: str,
                                                         model_type: str) -> None:
    """Each Qwen3-TTS template as the frontend would queue it, its checkpoint (the official
    folder name) swapped for the tiny one of the same type and its speaker for a tiny one."""
    prompt = ui_to_api(json.loads((TEMPLATES / f"{template}.json").read_text()), qwen_server.get("/object_info"))
    tts = next(n["inputs"] for n in prompt.values() if n["class_type"] == "MizuotoTTS")
    assert tts["checkpoint"].startswith("Qwen3-TTS-12Hz-") and tts["engine_name"] == "qwen3tts"
    tts.update(checkpoint=TINY[model_type], max_new_tokens=MAX_NEW_TOKENS, dtype="float32")
    if model_type == "custom_voice":
        tts["speaker"] = SPEAKERS[0]
    history = qwen_server.wait_history(qwen_server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", messages(history)
    files = [qwen_server.output / item["subfolder"] / item["filename"]
             for output in history["outputs"].values() for item in output.get("audio", [])]
    assert len(files) == 1 and wav_stream_info(files[0])[0] == SAMPLE_RATE  # the templates save WAV


def with_memory_settings(prompt: dict[str, Any], simulate_vram_mb: int) -> dict[str, Any]:
    """The graph under Mizuoto Memory Settings: the CPU acts as a `simulate_vram_mb` GPU (M55)."""
    prompt["8"] = {"class_type": "MizuotoMemorySettings",
                   "inputs": {"vram_mode": "normal", "vram_reserve_mb": -1, "vram_limit_mb": 0, "async_offload": 1,
                              "host_copies": "auto", "oom_retry": True, "oom_fallback": False,
                              "simulate_vram_mb": simulate_vram_mb}}
    prompt["1"]["inputs"]["memory"] = ["8", 0]
    return prompt


@runs_qwen3tts
def test_unloading_on_the_simulated_device_leaves_nothing(qwen_server: ComfyServer) -> None:
    """Issue 10, item 9: a new simulated size reloads the engine, and "Unload Models and
    Execution Cache" (`/free`) unloads it — with no error in a finalizer and no component left
    registered (each is listed once, then none)."""
    for size in (64, 48):  # the second size replaces the runtime: the first one's engine unloads
        prompt = with_memory_settings(clone_prompt(seed=3, prefix=f"audio/qwen_sim{size}"), size)
        history = qwen_server.wait_history(qwen_server.queue(prompt), RUN_TIMEOUT_S)
        assert history["status"]["status_str"] == "success", messages(history)
        state = qwen_server.get("/mizuoto/runtime")
        assert state["device"]["simulated"] and state["device"]["total_mb"] == size
        names = [m["name"] for m in state["models"]]
        assert sorted(names) == ["codec_decoder", "codec_encoder", "speaker_encoder", "talker"], names
    qwen_server.free_until(lambda s: s["models"] == [])
    log = qwen_server.log_path.read_text(errors="replace")
    assert "StrictDeviceError" not in log and "Exception ignored" not in log, log[-4000:]
