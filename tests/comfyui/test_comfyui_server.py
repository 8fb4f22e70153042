"""The pack in a running ComfyUI server (M35, M44, M50, M51): its nodes in `/object_info` under
the names users know, its templates (with thumbnails) and web extension served, the example
workflows and a one-node Text to Speech graph run to a saved audio file, long text in chunks,
`/interrupt` stops generation mid-way, `/free` unloads our components (VRAM, and RAM with
free_memory), and two copies of the pack in custom_nodes still start the server. The server
runs `--cpu`; the step-by-step graph sets `simulate_vram_mb` so our components are really
placed (M55) and `GET /mizuoto/runtime` shows loaded bytes."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from comfyui_harness import (
    COMFYUI_PYTHON,
    FRONTEND_ONLY,
    REFERENCE_WAV,
    REPO,
    ComfyServer,
    comfy_server,
    comfyui_env,
    requires_comfyui,
    running_server,
    ui_to_api,
)

pytestmark = requires_comfyui
__all__ = ["comfy_server"]  # the fixture, imported for pytest

NODES = ("MizuotoMemorySettings", "MizuotoEngineLoader", "MizuotoVoicePrompt", "MizuotoTalker",
         "MizuotoDecoder", "MizuotoTTS", "MizuotoSaveWav")
WORKFLOWS = REPO / "example_workflows"
TEMPLATES = sorted(p.stem for p in WORKFLOWS.glob("*.json"))
DEMO_TTS = "Text to Speech - demo engine (no download)"
STEPS = "Step by step - demo engine (voice, speech codes, audio)"
DISPLAY_NAMES = {
    "MizuotoTTS": "Text to Speech", "MizuotoEngineLoader": "Load TTS Engine",
    "MizuotoVoicePrompt": "Voice Clone / Voice Design", "MizuotoTalker": "Text → Speech Codes",
    "MizuotoDecoder": "Speech Codes → Audio", "MizuotoSaveWav": "Save Audio (WAV)",
    "MizuotoMemorySettings": "TTS Memory Settings (VRAM)",
}
REQUIREMENT_ID = re.compile(r"\bM\d{1,2}\b")
SIMULATED_MB = 16
RUN_TIMEOUT_S = 300.0  # a prompt took 95 s on a loaded 2-core machine
LONG_TEXT = "a long sentence to keep the talker busy " * 12  # ~2000 codes: many seconds uninterrupted


def template(server: ComfyServer, name: str) -> dict[str, Any]:
    workflow = json.loads((WORKFLOWS / f"{name}.json").read_text())
    return ui_to_api(workflow, server.get("/object_info"))


def node_of(prompt: dict[str, Any], class_type: str) -> dict[str, Any]:
    return next(n["inputs"] for n in prompt.values() if n["class_type"] == class_type)


def memory_settings(simulate_vram_mb: int) -> dict[str, Any]:
    """A Memory Settings node at its defaults, the CPU acting as a GPU of `simulate_vram_mb` MB."""
    return {"class_type": "MizuotoMemorySettings", "inputs": {
        "vram_mode": "normal", "vram_reserve_mb": -1, "vram_limit_mb": 0, "async_offload": 1, "host_copies": "auto",
        "oom_retry": True, "oom_fallback": False, "simulate_vram_mb": simulate_vram_mb}}


def phases_prompt(server: ComfyServer, *, text: str, seed: int, prefix: str,
                  max_new_tokens: int = 2048) -> dict[str, Any]:
    """The step-by-step template on the demo checkpoint folder, with Memory Settings for a
    simulated small GPU connected to its loader."""
    prompt = template(server, STEPS)
    prompt["80"] = memory_settings(SIMULATED_MB)
    node_of(prompt, "MizuotoEngineLoader").update(checkpoint="demo-small", memory=["80", 0])
    node_of(prompt, "MizuotoTalker").update(text=text, seed=seed, max_new_tokens=max_new_tokens)
    node_of(prompt, "MizuotoSaveWav")["filename_prefix"] = prefix
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
    assert {name: i["display_name"] for name, i in info.items()} == DISPLAY_NAMES
    assert info["MizuotoTTS"]["category"] == "audio/Mizuoto TTS"
    assert info["MizuotoTalker"]["category"] == "audio/Mizuoto TTS/step by step"
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
    # Speaker and language are dropdowns; "none" and "auto" where no checkpoint has any.
    assert info["MizuotoVoicePrompt"]["input"]["optional"]["speaker"][1]["options"][0] == "none"
    assert info["MizuotoTalker"]["input"]["optional"]["language"][1]["default"] == "auto"


def test_widgets_saved_workflows_hold_keep_their_places(comfy_server: ComfyServer) -> None:
    """Saved workflows store widget values by position: inputs added later come after every
    widget an older workflow saved (instruct and language first, then the one-node and
    long-text inputs of Text to Speech, then its options socket; its emotion widgets, last in
    the previous release, are gone, so their saved values fall past every widget)."""
    order = {name: comfy_server.get(f"/object_info/{name}")[name]["input_order"] for name in NODES}
    assert order["MizuotoVoicePrompt"]["optional"] == ["reference", "transcript", "speaker", "instruct"]
    assert order["MizuotoTalker"]["optional"][-1] == "language"
    assert order["MizuotoTTS"]["required"] == ["text", "seed", "temperature", "top_k", "top_p", "repetition_penalty",
                                               "max_new_tokens", "do_sample", "allow_fallback"]
    assert order["MizuotoTTS"]["optional"] == ["engine", "reference", "transcript", "speaker", "instruct", "language",
                                               "engine_name", "checkpoint", "dtype", "split_long_text", "chunk_chars",
                                               "options"]
    assert comfy_server.get("/object_info/MizuotoTTS")["MizuotoTTS"]["output"] == ["AUDIO", "STRING", "MIZUOTO_ENGINE"]


def test_what_users_read_names_no_requirement_ids(comfy_server: ComfyServer) -> None:
    """Every node of the pack, the training nodes included: names, descriptions, tooltips."""
    info = {name: i for name, i in comfy_server.get("/object_info").items()
            if i["python_module"] == "custom_nodes.mizuoto"}
    assert set(NODES) | {"MizuotoTrainQwen3TTSLoRA", "MizuotoQwen3TTSLoRA"} <= set(info)
    assert info["MizuotoTrainQwen3TTSLoRA"]["display_name"] == "Train Voice LoRA (Qwen3-TTS)"
    assert info["MizuotoQwen3TTSLoRA"]["display_name"] == "Apply Voice LoRA (Qwen3-TTS)"
    text = json.dumps({name: [i["display_name"], i["description"], i["input"], i["output_tooltips"]]
                       for name, i in info.items()}, ensure_ascii=False)
    assert not REQUIREMENT_ID.findall(text), REQUIREMENT_ID.findall(text)


#: Dropdowns whose options come from the user's model folders: a template names a published
#: checkpoint (and its speakers and languages) that a test server does not have.
FROM_THE_USERS_MODELS = {"checkpoint", "speaker", "language"}
CONTROL_AFTER_GENERATE = {"fixed", "increment", "decrement", "randomize"}


def widget_problems(node: dict[str, Any], info: dict[str, Any]) -> list[str]:
    """How a saved node's `widgets_values` and sockets disagree with the node as this ComfyUI
    defines it: one value per widget, in `input_order`, each one that widget takes; links only
    to inputs the node has, every required socket linked."""
    sockets = {i["name"]: i.get("link") for i in node["inputs"] if "widget" not in i}
    values = list(node.get("widgets_values", []))
    problems = []
    for section in ("required", "optional"):
        for name in info["input_order"].get(section, []):
            spec = info["input"][section][name]
            options = spec[1] if len(spec) > 1 else {}
            kind = "COMBO" if isinstance(spec[0], list) else spec[0]
            if kind not in ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"):  # a socket
                if section == "required" and sockets.get(name) is None:
                    problems.append(f"required input {name} is not linked")
                continue
            if not values:
                problems.append(f"no value for widget {name}")
                continue
            problems += value_problems(name, kind, options, spec[0], values.pop(0))
            if options.get("control_after_generate"):
                if not values or values.pop(0) not in CONTROL_AFTER_GENERATE:
                    problems.append(f"{name}: no control_after_generate value after it")
    problems += [f"{len(values)} values left over: {values}"] if values else []
    declared = {n for section in ("required", "optional") for n in info["input_order"].get(section, [])}
    problems += [f"socket {name} is no input of the node" for name in sockets if name not in declared]
    return problems


def value_problems(name: str, kind: str, options: dict[str, Any], choices: Any, value: Any) -> list[str]:
    if kind == "COMBO":
        listed = choices if isinstance(choices, list) else options.get("options", [])
        if not isinstance(value, str) or not value or (name not in FROM_THE_USERS_MODELS and value not in listed):
            return [f"{name}: {value!r} is not one of the options"]
        return []
    takes = {"INT": (int,), "FLOAT": (int, float), "STRING": (str,), "BOOLEAN": (bool,)}[kind]
    if not isinstance(value, takes) or (kind != "BOOLEAN" and isinstance(value, bool)):
        return [f"{name}: {value!r} is not a {kind}"]
    low, high = options.get("min"), options.get("max")
    if kind in ("INT", "FLOAT") and ((low is not None and value < low) or (high is not None and value > high)):
        return [f"{name}: {value!r} is outside [{low}, {high}]"]
    return []


def test_every_template_fits_the_nodes_inputs(comfy_server: ComfyServer) -> None:
    """The frontend fills widgets from `widgets_values` by position: a template saved for an
    older node layout would put values into the wrong widgets."""
    object_info = comfy_server.get("/object_info")
    for name in TEMPLATES:
        workflow = json.loads((WORKFLOWS / f"{name}.json").read_text())
        for node in workflow["nodes"]:
            if node["type"] in FRONTEND_ONLY:
                continue
            assert node["type"] in object_info, (name, node["type"])
            assert not widget_problems(node, object_info[node["type"]]), (
                name, node["type"], widget_problems(node, object_info[node["type"]]))


def deprecated_nodes(object_info: dict[str, Any]) -> dict[str, list[str]]:
    """Template name -> the nodes in it that this ComfyUI's `object_info` marks `deprecated`
    (a user opening the template sees "(DEPRECATED)" on them)."""
    found: dict[str, list[str]] = {}
    for name in TEMPLATES:
        workflow = json.loads((WORKFLOWS / f"{name}.json").read_text())
        marked = sorted({node["type"] for node in workflow["nodes"]
                         if object_info.get(node["type"], {}).get("deprecated")})
        if marked:
            found[name] = marked
    return found


def test_no_template_uses_a_node_this_comfyui_marks_deprecated(comfy_server: ComfyServer) -> None:
    """Every lab (issue 23): v0.33.0 marks SaveAudio (FLAC), SaveAudioMP3 and SaveAudioOpus deprecated."""
    assert deprecated_nodes(comfy_server.get("/object_info")) == {}


def test_the_deprecated_node_check_can_fail(comfy_server: ComfyServer) -> None:
    """The check reads the `deprecated` flag: marking each node of one template finds them."""
    object_info = comfy_server.get("/object_info")
    nodes = json.loads((WORKFLOWS / f"{DEMO_TTS}.json").read_text())["nodes"]
    types = sorted({node["type"] for node in nodes} - FRONTEND_ONLY)
    for node_type in types:
        object_info[node_type] = {**object_info[node_type], "deprecated": True}
    assert deprecated_nodes(object_info)[DEMO_TTS] == types


def test_the_template_check_can_fail(comfy_server: ComfyServer) -> None:
    """An old layout (the loader before its device and weights widgets, a free-text speaker) is caught."""
    info = comfy_server.get("/object_info")
    loader = {"inputs": [], "widgets_values": ["f5tts", "F5TTS_v1_Base", "float32"]}
    assert widget_problems(loader, info["MizuotoEngineLoader"]) == ["no value for widget device",
                                                                    "no value for widget weights"]
    voice = {"inputs": [{"name": "engine", "link": 1}], "widgets_values": ["transcript", "", ""]}
    assert widget_problems(voice, info["MizuotoVoicePrompt"]) == ["speaker: '' is not one of the options"]
    talker = {"inputs": [{"name": "engine", "link": 1}],
              "widgets_values": ["text", 0, "fixed", 0.9, 50, 1.0, 1.05, 2048, "yes", "auto", 3]}
    assert widget_problems(talker, info["MizuotoTalker"]) == ["do_sample: 'yes' is not a BOOLEAN",
                                                              "1 values left over: [3]"]
    decoder = {"inputs": [], "widgets_values": [True]}
    assert widget_problems(decoder, info["MizuotoDecoder"]) == ["required input engine is not linked",
                                                                "required input codes is not linked"]


def test_the_web_extension_knows_the_nodes_widgets(comfy_server: ComfyServer, tmp_path: Path) -> None:
    """The dropdown logic names widgets and sockets; every one exists on its node."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed")
    shutil.copy(REPO / "web" / "choices.js", tmp_path / "choices.mjs")
    (tmp_path / "probe.mjs").write_text('import {NODE_WIDGETS} from "./choices.mjs"; '
                                        "console.log(JSON.stringify(NODE_WIDGETS));")
    widgets = json.loads(subprocess.run([node, "probe.mjs"], cwd=tmp_path, capture_output=True, text=True,
                                        check=True, timeout=60).stdout)
    for node_type, names in widgets.items():
        spec = comfy_server.get(f"/object_info/{node_type}")[node_type]["input"]
        inputs = {**spec.get("required", {}), **spec.get("optional", {})}
        for role, name in names.items():
            expected = "MIZUOTO_ENGINE" if role == "socket" else "COMBO"
            assert inputs[name][0] == expected, (node_type, role, name, inputs[name][0])


