"""VoxCPM 2 in a running ComfyUI server (issue 12): a tiny checkpoint (random weights, the
official folder layout) under the server's `models/mizuoto/voxcpm2/`, and the example workflow
"Voice Clone - VoxCPM 2, step by step" — LoadAudio → Voice Prompt (reference + transcript) →
Talker → Codec Decoder → Save Audio (WAV) — run on a small simulated GPU (Memory Settings added
to its loader), so the generator streams, to a saved WAV file. Skips where `voxcpm` cannot be
imported under COMFYUI_PYTHON.

The checkpoint is written into the server's temporary base folder before the server starts
(the loader lists its choices when ComfyUI builds the node list), never into the ComfyUI tree.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comfyui_harness import (
    REFERENCE_WAV,
    REPO,
    ComfyServer,
    requires_comfyui,
    run_with_comfyui_python,
    running_server,
    ui_to_api,
)
from test_comfyui_qwen3tts import messages, wav_stream_info
from test_comfyui_server import memory_settings

pytestmark = requires_comfyui

CHECKPOINT = "voxcpm2/tiny"  # under models/mizuoto: a grouping folder, then the checkpoint
WORKFLOW = REPO / "example_workflows" / "Voice Clone - VoxCPM 2, step by step (from a reference recording).json"
SAMPLE_RATE = 48000
SAMPLES_PER_PATCH = 4 * 1920
PATCHES = 4  # the tiny model never stops early: max_new_tokens N gives N patches
SIMULATED_MB = 24  # the generator (26 MB) does not fit: it streams
RUN_TIMEOUT_S = 300.0
WRITER = "import sys; from mizuoto_runtime.engines.voxcpm2.tiny import write; write(sys.argv[1])"


def write_tiny(folder: Path) -> None:
    """The tiny checkpoint, written by ComfyUI's Python (the one with `voxcpm`)."""
    run_with_comfyui_python(WRITER, str(folder), needs="voxcpm2")


@pytest.fixture(scope="module")
def voxcpm_server() -> Iterator[ComfyServer]:
    with running_server("mizuoto-comfyui-voxcpm2-",
                        lambda root: write_tiny(root / "models" / "mizuoto" / CHECKPOINT)) as server:
        yield server


def clone_prompt(server: ComfyServer, *, seed: int, prefix: str) -> dict[str, Any]:
    """The example workflow, pointed at the tiny checkpoint on a small simulated GPU."""
    prompt = ui_to_api(json.loads(WORKFLOW.read_text()), server.get("/object_info"))
    prompt["80"] = memory_settings(SIMULATED_MB)
    nodes = {n["class_type"]: n["inputs"] for n in prompt.values()}
    nodes["MizuotoEngineLoader"].update(checkpoint=CHECKPOINT, dtype="float32", memory=["80", 0])
    nodes["LoadAudio"]["audio"] = REFERENCE_WAV  # the harness's reference, in the server's input folder
    nodes["MizuotoTalker"].update(text="Hello from the tiny model.", seed=seed, max_new_tokens=PATCHES)
    nodes["MizuotoSaveWav"]["filename_prefix"] = prefix
    return prompt


def test_example_workflow_clones_a_voice_and_saves_audio(voxcpm_server: ComfyServer) -> None:
    prompt = clone_prompt(voxcpm_server, seed=1, prefix="audio/voxcpm2_clone")
    history = voxcpm_server.wait_history(voxcpm_server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", messages(history)
    saved = [voxcpm_server.output / item["subfolder"] / item["filename"]
             for output in history["outputs"].values() for item in output.get("audio", [])]
    assert len(saved) == 1, history["outputs"]
    assert wav_stream_info(saved[0]) == (SAMPLE_RATE, PATCHES * SAMPLES_PER_PATCH)
    by_type = {prompt[node]["class_type"]: output for node, output in history["outputs"].items()}
    for node_type in ("MizuotoVoicePrompt", "MizuotoTalker", "MizuotoDecoder"):
        assert by_type[node_type]["text"][0].startswith("loaded "), by_type[node_type]  # M50, per phase
    talker = by_type["MizuotoTalker"]["text"][0]
    assert "generator" in talker and "streamed" in talker, talker
    names = {m["name"] for m in voxcpm_server.get("/mizuoto/runtime")["models"]}
    assert names == {"vae_encoder", "generator", "vae_decoder"}
