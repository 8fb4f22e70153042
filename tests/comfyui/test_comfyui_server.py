"""The pack in a running ComfyUI server (M35, M44, M50, M51): its nodes in `/object_info`, its
templates and web extension served, the example workflows run to a saved audio file,
`/interrupt` stops generation mid-way, `/free` unloads our components (VRAM, and RAM with
free_memory). The server runs `--cpu`; the workflows set `simulate_vram_mb` so our components
are really placed (M55) and `GET /mizuoto/runtime` shows loaded bytes."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from comfyui_harness import (
    COMFYUI_PYTHON, REFERENCE_WAV, REPO, ComfyServer, comfy_server, comfyui_env, requires_comfyui, ui_to_api,
)

pytestmark = requires_comfyui
__all__ = ["comfy_server"]  # the fixture, imported for pytest

NODES = ("MizuotoMemorySettings", "MizuotoEngineLoader", "MizuotoVoicePrompt", "MizuotoTalker",
         "MizuotoDecoder", "MizuotoTTS", "MizuotoSaveWav")
WORKFLOWS = REPO / "example_workflows"
SIMULATED_MB = 16
RUN_TIMEOUT_S = 300.0  # a prompt took 95 s on a loaded 2-core machine
LONG_TEXT = "a long sentence to keep the talker busy " * 12  # ~2000 codes: many seconds uninterrupted


def template(server: ComfyServer, name: str) -> dict[str, Any]:
    workflow = json.loads((WORKFLOWS / f"{name}.json").read_text())
    return ui_to_api(workflow, server.get("/object_info"))


def node_of(prompt: dict[str, Any], class_type: str) -> dict[str, Any]:
    return next(n["inputs"] for n in prompt.values() if n["class_type"] == class_type)


def phases_prompt(server: ComfyServer, *, text: str, seed: int, prefix: str, max_new_tokens: int = 2048) -> dict[str, Any]:
    prompt = template(server, "mizuoto_demo_phases")
    node_of(prompt, "MizuotoMemorySettings")["simulate_vram_mb"] = SIMULATED_MB
    node_of(prompt, "MizuotoEngineLoader")["checkpoint"] = "demo-small"
    node_of(prompt, "MizuotoTalker").update(text=text, seed=seed, max_new_tokens=max_new_tokens)
    node_of(prompt, "SaveAudio")["filename_prefix"] = prefix
    return prompt


def saved_files(server: ComfyServer, history: dict[str, Any]) -> list[Path]:
    files = [server.output / item["subfolder"] / item["filename"]
             for output in history["outputs"].values() for item in output.get("audio", [])]
    assert files, history["outputs"]
    return files


def loaded(state: dict[str, Any]) -> int:
    return sum(m["loaded_bytes"] for m in state["models"])


def test_nodes_appear_in_object_info_with_their_inputs(comfy_server: ComfyServer) -> None:
    info = {name: comfy_server.get(f"/object_info/{name}")[name] for name in NODES}
    assert all(i["python_module"] == "custom_nodes.mizuoto" for i in info.values())
    loader = info["MizuotoEngineLoader"]["input"]
    assert "demo" in loader["required"]["engine"][1]["options"]
    assert "demo-small" in loader["required"]["checkpoint"][1]["options"]  # models/mizuoto/<folder>
    assert loader["optional"]["memory"][0] == "MIZUOTO_MEMORY"
    device = loader["optional"]["device"][1]
    assert device["default"] == "auto" and device["options"][0] == "auto" and "cpu" in device["options"]
    fallback = info["MizuotoDecoder"]["input"]["required"]["allow_fallback"]
    assert fallback[0] == "BOOLEAN" and "oom_fallback decides" in fallback[1]["tooltip"]  # M44
    assert info["MizuotoDecoder"]["output"] == ["AUDIO", "STRING"]
    talker = info["MizuotoTalker"]["input"]
    assert {"engine", "text", "seed", "max_new_tokens"} <= set(talker["required"])
    assert talker["optional"]["voice"][0] == "MIZUOTO_VOICE"
    assert info["MizuotoVoicePrompt"]["input"]["optional"]["reference"][0] == "AUDIO"
    assert "simulate_vram_mb" in info["MizuotoMemorySettings"]["input"]["required"]
    # The Engine API's instruct and language: optional, empty by default, and after every widget
    # the example workflows saved, so those keep their values (and run, below).
    optional = {name: info[name]["input_order"].get("optional", []) for name in NODES}
    assert optional["MizuotoVoicePrompt"][-1] == "instruct" and optional["MizuotoTalker"][-1] == "language"
    assert optional["MizuotoTTS"][-2:] == ["instruct", "language"]
    assert info["MizuotoVoicePrompt"]["input"]["optional"]["instruct"][1]["multiline"] is True
    assert info["MizuotoTalker"]["input"]["optional"]["language"][1]["default"] == ""


def test_templates_and_web_extension_are_served(comfy_server: ComfyServer) -> None:
    served = sorted(comfy_server.get("/workflow_templates")["mizuoto"])
    assert served == sorted(p.stem for p in WORKFLOWS.glob("*.json")) and "mizuoto_demo_tts" in served
    assert comfy_server.get("/api/workflow_templates/mizuoto/mizuoto_demo_tts.json")["nodes"]
    assert "/extensions/mizuoto/mizuoto.js" in comfy_server.get("/extensions")
    with urllib.request.urlopen(comfy_server.url + "/extensions/mizuoto/mizuoto.js", timeout=10) as response:
        assert b"registerExtension" in response.read()


def test_phase_workflow_saves_audio_and_reports_memory(comfy_server: ComfyServer) -> None:
    prompt = phases_prompt(comfy_server, text="Hello from the phases.", seed=1, prefix="audio/phases")
    prompt["90"] = {"class_type": "LoadAudio", "inputs": {"audio": REFERENCE_WAV}}  # core AUDIO in
    node_of(prompt, "MizuotoVoicePrompt")["reference"] = ["90", 0]
    history = comfy_server.wait_history(comfy_server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", history["status"]
    for path in saved_files(comfy_server, history):
        assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"fLaC"
    ids = {n["class_type"]: k for k, n in history["prompt"][2].items()}
    for node in ("MizuotoVoicePrompt", "MizuotoTalker", "MizuotoDecoder"):  # each placed its phase (M1, M50)
        assert history["outputs"][ids[node]]["text"][0].startswith("loaded "), history["outputs"][ids[node]]
    state = comfy_server.get("/mizuoto/runtime")  # M51
    assert state["device"]["simulated"] and state["device"]["total_mb"] == SIMULATED_MB
    assert loaded(state) > 0 and {m["name"] for m in state["models"]} == {"speaker_encoder", "talker", "decoder"}
    assert all({"loaded_bytes", "streamed_bytes", "host_bytes"} <= set(m) for m in state["models"])
    assert comfy_server.get("/api/mizuoto/runtime")["device"] == comfy_server.get("/mizuoto/runtime")["device"]


def test_mizuoto_runtime_url_shows_the_running_servers_models(comfy_server: ComfyServer) -> None:
    """`mizuoto runtime --url`: the models of the running ComfyUI, read from the pack's route
    (issue 9 item 4), not an always-empty fresh process's."""
    prompt = phases_prompt(comfy_server, text="Show me.", seed=6, prefix="audio/shown")
    assert comfy_server.wait_history(comfy_server.queue(prompt), RUN_TIMEOUT_S)["status"]["status_str"] == "success"
    done = subprocess.run([COMFYUI_PYTHON, "-m", "mizuoto_runtime", "runtime", "--url", comfy_server.url], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=comfyui_env())
    assert done.returncode == 0, done.stderr[-3000:]
    shown = json.loads(done.stdout)
    assert shown["url"] == comfy_server.url and shown["device"]["simulated"]
    assert {m["name"] for m in shown["models"]} == {m["name"] for m in comfy_server.get("/mizuoto/runtime")["models"]}
    assert shown["models"]


