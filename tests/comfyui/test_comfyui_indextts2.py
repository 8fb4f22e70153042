"""IndexTTS-2 in a running ComfyUI server (issue 25): a tiny checkpoint (random weights, the
published layout) under the server's `models/mizuoto/`, and the example workflow "Voice Clone -
IndexTTS-2, step by step (with an emotion)" — Load TTS Engine (with Memory Settings for a small
simulated GPU) → LoadAudio → Voice Clone → Emotion (IndexTTS-2) → Text → Speech Codes → Speech
Codes → Audio → Save Audio (WAV) — that saves audio; the same graph with the Emotion node's
other inputs (a sentence read by the checkpoint's tiny emotion model; weights with a random
variant, toned down by `balance`); and the one-node Text to Speech with an emotion, weights or
read from the spoken text. The checkpoint is written by ComfyUI's Python into the server's
temporary base folder."""
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

CHECKPOINT = "IndexTTS-2"  # under models/mizuoto: the folder the template names
WORKFLOW = REPO / "example_workflows" / "Voice Clone - IndexTTS-2, step by step (with an emotion).json"
SAMPLE_RATE = 22050
SIMULATED_MB = 8  # the talker and the flow do not fit: they stream
RUN_TIMEOUT_S = 300.0
WRITER = "from mizuoto_runtime.engines.indextts2.tiny import write; write(sys.argv[1])"


@pytest.fixture(scope="module")
def server() -> Iterator[ComfyServer]:
    def prepare(root: Path) -> None:
        run_with_comfyui_python(WRITER, str(root / "models" / "mizuoto" / CHECKPOINT), needs="indextts2")

    with running_server("mizuoto-comfyui-indextts2-", prepare) as running:
        yield running


def node(server: ComfyServer, kind: str, **given: Any) -> dict[str, Any]:
    """A node with `given` inputs and every other required input at its default."""
    info = server.get("/object_info")[kind]["input"]
    inputs = {name: spec[1].get("default") for name, spec in info.get("required", {}).items()
              if len(spec) > 1 and isinstance(spec[1], dict) and "default" in spec[1]}
    return {"class_type": kind, "inputs": {**inputs, **given}}


def saved_audio(server: ComfyServer, prompt: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    history = server.wait_history(server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", messages(history)
    saved = [server.output / item["subfolder"] / item["filename"]
             for output in history["outputs"].values() for item in output.get("audio", [])]
    assert len(saved) == 1, history["outputs"]
    rate, samples = wav_stream_info(saved[0])
    assert rate == SAMPLE_RATE and samples > 0
    return history, saved[0]


def example_workflow(server: ComfyServer, **emotion: Any) -> dict[str, Any]:
    """The example workflow as an API prompt on the small simulated GPU, its Emotion node's
    inputs updated with `emotion`."""
    prompt = ui_to_api(json.loads(WORKFLOW.read_text()), server.get("/object_info"))
    prompt["80"] = memory_settings(SIMULATED_MB)
    nodes = {n["class_type"]: n["inputs"] for n in prompt.values()}
    nodes["MizuotoEngineLoader"].update(memory=["80", 0])
    nodes["LoadAudio"]["audio"] = REFERENCE_WAV
    nodes["MizuotoTalker"].update(text="hello tiny model. this is a test!", seed=3, max_new_tokens=12)
    nodes["MizuotoEmotion"].update(emotion)
    return prompt


def talker_text(prompt: dict[str, Any], history: dict[str, Any]) -> str:
    by_type = {prompt[node]["class_type"]: output for node, output in history["outputs"].items()}
    return by_type["MizuotoTalker"]["text"][0]


def test_the_example_workflow_clones_with_an_emotion_and_saves_audio(server: ComfyServer) -> None:
    prompt = example_workflow(server)
    history, _ = saved_audio(server, prompt)
    talker = talker_text(prompt, history)
    assert "talker" in talker and "streamed" in talker, talker
    names = {m["name"] for m in server.get("/mizuoto/runtime")["models"]}
    assert {"w2v_bert", "talker", "flow", "vocoder"} <= names


def test_the_emotion_node_reads_a_sentences_emotion(server: ComfyServer) -> None:
    """Every weight 0 and an emotion_text: the checkpoint's emotion model reads it when the talker
    runs (the request's seed), under its own handle, and the graph saves audio."""
    prompt = example_workflow(server, happy=0.0, emotion_text="I am so sad today", random=True)
    history, _ = saved_audio(server, prompt)
    talker = talker_text(prompt, history)
    assert "emotion_text" in talker, talker  # its line in the talker node's memory text
    names = {m["name"] for m in server.get("/mizuoto/runtime")["models"]}
    assert "emotion_text" in names


def test_the_emotion_node_takes_random_balanced_weights(server: ComfyServer) -> None:
    prompt = example_workflow(server, happy=0.6, surprised=0.9, random=True, balance=True)
    history, _ = saved_audio(server, prompt)
    assert "emotion_text" not in talker_text(prompt, history)


@pytest.mark.parametrize("emotion", [{"emotion": "sad=0.8"}, {"emotion_from_text": True}], ids=["weights", "from_text"])
def test_text_to_speech_takes_an_emotion(server: ComfyServer, emotion: dict[str, Any]) -> None:
    prompt = {
        "2": node(server, "LoadAudio", audio=REFERENCE_WAV),
        "5": node(server, "MizuotoEmotionOptions", **emotion),  # the engine's own options: through one socket
        "3": node(server, "MizuotoTTS", text="hello tiny model.", seed=3, max_new_tokens=12, reference=["2", 0],
                  engine_name="indextts2", checkpoint=CHECKPOINT, dtype="float32", options=["5", 0]),
        "4": node(server, "MizuotoSaveWav", audio=["3", 0], filename_prefix="audio/indextts2_tts"),
    }
    saved_audio(server, prompt)