def test_templates_thumbnails_and_web_extension_are_served(comfy_server: ComfyServer) -> None:
    assert sorted(comfy_server.get("/workflow_templates")["mizuoto"]) == TEMPLATES
    assert {DEMO_TTS, STEPS, "Text to Speech - Qwen3-TTS CustomVoice (built-in speakers)",
            "Voice Clone - Qwen3-TTS Base (from a reference recording)",
            "Voice Design - Qwen3-TTS VoiceDesign (describe the voice)",
            *(f"Voice Clone - {engine}, step by step (from a reference recording)"
              for engine in ("F5-TTS", "OmniVoice", "VoxCPM 2"))} <= set(TEMPLATES)
    for name in TEMPLATES:  # the browser asks for <name>.json and, as its thumbnail, <name>.jpg
        base = comfy_server.url + "/api/workflow_templates/mizuoto/" + urllib.parse.quote(name)
        with urllib.request.urlopen(base + ".json", timeout=10) as response:
            workflow = json.loads(response.read())
        assert workflow["nodes"] and workflow["extra"]["ds"]["scale"] == 1  # opens at the default zoom
        with urllib.request.urlopen(base + ".jpg", timeout=10) as response:
            assert response.headers["Content-Type"] == "image/jpeg" and response.read(3) == b"\xff\xd8\xff"
    extensions = comfy_server.get("/extensions")
    assert {"/extensions/mizuoto/mizuoto.js", "/extensions/mizuoto/dropdowns.js"} <= set(extensions)
    with urllib.request.urlopen(comfy_server.url + "/extensions/mizuoto/dropdowns.js", timeout=10) as response:
        assert b"/mizuoto/checkpoints" in response.read()
    assert comfy_server.get("/mizuoto/checkpoints")["engines"]["demo"]["choices"][1]["value"] == "demo-small"


