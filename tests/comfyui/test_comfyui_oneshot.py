"""F5-TTS, OmniVoice and Higgs Audio v2 in a running ComfyUI server (issues 11, 34): tiny checkpoints (random weights,
the published folder layouts) under the server's `models/mizuoto/`, and each engine's phase
graph LoadAudio → Voice Prompt (clone, with transcript) → Talker (flow / diffusion) → Decoder →
Save Audio (WAV) run to saved audio. Skips where the engine's package cannot be imported under
COMFYUI_PYTHON. The checkpoints are written by ComfyUI's own Python into the server's temporary
base folder before it starts (the loader lists its choices when ComfyUI builds the node list).
"""
from __future__ import annotations

import json
import subprocess
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
from test_comfyui_qwen3tts import messages, wav_stream_info
from test_comfyui_server import node_of

pytestmark = requires_comfyui

ENGINES = {"f5tts": ("f5_tts", "mizuoto_runtime.engines.f5tts.tiny"),
           "omnivoice": ("omnivoice", "mizuoto_runtime.engines.omnivoice.tiny"),
           "higgsaudio": ("transformers.models.higgs_audio_v2", "mizuoto_runtime.engines.higgsaudio.tiny")}
TEMPLATES = {"f5tts": "Voice Clone - F5-TTS, step by step (from a reference recording)",
             "omnivoice": "Voice Clone - OmniVoice, step by step (from a reference recording)",
             "higgsaudio": "Voice Clone - Higgs Audio v2, step by step (from a reference recording)"}
SAMPLE_RATE = 24000
RUN_TIMEOUT_S = 300.0
WRITE_TIMEOUT_S = 300
WRITER = """
import importlib, importlib.util, sys
package, module, folder = sys.argv[1:]
if importlib.util.find_spec(package) is None:
    sys.exit(3)
importlib.import_module(module).write(folder)
"""


def checkpoint(engine: str) -> str:
    return f"{engine}/tiny"  # under models/mizuoto: a grouping folder, then the checkpoint


WRITTEN: set[str] = set()  # the engines whose tiny checkpoint ComfyUI's Python wrote


def write_tiny(root: Path) -> None:
    """Each engine's tiny checkpoint that ComfyUI's Python can write (the one with its package)."""
    for engine, (package, module) in ENGINES.items():
        folder = root / "models" / "mizuoto" / checkpoint(engine)
        done = subprocess.run([COMFYUI_PYTHON, "-c", WRITER, package, module, str(folder)], cwd=REPO,
                              env=comfyui_env(), capture_output=True, text=True, timeout=WRITE_TIMEOUT_S)
        assert done.returncode in (0, 3), f"writing the tiny {engine} checkpoint failed:\n{done.stderr[-4000:]}"
        if done.returncode == 0:
            WRITTEN.add(engine)


@pytest.fixture(scope="module")
def oneshot_server() -> Iterator[ComfyServer]:
    with running_server("mizuoto-comfyui-oneshot-", write_tiny) as server:
        yield server


def clone_prompt(server: ComfyServer, engine: str, *, seed: int, prefix: str) -> dict[str, Any]:
    """The engine's example workflow (LoadAudio → Voice Prompt → Talker → Decoder → Save Audio (WAV)) on
    the tiny checkpoint: the template a user opens is what runs."""
    workflow = json.loads((REPO / "example_workflows" / f"{TEMPLATES[engine]}.json").read_text())
    prompt = ui_to_api(workflow, server.get("/object_info"))
    node_of(prompt, "MizuotoEngineLoader")["checkpoint"] = checkpoint(engine)
    node_of(prompt, "LoadAudio")["audio"] = REFERENCE_WAV
    node_of(prompt, "MizuotoTalker")["seed"] = seed
    node_of(prompt, "MizuotoSaveWav")["filename_prefix"] = prefix
    return prompt


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_clone_graph_saves_audio(oneshot_server: ComfyServer, engine: str) -> None:
    if engine not in WRITTEN:
        pytest.skip(f"{ENGINES[engine][0]} is not importable under {COMFYUI_PYTHON}")
    choices = oneshot_server.get("/object_info/MizuotoEngineLoader")["MizuotoEngineLoader"]["input"]["required"]
    assert engine in choices["engine"][1]["options"]  # the loader lists every engine
    offered = [value for value in choices["checkpoint"][1]["options"] if value.split(" (")[0] == checkpoint(engine)]
    assert offered, choices["checkpoint"][1]["options"]  # listed, with its type when the path does not say it
    prompt = clone_prompt(oneshot_server, engine, seed=1, prefix=f"audio/{engine}")
    history = oneshot_server.wait_history(oneshot_server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", messages(history)
    save = next(node for node, spec in prompt.items() if spec["class_type"] == "MizuotoSaveWav")
    files = [oneshot_server.output / item["subfolder"] / item["filename"] for item in history["outputs"][save]["audio"]]
    assert len(files) == 1
    rate, samples = wav_stream_info(files[0])
    assert rate == SAMPLE_RATE and samples > SAMPLE_RATE // 4, (rate, samples)
    for node, spec in prompt.items():  # each phase reported what it placed (M50)
        if spec["class_type"] in ("MizuotoVoicePrompt", "MizuotoTalker", "MizuotoDecoder"):
            assert history["outputs"][node]["text"][0], history["outputs"][node]
    names = {m["name"] for m in oneshot_server.get("/mizuoto/runtime")["models"] if m["engine"] == engine}
    expected = {"f5tts": {"flow", "vocoder"}, "omnivoice": {"audio_encoder", "quantizer", "llm", "audio_decoder"},
                "higgsaudio": {"audio_encoder", "quantizer", "talker", "audio_decoder"}}
    assert names == expected[engine]
