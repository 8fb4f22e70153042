"""Fish Speech in a running ComfyUI server (issue 24): a tiny S2-Pro checkpoint (random weights,
the official file layout) under the server's `models/mizuoto/fishspeech/`, and the example
workflow "Voice Clone - Fish Speech, step by step" — LoadAudio → Voice Prompt (reference +
transcript) → Talker → Codec Decoder → Save Audio (WAV) — run on a simulated GPU with every
unit streamed (Memory Settings added to its loader), to a saved WAV file.

Fish Speech is our own model code: no upstream package to import, nothing to skip for. The
checkpoint is written into the server's temporary base folder before the server starts (the
loader lists its choices when ComfyUI builds the node list), never into the ComfyUI tree.
"""
from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch
from comfyui_harness import REFERENCE_WAV, REPO, ComfyServer, requires_comfyui, running_server, ui_to_api
from test_comfyui_qwen3tts import messages, wav_stream_info
from test_comfyui_server import memory_settings

from mizuoto_runtime.engines.fishspeech.tiny import write

pytestmark = requires_comfyui

CHECKPOINT = "fishspeech/s2-pro"  # under models/mizuoto: a grouping folder, then the checkpoint
WORKFLOW = REPO / "example_workflows" / "Voice Clone - Fish Speech, step by step (from a reference recording).json"
SAMPLE_RATE = 44100
SAMPLES_PER_FRAME = 2048
FRAMES = 6  # max_new_tokens: at most FRAMES - 1 frames of codes (the last frame is dropped, as upstream)
SIMULATED_MB = 64
RUN_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def fish_server() -> Iterator[ComfyServer]:
    with running_server("mizuoto-comfyui-fishspeech-",
                        lambda root: write(root / "models" / "mizuoto" / CHECKPOINT, dtype=torch.bfloat16)) as server:
        yield server


def test_example_workflow_clones_a_voice_and_saves_audio(fish_server: ComfyServer) -> None:
    prompt = ui_to_api(json.loads(WORKFLOW.read_text()), fish_server.get("/object_info"))
    prompt["80"] = memory_settings(SIMULATED_MB)
    prompt["80"]["inputs"]["vram_mode"] = "none"  # every unit streams
    nodes = {n["class_type"]: n["inputs"] for n in prompt.values()}
    nodes["MizuotoEngineLoader"].update(checkpoint=CHECKPOINT, dtype="float32", memory=["80", 0])
    nodes["LoadAudio"]["audio"] = REFERENCE_WAV  # the harness's 16 kHz reference: resampled to 44.1 kHz
    nodes["MizuotoTalker"].update(text="Hello from the tiny model.", seed=1, max_new_tokens=FRAMES)
    nodes["MizuotoSaveWav"]["filename_prefix"] = "audio/fishspeech_clone"
    history = fish_server.wait_history(fish_server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", messages(history)
    saved = [fish_server.output / item["subfolder"] / item["filename"]
             for output in history["outputs"].values() for item in output.get("audio", [])]
    assert len(saved) == 1, history["outputs"]
    rate, samples = wav_stream_info(saved[0])
    assert rate == SAMPLE_RATE and samples % SAMPLES_PER_FRAME == 0 and 0 < samples < FRAMES * SAMPLES_PER_FRAME
    by_type = {prompt[node]["class_type"]: output for node, output in history["outputs"].items()}
    talker = by_type["MizuotoTalker"]["text"][0]
    assert "talker" in talker and "streamed" in talker, talker
    names = {m["name"] for m in fish_server.get("/mizuoto/runtime")["models"]}
    assert names == {"codec_encoder", "talker", "codec_decoder"}
