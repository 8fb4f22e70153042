"""VibeVoice in a running ComfyUI server (issue 34): a tiny checkpoint (random weights, the
published ``-hf`` layout) under the server's ``models/mizuoto/VibeVoice-1.5B-hf/`` (the folder the
template names), and the example workflow "Script to Speech - VibeVoice, two voices in one pass" —
two recordings → Character Voices (Alice, Bob) → Script to Speech → Save Audio (WAV) — run on a
simulated GPU with every unit streamed (Memory Settings added to its loader): the three lines,
two characters and no pause, are one dialogue pass, saved as one WAV.

The checkpoint is written by ComfyUI's own Python; skips where it cannot import diffusers
(requirements/vibevoice.txt: VibeVoice's noise scheduler).
"""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

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
from test_comfyui_qwen3tts import messages, wav_stream_info
from test_comfyui_server import memory_settings, node_of

pytestmark = requires_comfyui

CHECKPOINT = "VibeVoice-1.5B-hf"  # under models/mizuoto: the folder the template names
WORKFLOW = REPO / "example_workflows" / "Script to Speech - VibeVoice, two voices in one pass.json"
SAMPLE_RATE = 24000
HOP = 3200  # samples per frame (7.5 Hz)
FRAMES = 4  # max_new_tokens: the tiny model speaks every one of them
SIMULATED_MB = 64
RUN_TIMEOUT_S = 300.0
WRITER = """
import importlib.util, sys
if importlib.util.find_spec("diffusers") is None:
    sys.exit(3)
from mizuoto_runtime.engines.vibevoice.tiny import write
write(sys.argv[1])
"""
WRITTEN: list[bool] = []


def write_tiny(root: Path) -> None:
    done = subprocess.run([COMFYUI_PYTHON, "-c", WRITER, str(root / "models" / "mizuoto" / CHECKPOINT)], cwd=REPO,
                          env=comfyui_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 3), f"writing the tiny VibeVoice checkpoint failed:\n{done.stderr[-4000:]}"
    WRITTEN.append(done.returncode == 0)


@pytest.fixture(scope="module")
def vibevoice_server() -> Iterator[ComfyServer]:
    with running_server("mizuoto-comfyui-vibevoice-", write_tiny) as server:
        yield server


def test_the_template_speaks_a_dialogue_in_one_pass(vibevoice_server: ComfyServer) -> None:
    if not WRITTEN[-1]:
        pytest.skip(f"diffusers is not importable under {COMFYUI_PYTHON} (requirements/vibevoice.txt)")
    prompt = ui_to_api(json.loads(WORKFLOW.read_text()), vibevoice_server.get("/object_info"))
    prompt["80"] = memory_settings(SIMULATED_MB)
    prompt["80"]["inputs"]["vram_mode"] = "none"  # every unit streams
    node_of(prompt, "MizuotoEngineLoader").update(dtype="float32", memory=["80", 0])
    for node in prompt.values():
        if node["class_type"] == "LoadAudio":
            node["inputs"]["audio"] = REFERENCE_WAV  # the harness's 16 kHz reference: resampled to 24 kHz
    node_of(prompt, "MizuotoScriptToSpeech").update(seed=1, max_new_tokens=FRAMES)
    node_of(prompt, "MizuotoSaveWav")["filename_prefix"] = "audio/vibevoice_dialogue"
    history = vibevoice_server.wait_history(vibevoice_server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", messages(history)
    saved = [vibevoice_server.output / item["subfolder"] / item["filename"]
             for output in history["outputs"].values() for item in output.get("audio", [])]
    assert len(saved) == 1, history["outputs"]
    rate, samples = wav_stream_info(saved[0])
    assert rate == SAMPLE_RATE and samples == FRAMES * HOP  # one pass for the three lines
    models = vibevoice_server.get("/mizuoto/runtime")["models"]
    assert {m["name"] for m in models if m["engine"] == "vibevoice"} == {
        "acoustic_encoder", "talker", "acoustic_decoder", "semantic_encoder"}
