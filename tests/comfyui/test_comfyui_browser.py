"""The pack in a real ComfyUI, seen through the page in headless Chromium (issues 15 and 23;
M50, M51, M9, M10): typing "speech", "tts" or "voice clone" in the node search lists the pack's
nodes; the demo and the Qwen3-TTS CustomVoice templates are loaded through the
page's file input and queued with its Run shortcut on a simulated small GPU, until their audio
players show; the Mizuoto panel's bars match the route's bytes and its timeline has a lane per
phase; a setting changed in the settings dialog shows in the next run's report; Unload Models
leaves the panel empty; no console error comes from the pack's scripts.

Needs `COMFYUI_PATH` (and `COMFYUI_PYTHON`), Chromium (Debian's `chromium`, or `CHROMIUM`),
Node.js and `playwright-core` (tests/browser/package.json; installed with npm when missing).
Skips, saying which is missing. Screenshots and what the browser saw (`seen.json`) go to
`MIZUOTO_BROWSER_OUT`, else `out/browser/<ComfyUI version>/` in the checkout.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from comfyui_harness import (
    COMFYUI_PATH,
    COMFYUI_PYTHON,
    REPO,
    qwen_tts_problem,
    requires_comfyui,
    running_server,
    write_tiny_qwen3tts,
)

pytestmark = requires_comfyui

BROWSER_DIR = REPO / "tests" / "browser"
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
NODE = shutil.which("node")
NPM = shutil.which("npm")
TEMPLATES = REPO / "example_workflows"
DEMO = TEMPLATES / "Text to Speech - demo engine (no download).json"
QWEN = TEMPLATES / "Text to Speech - Qwen3-TTS CustomVoice (built-in speakers).json"
QWEN_CHECKPOINT = "Qwen3-TTS-12Hz-1.7B-CustomVoice"  # the template's folder name, a tiny checkpoint in it
DEMO_SIMULATED_MB = 12  # the demo's 11 MB talker and its working memory do not fit: part streams
QWEN_SIMULATED_MB = 20  # the tiny talker and codec decoder (22 MB) do not fit together
MODE_NAME = "How models use VRAM"  # the dialog's names (web/settings.js)
SIMULATE_NAME = "Simulate a small GPU"
DRIVE_TIMEOUT_S = 1500
#: What users type in the node search, and the nodes (display names) it must list for each.
SEARCHES = {
    "speech": {"Text to Speech", "Text → Speech Codes", "Speech Codes → Audio"},
    "tts": {"Text to Speech"},
    "voice clone": {"Voice Clone / Voice Design"},
}


def comfyui_version() -> str:
    found = re.search(r'"([^"]+)"', (Path(COMFYUI_PATH) / "comfyui_version.py").read_text())
    return f"v{found.group(1)}" if found else "unknown"


def output_folder() -> Path:
    folder = Path(os.environ.get("MIZUOTO_BROWSER_OUT") or REPO / "out" / "browser" / comfyui_version())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def playwright_ready() -> str | None:
    """Why the browser cannot be driven, or None; installs playwright-core with npm when missing."""
    if CHROMIUM is None:
        return "Chromium is not installed (apt-get install chromium, or set CHROMIUM)"
    if NODE is None:
        return "Node.js is not installed (it drives Chromium through playwright-core)"
    if not (BROWSER_DIR / "node_modules" / "playwright-core").is_dir():
        if NPM is None:
            return "playwright-core is not installed and npm is missing (cd tests/browser && npm ci)"
        done = subprocess.run([NPM, "ci", "--no-audit", "--no-fund"], cwd=BROWSER_DIR, capture_output=True,
                              text=True, timeout=600)
        if done.returncode != 0:
            return f"npm could not install playwright-core: {done.stderr.strip()[-500:]}"
    return None


def prepare(root: Path) -> None:
    """Before the server starts: the dialog's settings as ComfyUI stores them (the simulated
    GPU), and a tiny CustomVoice checkpoint in the folder the Qwen3-TTS template names."""
    user = root / "user" / "default"
    user.mkdir(parents=True)
    (user / "comfy.settings.json").write_text(json.dumps({
        "Mizuoto.compute.simulate_vram_mb": DEMO_SIMULATED_MB,
        "Comfy.TutorialCompleted": True,  # no first-run template browser over the canvas
    }))
    write_tiny_qwen3tts(root / "models" / "mizuoto" / QWEN_CHECKPOINT, "custom_voice")


def last_request(state: dict[str, Any]) -> dict[str, Any]:
    assert state["requests"], state
    return dict(state["requests"][-1])


def check_panel(seen: dict[str, Any]) -> None:
    """The panel's bars carry the route's bytes, and its newest chart a lane per phase name."""
    state, shown = seen["state"], seen["shown"]
    assert state["models"], state
    for model in state["models"]:
        (box,) = [b for b in shown["models"] if b["name"] == model["name"]]
        assert box["bars"] == {"loaded": model["loaded_bytes"], "streamed": model["streamed_bytes"],
                               "host": model["host_bytes"]}, (box, model)
    newest = max(shown["lanes"], key=lambda chart: chart["request"])
    request = last_request(state)
    assert (newest["id"], newest["running"]) == (request["id"], False), (newest, request)
    phases = list(dict.fromkeys(run["name"] for run in request["timeline"]))
    assert newest["lanes"] == phases and phases, (newest, phases)
    assert newest["bars"] >= 3 * len(phases)  # loaded, streamed, working per component
    assert state["device"]["name"] in shown["device"]  # "simulated GPU, N MB"


def succeeded(run: dict[str, Any]) -> None:
    assert run["status"]["status_str"] == "success", run["messages"]
    assert run["audio"] and run["player"], run  # the saved file, and its player on the page


@pytest.fixture(scope="module")
def browser_run() -> dict[str, Any]:
    why = playwright_ready()
    if why:
        pytest.skip(why)
    problem = qwen_tts_problem(COMFYUI_PYTHON)
    if problem:
        pytest.skip(f"ComfyUI cannot run Qwen3-TTS: {problem}")
    out = output_folder()
    started = time.monotonic()
    with running_server("mizuoto-comfyui-browser-", prepare) as server:
        plan = {"url": server.url, "chromium": CHROMIUM, "out": str(out), "demo": str(DEMO), "qwen": str(QWEN),
                "modeName": MODE_NAME, "simulateName": SIMULATE_NAME, "searches": list(SEARCHES),
                "qwenSimulateMb": QWEN_SIMULATED_MB,
                "qwenWidgets": {"speaker": "alice", "dtype": "float32", "max_new_tokens": 8, "language": "english"}}
        (out / "plan.json").write_text(json.dumps(plan))
        done = subprocess.run([NODE, str(BROWSER_DIR / "drive.mjs"), str(out / "plan.json")], cwd=BROWSER_DIR,
                              capture_output=True, text=True, timeout=DRIVE_TIMEOUT_S)
        log = server.log()
    seen = json.loads((out / "seen.json").read_text())
    seen["seconds"] = round(time.monotonic() - started, 1)
    (out / "seen.json").write_text(json.dumps(seen, indent=1))
    assert done.returncode == 0 and "error" not in seen, f"{seen.get('error')}\n{done.stderr[-3000:]}\n{log}"
    return dict(seen)


def test_the_pack_registers_its_settings_in_the_dialog(browser_run: dict[str, Any]) -> None:
    assert browser_run["registered"] == ["normal", DEMO_SIMULATED_MB]  # a default, and the stored value


def test_the_node_search_finds_the_packs_nodes(browser_run: dict[str, Any]) -> None:
    """Typed into the node search a double-click opens (node-search aliases on 1.49.x)."""
    for query, wanted in SEARCHES.items():
        listed = [result["name"] for result in browser_run["search"][query]]
        assert wanted <= set(listed), (query, listed)


def test_the_demo_template_speaks_on_the_simulated_gpu_and_the_panel_shows_it(browser_run: dict[str, Any]) -> None:
    succeeded(browser_run["demo"])
    check_panel(browser_run["demoPanel"])
    state = browser_run["demoPanel"]["state"]
    assert state["device"]["simulated"] and state["device"]["total_mb"] == DEMO_SIMULATED_MB
    assert last_request(state)["streamed_mb"] > 0  # 16 MB is too small for the demo whole


def test_a_setting_changed_in_the_dialog_applies_to_the_next_run(browser_run: dict[str, Any]) -> None:
    assert browser_run["storedMode"] == "none"
    succeeded(browser_run["demoNone"])
    check_panel(browser_run["demoNonePanel"])
    state = browser_run["demoNonePanel"]["state"]
    before = last_request(browser_run["demoPanel"]["state"])
    after = last_request(state)
    assert after["id"] > before["id"] and state["policy"]["mode"] == "none"
    # Every layer streams now; only what is in no layer (embeddings, norms) stays on the device.
    assert all(c["why"] == "vram_mode none" and c["from_ram_mb"] > 0 for c in after["components"]), after["components"]
    was = {c["name"]: c["on_device_mb"] for c in before["components"]}
    assert all(c["on_device_mb"] < was[c["name"]] for c in after["components"]), (was, after["components"])


def test_the_qwen3tts_template_speaks_and_each_phase_has_a_lane(browser_run: dict[str, Any]) -> None:
    assert browser_run["storedSimulate"] == QWEN_SIMULATED_MB
    succeeded(browser_run["qwen"])
    check_panel(browser_run["qwenPanel"])
    state = browser_run["qwenPanel"]["state"]
    assert state["device"]["total_mb"] == QWEN_SIMULATED_MB and state["policy"]["mode"] == "normal"
    assert len({run["name"] for run in last_request(state)["timeline"]}) >= 2  # voice, talker, decoder…


def test_unload_models_empties_the_panel(browser_run: dict[str, Any]) -> None:
    unloaded = browser_run["unloadedPanel"]
    assert unloaded["state"]["models"] and all(m["loaded_bytes"] == 0 for m in unloaded["state"]["models"])
    assert all(box["bars"]["loaded"] == 0 for box in unloaded["shown"]["models"])
    freed = browser_run["freedPanel"]
    assert freed["state"]["models"] == [] and "No Mizuoto model loaded." in freed["shown"]["text"]


def test_no_console_error_comes_from_the_packs_scripts(browser_run: dict[str, Any]) -> None:
    ours = [m for m in browser_run["console"]
            if m["type"] in ("error", "pageerror") and ("/extensions/mizuoto" in m["url"] + m["text"]
                                                        or "mizuoto" in m["text"].lower())]
    assert not ours, ours
    assert set(browser_run["screenshots"]) >= {"0-search-speech", "1-demo-panel", "2-demo-vram-none",
                                              "3-qwen3tts-panel", "4-unloaded", "5-freed"}
    assert all(Path(s["path"]).stat().st_size > 10_000 for s in browser_run["screenshots"].values())
