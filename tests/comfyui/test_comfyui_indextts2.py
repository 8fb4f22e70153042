"""IndexTTS-2 in a running ComfyUI server (issue 25): a tiny checkpoint (random weights, the
published layout) under the server's `models/mizuoto/indextts2/`, and a step-by-step graph —
Load TTS Engine (with Memory Settings for a small simulated GPU) → LoadAudio → Voice Clone →
Emotion (IndexTTS-2) → Text → Speech Codes → Speech Codes → Audio → SaveAudio — that saves audio.
The checkpoint is written by ComfyUI's Python into the server's temporary base folder."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comfyui_harness import REFERENCE_WAV, ComfyServer, requires_comfyui, run_with_comfyui_python, running_server
from test_comfyui_qwen3tts import flac_stream_info, messages
from test_comfyui_server import memory_settings

pytestmark = requires_comfyui

CHECKPOINT = "indextts2/tiny"  # under models/mizuoto: a grouping folder, then the checkpoint
SAMPLE_RATE = 22050
SIMULATED_MB = 8  # the talker and the flow do not fit: they stream
RUN_TIMEOUT_S = 300.0
WRITER = "from mizuoto_runtime.engines.indextts.tiny import write_tiny_checkpoint; write_tiny_checkpoint(sys.argv[1])"


@pytest.fixture(scope="module")
def server() -> Iterator[ComfyServer]:
    def prepare(root: Path) -> None:
        run_with_comfyui_python(WRITER, str(root / "models" / "mizuoto" / CHECKPOINT), needs="indextts.engine")

    with running_server("mizuoto-comfyui-indextts2-", prepare) as running:
        yield running


def node(server: ComfyServer, kind: str, **given: Any) -> dict[str, Any]:
    """A node with `given` inputs and every other required input at its default."""
    info = server.get("/object_info")[kind]["input"]
    inputs = {name: spec[1].get("default") for name, spec in info.get("required", {}).items()
              if len(spec) > 1 and isinstance(spec[1], dict) and "default" in spec[1]}
    return {"class_type": kind, "inputs": {**inputs, **given}}


def test_a_step_by_step_graph_with_emotion_saves_audio(server: ComfyServer) -> None:
    prompt = {
        "80": memory_settings(SIMULATED_MB),
        "1": node(server, "MizuotoEngineLoader", engine="indextts2", checkpoint=CHECKPOINT, dtype="float32",
                  memory=["80", 0]),
        "2": node(server, "LoadAudio", audio=REFERENCE_WAV),
        "3": node(server, "MizuotoVoicePrompt", engine=["1", 0], reference=["2", 0]),
        "4": node(server, "MizuotoEmotion", engine=["1", 0], voice=["3", 0], sad=0.8),
        "5": node(server, "MizuotoTalker", engine=["1", 0], voice=["4", 0], text="hello tiny model. this is a test!",
                  seed=3, max_new_tokens=12),
        "6": node(server, "MizuotoDecoder", engine=["1", 0], codes=["5", 0]),
        "7": node(server, "SaveAudio", audio=["6", 0], filename_prefix="audio/indextts2"),
    }
    history = server.wait_history(server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", messages(history)
    saved = [server.output / item["subfolder"] / item["filename"]
             for output in history["outputs"].values() for item in output.get("audio", [])]
    assert len(saved) == 1, history["outputs"]
    rate, samples = flac_stream_info(saved[0])
    assert rate == SAMPLE_RATE and samples > 0
    talker = history["outputs"]["5"]["text"][0]
    assert "talker" in talker and "streamed" in talker, talker
    names = {m["name"] for m in server.get("/mizuoto/runtime")["models"]}
    assert {"w2v_bert", "talker", "flow", "vocoder"} <= names
