"""Qwen3-TTS in a running ComfyUI server (issue 6): a tiny Base checkpoint (random weights, the
official folder layout) under the server's `models/mizuoto/qwen3tts/`, and the phase graph
LoadAudio → Voice Prompt (x-vector clone) → Talker → Codec Decoder → SaveAudio run to a saved
FLAC file. Skips where `qwen_tts` cannot be imported under COMFYUI_PYTHON.

The checkpoint is written into the server's temporary base folder before the server starts
(the loader lists its choices when ComfyUI builds the node list), never into the ComfyUI tree.
"""
from __future__ import annotations

import struct
import wave
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comfyui_harness import COMFYUI_PYTHON, REFERENCE_WAV, REPO, ComfyServer, comfyui_env, requires_comfyui, running_server

pytestmark = requires_comfyui

CHECKPOINT = "qwen3tts/tiny-base"  # under models/mizuoto: a grouping folder, then the checkpoint
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920  # 12.5 frames per second
MAX_NEW_TOKENS = 8  # N new tokens give at most N - 1 frames
RUN_TIMEOUT_S = 300.0
WRITE_TIMEOUT_S = 300
NO_QWEN_TTS = 3  # the writer's exit status when qwen_tts cannot be imported
WRITER = f"""
import sys
try:
    import qwen_tts  # noqa: F401
except ImportError as exc:
    print(f"qwen_tts is not importable under {{sys.executable}}: {{exc}}", file=sys.stderr)
    sys.exit({NO_QWEN_TTS})
from mizuoto_runtime.engines.qwen3tts_tiny import write_tiny_checkpoint
write_tiny_checkpoint(sys.argv[1], model_type="base")
"""


def write_tiny_base(folder: Path) -> None:
    """The tiny Base checkpoint, written by ComfyUI's Python (the one with `qwen_tts`)."""
    done = subprocess.run([COMFYUI_PYTHON, "-c", WRITER, str(folder)], cwd=REPO, env=comfyui_env(),
                          capture_output=True, text=True, timeout=WRITE_TIMEOUT_S)
    if done.returncode == NO_QWEN_TTS:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, f"writing the tiny checkpoint failed:\n{done.stderr[-4000:]}"


@pytest.fixture(scope="module")
def qwen_server() -> Iterator[ComfyServer]:
    with running_server("mizuoto-comfyui-qwen-",
                        lambda root: write_tiny_base(root / "models" / "mizuoto" / CHECKPOINT)) as server:
        yield server


def clone_prompt(*, seed: int, prefix: str, instruct: str = "", language: str = "english") -> dict[str, Any]:
    """Engine Loader → Voice Prompt (reference from LoadAudio, no transcript: x-vector clone) →
    Talker → Codec Decoder → SaveAudio (FLAC) and Mizuoto Save Audio (WAV)."""
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


def messages(history: dict[str, Any]) -> dict[str, Any]:
    return dict(history["status"]["messages"])


def test_the_checkpoint_is_one_choice_without_its_subfolders(qwen_server: ComfyServer) -> None:
    options = qwen_server.get("/object_info/MizuotoEngineLoader")["MizuotoEngineLoader"]["input"]["required"]
    choices = options["checkpoint"][1]["options"]
    assert CHECKPOINT in choices and "qwen3tts" not in choices
    assert not [c for c in choices if c.startswith(CHECKPOINT + "/")], choices  # no speech_tokenizer/


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
    assert names == {"speaker_encoder", "codec_encoder", "talker", "codec_decoder"}


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


def free_until(server: ComfyServer, condition: Any, attempts: int = 12) -> None:
    """POST /free until `condition(GET /mizuoto/runtime)` holds. ComfyUI's prompt worker reads the
    flag when its queue wakes it; a /free sent while the worker runs its garbage collection after
    a prompt misses that wake-up and waits for the next one (up to 1000 s in v0.3.64), so ask again."""
    for _ in range(attempts - 1):
        server.post("/free", {"unload_models": True, "free_memory": True})
        try:
            server.wait_runtime(condition, timeout_s=10.0)
            return
        except TimeoutError:
            continue
    server.post("/free", {"unload_models": True, "free_memory": True})
    server.wait_runtime(condition, timeout_s=10.0)


def with_memory_settings(prompt: dict[str, Any], simulate_vram_mb: int) -> dict[str, Any]:
    """The graph under Mizuoto Memory Settings: the CPU acts as a `simulate_vram_mb` GPU (M55)."""
    prompt["8"] = {"class_type": "MizuotoMemorySettings",
                   "inputs": {"vram_mode": "normal", "vram_reserve_mb": -1, "vram_limit_mb": 0, "async_offload": 1,
                              "host_copies": "auto", "oom_retry": True, "oom_fallback": False,
                              "simulate_vram_mb": simulate_vram_mb}}
    prompt["1"]["inputs"]["memory"] = ["8", 0]
    return prompt


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
    free_until(qwen_server, lambda s: s["models"] == [])
    log = qwen_server.log_path.read_text(errors="replace")
    assert "StrictDeviceError" not in log and "Exception ignored" not in log, log[-4000:]
