"""CosyVoice 2 and 3 in a running ComfyUI server (issue 22): tiny checkpoints (random weights,
the published folder layout, a saved voice ``tiny`` in spk2info.pt) under the server's
`models/mizuoto/cosyvoice/`, and the CosyVoice template (one Text to Speech node → Save Audio (WAV))
run to saved audio for each version: the saved speaker places only the talker, flow and vocoder
(no voice prompt). Skips where the engine cannot be imported under
COMFYUI_PYTHON (it needs transformers)."""
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

TEMPLATE = "Text to Speech - CosyVoice 2 (saved voices)"
RUN_TIMEOUT_S = 300.0
WRITER = """
import importlib.util, sys
if importlib.util.find_spec("transformers") is None:
    sys.exit(3)
from mizuoto_runtime.engines.cosyvoice.tiny import write
write(sys.argv[2], version=sys.argv[1])
"""
WRITTEN: set[int] = set()


def write_tiny(root: Path) -> None:
    for version in (2, 3):
        folder = root / "models" / "mizuoto" / "cosyvoice" / f"tiny{version}"
        done = subprocess.run([COMFYUI_PYTHON, "-c", WRITER, str(version), str(folder)], cwd=REPO, env=comfyui_env(),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode in (0, 3), (f"writing the tiny CosyVoice {version} checkpoint failed:\n"
                                           f"{done.stderr[-4000:]}")
        if done.returncode == 0:
            WRITTEN.add(version)


@pytest.fixture(scope="module")
def cosyvoice_server() -> Iterator[ComfyServer]:
    with running_server("mizuoto-comfyui-cosyvoice-", write_tiny) as server:
        yield server


@pytest.mark.parametrize("version", [2, 3])
def test_template_saves_audio(cosyvoice_server: ComfyServer, version: int) -> None:
    if version not in WRITTEN:
        pytest.skip(f"transformers is not importable under {COMFYUI_PYTHON}")
    object_info = cosyvoice_server.get("/object_info")
    options = object_info["MizuotoTTS"]["input"]["optional"]["checkpoint"][1]["options"]
    offered = [v for v in options if v.startswith(f"cosyvoice/tiny{version}")]
    assert offered and f"CosyVoice{version}" in offered[0], options  # listed with its type
    workflow = json.loads((REPO / "example_workflows" / f"{TEMPLATE}.json").read_text())
    prompt = ui_to_api(workflow, object_info)
    tts = node_of(prompt, "MizuotoTTS")
    tts.update(checkpoint=offered[0], speaker="tiny", max_new_tokens=16, seed=1)
    node_of(prompt, "MizuotoSaveWav")["filename_prefix"] = f"audio/cosyvoice{version}"
    history = cosyvoice_server.wait_history(cosyvoice_server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", messages(history)
    save = next(node for node, spec in prompt.items() if spec["class_type"] == "MizuotoSaveWav")
    files = [cosyvoice_server.output / i["subfolder"] / i["filename"] for i in history["outputs"][save]["audio"]]
    rate, samples = wav_stream_info(files[0])
    assert rate == 24000 and samples > 0
    runtime = cosyvoice_server.get("/mizuoto/runtime")
    loaded = {m["name"] for m in runtime["models"] if m["engine"] == "cosyvoice"}
    # CAM++ and the speech tokenizer load where the folder has their ONNX files (the writer adds
    # them where onnx is installed), but a saved spk2info speaker needs no voice-prompt phase:
    # the request uses the talker, flow and vocoder only.
    voice = {"campplus", "speech_tokenizer"} & loaded
    assert loaded - voice == {"llm", "flow", "vocoder"}, loaded
    used = {c["name"] for c in runtime["requests"][-1]["components"]}
    assert used == {"cosyvoice:llm", "cosyvoice:flow", "cosyvoice:vocoder"}, used