def test_phase_workflow_saves_audio_and_reports_memory(comfy_server: ComfyServer) -> None:
    prompt = phases_prompt(comfy_server, text="Hello from the phases.", seed=1, prefix="audio/phases")
    prompt["90"] = {"class_type": "LoadAudio", "inputs": {"audio": REFERENCE_WAV}}  # core AUDIO in
    node_of(prompt, "MizuotoVoicePrompt")["reference"] = ["90", 0]
    history = comfy_server.wait_history(comfy_server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", history["status"]
    for path in saved_files(comfy_server, history):
        assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"RIFF"  # the template saves WAV
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


def test_the_one_node_template_runs(comfy_server: ComfyServer) -> None:
    prompt = template(comfy_server, DEMO_TTS)
    tts = node_of(prompt, "MizuotoTTS")
    assert tts["engine_name"] == "demo" and "engine" not in tts
    tts["max_new_tokens"] = 64  # a short run on a busy test machine
    node_of(prompt, "MizuotoSaveWav")["filename_prefix"] = "audio/all_in_one"
    history = comfy_server.wait_history(comfy_server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", history["status"]
    assert all(p.stat().st_size > 1000 for p in saved_files(comfy_server, history))


def tts_inputs(**inputs: Any) -> dict[str, Any]:
    return {"text": "Hello from one node.", "seed": 1, "temperature": 0.9, "top_k": 50, "top_p": 1.0,
            "repetition_penalty": 1.05, "max_new_tokens": 64, "do_sample": True, "allow_fallback": False, **inputs}


def test_one_text_to_speech_node_writes_a_wav(comfy_server: ComfyServer) -> None:
    """Text to Speech with its own engine and checkpoint, a long text cut in chunks, into Save
    Audio (WAV); and the same node fed by Load TTS Engine runs the same phases: same audio."""
    long_text = "This is the first sentence of a longer text. " * 6
    chunked = tts_inputs(text=long_text, engine_name="demo", checkpoint="demo-small", chunk_chars=100,
                         max_new_tokens=16)  # per chunk: short, on a busy test machine
    linked = {**chunked, "engine": ["3", 0], "engine_name": "qwen3tts", "checkpoint": "none"}  # ignored: linked
    runs = {}
    for name, inputs in (("own", chunked), ("linked", linked)):
        prompt = {"1": {"class_type": "MizuotoTTS", "inputs": inputs},
                  "2": {"class_type": "MizuotoSaveWav",
                        "inputs": {"audio": ["1", 0], "filename_prefix": f"audio/{name}"}},
                  "3": {"class_type": "MizuotoEngineLoader",
                        "inputs": {"engine": "demo", "checkpoint": "demo-small", "dtype": "float32"}}}
        history = comfy_server.wait_history(comfy_server.queue(prompt), RUN_TIMEOUT_S)
        assert history["status"]["status_str"] == "success", history["status"]
        assert history["outputs"]["1"]["text"][0].startswith("spoken in 3 chunks of text")
        (path,) = saved_files(comfy_server, history)
        assert path.suffix == ".wav"
        runs[name] = path.read_bytes()[44:]  # the samples, after the header
    assert runs["own"] == runs["linked"] and len(runs["own"]) > 1000


def test_unload_models_frees_our_components(comfy_server: ComfyServer) -> None:
    prompt_id = comfy_server.queue(phases_prompt(comfy_server, text="Unload me.", seed=2, prefix="audio/unload"))
    assert comfy_server.wait_history(prompt_id, RUN_TIMEOUT_S)["status"]["status_str"] == "success"
    assert loaded(comfy_server.get("/mizuoto/runtime")) > 0
    state = comfy_server.free_until(lambda s: s["models"] and loaded(s) == 0, free_memory=False)
    assert state["device"]["free_mb"] == state["device"]["total_mb"]
    assert all(m["host_bytes"] == m["size_bytes"] for m in state["models"])  # still in RAM, ready to place


def test_free_memory_unloads_engines_from_ram(comfy_server: ComfyServer) -> None:
    prompt_id = comfy_server.queue(phases_prompt(comfy_server, text="Free me.", seed=3, prefix="audio/free"))
    assert comfy_server.wait_history(prompt_id, RUN_TIMEOUT_S)["status"]["status_str"] == "success"
    comfy_server.free_until(lambda s: s["models"] == [])


def test_idle_unload_and_ram_relief_run_at_the_nodes(comfy_server: ComfyServer) -> None:
    """M29, M34 inside ComfyUI: with the dialog's settings (ComfyUI's stored user settings), an
    engine idle past `unload_after_minutes` unloads when the next Mizuoto node starts, and RAM
    relief below `ram_reserve_mb` runs after a phase node, not only in `Runtime.say`."""
    settings = comfy_server.root / "user" / "default" / "comfy.settings.json"
    before = settings.read_text() if settings.exists() else None
    settings.parent.mkdir(parents=True, exist_ok=True)
    try:
        first = comfy_server.queue(phases_prompt(comfy_server, text="Idle soon.", seed=21, prefix="audio/idle"))
        assert comfy_server.wait_history(first, RUN_TIMEOUT_S)["status"]["status_str"] == "success"
        settings.write_text(json.dumps({"Mizuoto.compute.unload_after_minutes": 0.005}))  # 0.3 s
        time.sleep(1.0)
        second = comfy_server.queue(phases_prompt(comfy_server, text="After idling.", seed=22, prefix="audio/idle"))
        assert comfy_server.wait_history(second, RUN_TIMEOUT_S)["status"]["status_str"] == "success"
        assert "idle for more than" in comfy_server.log()

        settings.write_text(json.dumps({"Mizuoto.compute.ram_reserve_mb": 1 << 30}))  # always short
        third = comfy_server.queue(phases_prompt(comfy_server, text="Short of RAM.", seed=23, prefix="audio/ram"))
        assert comfy_server.wait_history(third, RUN_TIMEOUT_S)["status"]["status_str"] == "success"
        assert "free RAM below" in comfy_server.log()
        comfy_server.wait_runtime(lambda s: s["models"] == [])  # the last node's relief unloaded it
    finally:
        if before is None:
            settings.unlink(missing_ok=True)
        else:
            settings.write_text(before)


def test_interrupt_ends_generation_midway(comfy_server: ComfyServer) -> None:
    comfy_server.free_until(lambda s: loaded(s) == 0, free_memory=False)
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


def test_two_copies_of_the_pack_still_start_the_server() -> None:
    """A clone beside a Manager install: the server starts, the second copy is skipped with one
    log line, and the nodes, routes and web extension are there once."""
    with running_server("mizuoto-comfyui-twice-", copies=2) as server:
        log = server.log_path.read_text(errors="replace")
        assert "Added route will never be executed" not in log and "Traceback" not in log, log[-4000:]
        assert log.count("another copy of this pack is already loaded") == 1, log[-4000:]
        assert "IMPORT FAILED" not in log
        assert set(NODES) <= set(server.get("/object_info"))
        assert server.get("/mizuoto/runtime")["models"] == [] and server.get("/mizuoto/checkpoints")["engines"]
        scripts = [e for e in server.get("/extensions") if e.endswith("/dropdowns.js")]
        assert len(scripts) == 1, scripts
        prompt = {"1": {"class_type": "MizuotoTTS", "inputs": tts_inputs(max_new_tokens=16)},
                  "2": {"class_type": "SaveAudio", "inputs": {"audio": ["1", 0], "filename_prefix": "audio/twice"}}}
        history = server.wait_history(server.queue(prompt), RUN_TIMEOUT_S)
        assert history["status"]["status_str"] == "success", history["status"]