def test_all_in_one_template_runs(comfy_server: ComfyServer) -> None:
    prompt = template(comfy_server, "mizuoto_demo_tts")
    node_of(prompt, "SaveAudio")["filename_prefix"] = "audio/all_in_one"
    history = comfy_server.wait_history(comfy_server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", history["status"]
    assert all(p.stat().st_size > 1000 for p in saved_files(comfy_server, history))


def test_unload_models_frees_our_components(comfy_server: ComfyServer) -> None:
    prompt_id = comfy_server.queue(phases_prompt(comfy_server, text="Unload me.", seed=2, prefix="audio/unload"))
    assert comfy_server.wait_history(prompt_id, RUN_TIMEOUT_S)["status"]["status_str"] == "success"
    assert loaded(comfy_server.get("/mizuoto/runtime")) > 0
    comfy_server.post("/free", {"unload_models": True})
    state = comfy_server.wait_runtime(lambda s: s["models"] and loaded(s) == 0)
    assert state["device"]["free_mb"] == state["device"]["total_mb"]
    assert all(m["host_bytes"] == m["size_bytes"] for m in state["models"])  # still in RAM, ready to place


def test_free_memory_unloads_engines_from_ram(comfy_server: ComfyServer) -> None:
    prompt_id = comfy_server.queue(phases_prompt(comfy_server, text="Free me.", seed=3, prefix="audio/free"))
    assert comfy_server.wait_history(prompt_id, RUN_TIMEOUT_S)["status"]["status_str"] == "success"
    comfy_server.post("/free", {"unload_models": True, "free_memory": True})
    comfy_server.wait_runtime(lambda s: s["models"] == [])


def test_interrupt_ends_generation_midway(comfy_server: ComfyServer) -> None:
    comfy_server.post("/free", {"unload_models": True})
    comfy_server.wait_runtime(lambda s: loaded(s) == 0)
    prompt = phases_prompt(comfy_server, text=LONG_TEXT, seed=4, prefix="audio/interrupted", max_new_tokens=4096)
    prompt_id = comfy_server.queue(prompt)
    # The talker phase has begun once its component is placed (nothing was placed before).
    comfy_server.wait_runtime(lambda s: any(m["name"] == "talker" and m["loaded_bytes"] for m in s["models"]),
                              timeout_s=RUN_TIMEOUT_S)
    time.sleep(1.0)
    interrupted_at = time.monotonic()
    comfy_server.post("/interrupt", {})
    history = comfy_server.wait_history(prompt_id, 30.0)
    ended_after = time.monotonic() - interrupted_at
    messages = dict(history["status"]["messages"])
    assert history["status"]["status_str"] == "error" and "execution_interrupted" in messages, messages
    assert messages["execution_interrupted"]["node_type"] == "MizuotoTalker"
    assert ended_after < 5.0, f"generation took {ended_after:.1f} s to stop"
    assert not any(o.get("audio") for o in history["outputs"].values())
    # The interrupted request released its components: the next prompt runs.
    after = comfy_server.queue(phases_prompt(comfy_server, text="After.", seed=5, prefix="audio/after"))
    assert comfy_server.wait_history(after, RUN_TIMEOUT_S)["status"]["status_str"] == "success"
