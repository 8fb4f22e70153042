"""Chatterbox in a running ComfyUI server (issue 34): a tiny checkpoint with both models (random
weights, the published folder layout) under the server's `models/mizuoto/chatterbox/`, and the
Chatterbox template (Load Audio → one Text to Speech node → Save Audio (WAV)) run to saved audio,
with the English model and with the multilingual one (its T3 file, the loader's second choice).
Skips where the engine's packages cannot be imported under COMFYUI_PYTHON
(requirements/chatterbox.txt)."""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from comfyui_harness import COMFYUI_PYTHON, REPO, ComfyServer, comfyui_env, requires_comfyui, running_server, ui_to_api
from test_comfyui_qwen3tts import messages, wav_stream_info
from test_comfyui_server import node_of

pytestmark = requires_comfyui

TEMPLATE = "Voice Clone - Chatterbox (from a reference recording)"
RUN_TIMEOUT_S = 300.0
NOT_IMPORTABLE = 3
WRITER = """
import sys
try:
    from mizuoto_runtime.engines.chatterbox.tiny import write
    write(sys.argv[1], version="multilingual")
except ImportError as exc:
    print(exc, file=sys.stderr)
    sys.exit(3)
"""
WRITTEN: list[bool] = []


def write_tiny(root: Path) -> None:
    folder = root / "models" / "mizuoto" / "chatterbox"
    done = subprocess.run([COMFYUI_PYTHON, "-c", WRITER, str(folder)], cwd=REPO, env=comfyui_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, NOT_IMPORTABLE), (f"writing the tiny Chatterbox checkpoint failed:\n"
                                                    f"{done.stderr[-4000:]}")
    WRITTEN.append(done.returncode == 0)


@pytest.fixture(scope="module")
def chatterbox_server() -> Iterator[ComfyServer]:
    with running_server("mizuoto-comfyui-chatterbox-", write_tiny) as server:
        yield server


@pytest.mark.parametrize(("choice", "label", "language"), [
    ("chatterbox", "Chatterbox", "auto"),
    ("chatterbox/t3_mtl23ls_v2.safetensors", "Chatterbox Multilingual", "fr")])
def test_template_saves_audio(chatterbox_server: ComfyServer, choice: str, label: str, language: str) -> None:
    if not WRITTEN or not WRITTEN[0]:
        pytest.skip(f"requirements/chatterbox.txt is not installed under {COMFYUI_PYTHON}")
    object_info = chatterbox_server.get("/object_info")
    options = object_info["MizuotoTTS"]["input"]["optional"]["checkpoint"][1]["options"]
    offered = [v for v in options if v.split(" (")[0] == choice]
    assert offered and (label in offered[0] or offered[0] == choice), options
    workflow = json.loads((REPO / "example_workflows" / f"{TEMPLATE}.json").read_text())
    prompt = ui_to_api(workflow, object_info)
    tts = node_of(prompt, "MizuotoTTS")
    tts.update(checkpoint=offered[0], max_new_tokens=16, seed=1, language=language)
    node_of(prompt, "MizuotoSaveWav")["filename_prefix"] = f"audio/chatterbox_{language}"
    history = chatterbox_server.wait_history(chatterbox_server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", messages(history)
    save = next(node for node, spec in prompt.items() if spec["class_type"] == "MizuotoSaveWav")
    files = [chatterbox_server.output / i["subfolder"] / i["filename"] for i in history["outputs"][save]["audio"]]
    rate, samples = wav_stream_info(files[0])
    assert rate == 24000 and samples > 0
    used = {c["name"] for c in chatterbox_server.get("/mizuoto/runtime")["requests"][-1]["components"]}
    assert used == {f"chatterbox:{n}" for n in ("s3_tokenizer", "speaker_encoder", "voice_encoder", "talker",
                                                 "flow", "vocoder")}, used
