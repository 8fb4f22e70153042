"""Dia and CSM in a running ComfyUI server (issue 34): tiny checkpoints (random weights, the
published folder layouts) under the server's `models/mizuoto/`, and each engine's dialogue
template (two characters, each with a recording and its transcript, one Script to Speech pass)
run to saved audio. Skips where transformers cannot be imported under COMFYUI_PYTHON. The
checkpoints are written by ComfyUI's own Python into the server's temporary base folder before
it starts (the loader lists its choices when ComfyUI builds the node list)."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comfyui_harness import (
    COMFYUI_PYTHON,
    REFERENCE_WAV,
    REPO,
    ComfyServer,
    requires_comfyui,
    running_server,
    ui_to_api,
)
from test_comfyui_oneshot import WRITER
from test_comfyui_qwen3tts import messages, wav_stream_info

pytestmark = requires_comfyui

ENGINES = {"dia": ("transformers", "mizuoto_runtime.engines.dia.tiny", 44100),
           "csm": ("transformers", "mizuoto_runtime.engines.csm.tiny", 24000)}
TEMPLATES = {"dia": "Dialogue - Dia, two speakers in one pass (script)",
             "csm": "Dialogue - CSM, a conversation of two speakers (script)"}
COMPONENTS = {"dia": {"dac_encoder", "quantizer", "talker", "dac_decoder"},
              "csm": {"mimi_encoder", "quantizer", "talker", "mimi_decoder"}}
RUN_TIMEOUT_S = 300.0
WRITTEN: set[str] = set()


def write_tiny(root: Path) -> None:
    import subprocess

    from comfyui_harness import comfyui_env

    for engine, (package, module, _) in ENGINES.items():
        folder = root / "models" / "mizuoto" / engine / "tiny"
        done = subprocess.run([COMFYUI_PYTHON, "-c", WRITER, package, module, str(folder)], cwd=REPO,
                              env=comfyui_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode in (0, 3), f"writing the tiny {engine} checkpoint failed:\n{done.stderr[-4000:]}"
        if done.returncode == 0:
            WRITTEN.add(engine)


@pytest.fixture(scope="module")
def server() -> Iterator[ComfyServer]:
    with running_server("mizuoto-comfyui-dialogue-", write_tiny) as running:
        yield running


def prompt_of(server: ComfyServer, engine: str) -> dict[str, Any]:
    """The engine's template as a user opens it, on the tiny checkpoint with the reference tone."""
    workflow = json.loads((REPO / "example_workflows" / f"{TEMPLATES[engine]}.json").read_text())
    prompt = ui_to_api(workflow, server.get("/object_info"))
    for spec in prompt.values():
        inputs = spec["inputs"]
        if spec["class_type"] == "MizuotoEngineLoader":
            inputs.update(checkpoint=f"{engine}/tiny", dtype="float32")
        if spec["class_type"] == "LoadAudio":
            inputs["audio"] = REFERENCE_WAV
        if spec["class_type"] == "MizuotoScriptToSpeech":
            inputs.update(max_new_tokens=12, seed=1)
        if spec["class_type"] == "MizuotoSaveWav":
            inputs["filename_prefix"] = f"audio/{engine}"
    return prompt


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_dialogue_template_saves_audio(server: ComfyServer, engine: str) -> None:
    if engine not in WRITTEN:
        pytest.skip(f"{ENGINES[engine][0]} is not importable under {COMFYUI_PYTHON}")
    prompt = prompt_of(server, engine)
    history = server.wait_history(server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", messages(history)
    save = next(node for node, spec in prompt.items() if spec["class_type"] == "MizuotoSaveWav")
    files = [server.output / item["subfolder"] / item["filename"] for item in history["outputs"][save]["audio"]]
    assert len(files) == 1
    rate, samples = wav_stream_info(files[0])
    assert rate == ENGINES[engine][2] and samples > 0, (rate, samples)
    names = {m["name"] for m in server.get("/mizuoto/runtime")["models"] if m["engine"] == engine}
    assert names == COMPONENTS[engine]
