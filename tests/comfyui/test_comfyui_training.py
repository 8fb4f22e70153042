"""Training in a running ComfyUI server (issue 16): Load TTS Engine → Train Voice LoRA (Qwen3-TTS)
on a folder of clips in the server's input folder → the phase nodes with the trained engine,
beside the same graph on the loader's plain engine; then the saved file through the Apply
Voice LoRA (Qwen3-TTS) node; and ComfyUI's interrupt ending a training run and its process.
Skips where `qwen_tts` cannot be imported under COMFYUI_PYTHON (see test_comfyui_qwen3tts)."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from comfyui_harness import REFERENCE_WAV, ComfyServer, requires_comfyui, running_server, write_tiny_qwen3tts
from test_comfyui_qwen3tts import CHECKPOINT, MAX_NEW_TOKENS

from mizuoto_runtime.app.training.dataset import write_demo_clips
from mizuoto_runtime.nn.lora import read_lora

pytestmark = requires_comfyui

DATASET = "mizuoto_voice"  # under the server's input folder
LORA = "tiny_voice"
RUN_TIMEOUT_S = 600.0
WORKER = "mizuoto_runtime.app.training.worker"


def prepare(root: Path) -> None:
    write_tiny_qwen3tts(root / "models" / "mizuoto" / CHECKPOINT, "base")
    write_demo_clips(root / "input" / DATASET)


@pytest.fixture(scope="module")
def server() -> Iterator[ComfyServer]:
    with running_server("mizuoto-comfyui-train-", prepare, lambda root: {"loras": root / "models" / "loras"}) as s:
        yield s


def speak(engine: list[Any], first: int, prefix: str) -> dict[str, Any]:
    """Voice Prompt (x-vector clone of the reference) → Talker → Codec Decoder → Save Audio (WAV)."""
    ids = [str(first + i) for i in range(4)]
    return {
        ids[0]: {"class_type": "MizuotoVoicePrompt", "inputs": {"engine": engine, "reference": ["2", 0]}},
        ids[1]: {"class_type": "MizuotoTalker",
                 "inputs": {"engine": engine, "voice": [ids[0], 0], "text": "Hello from the tiny model.", "seed": 1,
                            "temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05,
                            "max_new_tokens": MAX_NEW_TOKENS, "do_sample": True, "language": "english"}},
        ids[2]: {"class_type": "MizuotoDecoder", "inputs": {"engine": engine, "codes": [ids[1], 0],
                                                            "allow_fallback": False}},
        ids[3]: {"class_type": "MizuotoSaveWav", "inputs": {"audio": [ids[2], 0], "filename_prefix": prefix}},
    }


def loader() -> dict[str, Any]:
    return {
        "1": {"class_type": "MizuotoEngineLoader",
              "inputs": {"engine": "qwen3tts", "checkpoint": CHECKPOINT, "dtype": "float32"}},
        "2": {"class_type": "LoadAudio", "inputs": {"audio": REFERENCE_WAV}},
    }


def train(steps: int) -> dict[str, Any]:
    return {"class_type": "MizuotoTrainQwen3TTSLoRA",
            "inputs": {"engine": ["1", 0], "dataset": DATASET, "lora_name": LORA, "memory": "low", "steps": steps,
                       "batch_size": 2, "learning_rate": 0.003, "rank": 8, "seed": 0, "language": ""}}


def saved(server: ComfyServer, history: dict[str, Any], node: str) -> bytes:
    item = history["outputs"][node]["audio"][0]
    return (server.output / item["subfolder"] / item["filename"]).read_bytes()


def run(server: ComfyServer, prompt: dict[str, Any]) -> dict[str, Any]:
    history = server.wait_history(server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", (history["status"]["messages"], server.log())
    return history


@pytest.fixture(scope="module")
def trained(server: ComfyServer) -> dict[str, Any]:
    """One prompt: train, then speak with the trained engine and with the loader's own."""
    return run(server, {**loader(), "3": train(steps=6), **speak(["3", 0], 10, "audio/lora"),
                        **speak(["1", 0], 20, "audio/plain")})


def test_a_lora_trained_in_the_graph_changes_the_output(server: ComfyServer, trained: dict[str, Any]) -> None:
    text = trained["outputs"]["3"]["text"][0]
    assert text.startswith(f"{LORA}: 6 steps, loss ") and "training.memory=low" in text, text
    lora = read_lora(server.root / "models" / "loras" / "mizuoto" / f"{LORA}.safetensors", "qwen3tts")
    assert lora.metadata["steps"] == "6" and len(lora.layers) == 28
    assert saved(server, trained, "13") != saved(server, trained, "23")  # the LoRA changed the audio


def test_the_saved_lora_loads_through_the_lora_node(server: ComfyServer, trained: dict[str, Any]) -> None:
    info = server.get("/object_info/MizuotoQwen3TTSLoRA")["MizuotoQwen3TTSLoRA"]["input"]["required"]
    assert f"mizuoto/{LORA}.safetensors" in info["lora"][1]["options"]
    node = {"class_type": "MizuotoQwen3TTSLoRA",
            "inputs": {"engine": ["1", 0], "lora": f"mizuoto/{LORA}.safetensors", "strength": 1.0}}
    history = run(server, {**loader(), "3": node, **speak(["3", 0], 10, "audio/file"),
                           **speak(["1", 0], 20, "audio/plain_again")})
    assert saved(server, history, "13") == saved(server, trained, "13")  # the file = what training applied
    assert saved(server, history, "23") == saved(server, trained, "23")  # the plain engine has its own weights


def workers(server: ComfyServer) -> list[psutil.Process]:
    assert server.process is not None
    return [p for p in psutil.Process(server.process.pid).children(recursive=True)
            if WORKER in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE]


def test_interrupt_ends_the_training_process(server: ComfyServer) -> None:
    prompt_id = server.queue({**loader(), "3": {**train(steps=100_000)}})
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (running := workers(server)):
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.2)
    server.post("/interrupt", {})
    history = server.wait_history(prompt_id, RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "error"
    assert any(kind == "execution_interrupted" for kind, _ in history["status"]["messages"]), history["status"]
    psutil.wait_procs(running, timeout=30)
    assert not workers(server)
