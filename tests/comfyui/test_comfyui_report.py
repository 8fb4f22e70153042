"""The memory report in a real ComfyUI (M50, M51; issue 15): Save Audio (WAV) returns the
`ui.audio` entries the frontend's player plays (as core Save Audio does) and ComfyUI serves the
file; the Text to Speech node shows one line per component, the same lines the route's last
request has; `GET /mizuoto/runtime` lists the requests, newest last, with streamed bytes per
request, names the simulated device in words, takes no input and refuses anything but GET;
`mizuoto runtime --url` shows the running server's models and draws its last request."""
from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comfyui_harness import COMFYUI_PYTHON, REPO, ComfyServer, comfyui_env, requires_comfyui, running_server

pytestmark = requires_comfyui

SIMULATED_MB = 10  # the demo talker (11 MB) streams part of itself
RUN_TIMEOUT_S = 300.0  # a prompt took 95 s on a loaded 2-core machine
CLI_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def server() -> Iterator[ComfyServer]:
    with running_server("mizuoto-report-") as running:
        yield running


def tts_prompt(seed: int, prefix: str) -> dict[str, Any]:
    """Memory Settings (a simulated 10 MB GPU) → Load TTS Engine (demo) → Text to Speech →
    Save Audio (WAV)."""
    return {
        "1": {"class_type": "MizuotoMemorySettings", "inputs": {
            "vram_mode": "normal", "vram_reserve_mb": -1, "vram_limit_mb": 0, "async_offload": 1,
            "host_copies": "auto", "oom_retry": True, "oom_fallback": False, "simulate_vram_mb": SIMULATED_MB}},
        "2": {"class_type": "MizuotoEngineLoader", "inputs": {
            "engine": "demo", "checkpoint": "demo-small", "dtype": "float32", "memory": ["1", 0]}},
        "3": {"class_type": "MizuotoTTS", "inputs": {
            "engine": ["2", 0], "text": "The report shows every component once.", "seed": seed,
            "temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05, "max_new_tokens": 2048,
            "do_sample": True, "allow_fallback": False}},
        "4": {"class_type": "MizuotoSaveWav", "inputs": {"audio": ["3", 0], "filename_prefix": prefix}},
    }


def run(server: ComfyServer, seed: int, prefix: str) -> dict[str, Any]:
    history = server.wait_history(server.queue(tts_prompt(seed, prefix)), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", (history["status"], server.log())
    return history


def view(server: ComfyServer, item: dict[str, str]) -> bytes:
    """What the frontend's audio player loads for a `ui.audio` entry."""
    query = urllib.parse.urlencode({"filename": item["filename"], "subfolder": item["subfolder"],
                                    "type": item["type"]})
    with urllib.request.urlopen(f"{server.url}/view?{query}", timeout=30) as response:
        return response.read()


@pytest.fixture(scope="module")
def two_runs(server: ComfyServer) -> list[dict[str, Any]]:
    return [run(server, seed, f"audio/report_{seed}") for seed in (1, 2)]


def test_save_wav_returns_a_preview_the_player_can_load(server: ComfyServer, two_runs: list[dict[str, Any]]) -> None:
    for seed, history in zip((1, 2), two_runs):
        [item] = history["outputs"]["4"]["audio"]
        assert item["type"] == "output" and item["subfolder"] == "audio"
        assert item["filename"].startswith(f"report_{seed}_") and item["filename"].endswith(".wav")
        saved = server.output / item["subfolder"] / item["filename"]
        served = view(server, item)
        assert served == saved.read_bytes() and served[:4] == b"RIFF" and served[8:12] == b"WAVE"
    # The player is the frontend's own audio widget, which our web extension gives the node.
    with urllib.request.urlopen(f"{server.url}/extensions/mizuoto/audio_preview.js", timeout=30) as response:
        script = response.read().decode()
    assert '"MizuotoSaveWav"' in script and "AUDIO_UI" in script


def test_the_node_lines_are_the_routes_last_request(server: ComfyServer, two_runs: list[dict[str, Any]]) -> None:
    state = server.get("/mizuoto/runtime")
    requests = state["requests"]
    assert len(requests) >= 2 and [r["id"] for r in requests] == sorted(r["id"] for r in requests)
    last = requests[-1]
    assert not last["running"] and last["device"] == f"simulated GPU, {SIMULATED_MB} MB"
    [text] = two_runs[-1]["outputs"]["3"]["text"]
    lines = text.split("\n")
    assert lines[0].startswith("loaded ") and lines[0].endswith(f"simulated GPU, {SIMULATED_MB} MB")
    assert lines[1:1 + len(last["components"])] == [c["line"] for c in last["components"]]
    names = [c["name"] for c in last["components"]]
    assert len(names) == len(set(names)) and {n.split(":")[1] for n in names} == {"talker", "decoder"}
    assert [p["name"] for p in last["timeline"]] == ["talker", "codec decoder"]


def test_the_route_counts_streamed_bytes_per_request(server: ComfyServer, two_runs: list[dict[str, Any]]) -> None:
    state = server.get("/mizuoto/runtime")
    assert state["device"]["name"] == f"simulated GPU, {SIMULATED_MB} MB"
    first, second = state["requests"][-2:]
    assert first["streamed_mb"] > 0 and second["streamed_mb"] > 0
    streamed = 0
    for model in state["models"]:
        key = f"{model['engine']}:{model['name']}"
        used = [next((c["streamed_bytes"] for c in r["components"] if c["name"] == key), None) for r in (first, second)]
        if used[1] is None:
            continue  # a component the last request did not use
        assert model["streamed_bytes"] == used[1]  # the last request's, not since the server started
        assert model["streamed_bytes_total"] >= sum(u or 0 for u in used)
        assert model["line"].startswith(f"{key} ")
        streamed += model["streamed_bytes"]
    assert abs(streamed / 2**20 - second["streamed_mb"]) < 0.01  # the models' bytes add up to the request's


def test_the_route_is_get_only_and_takes_no_input(server: ComfyServer, two_runs: list[dict[str, Any]]) -> None:
    plain = server.get("/mizuoto/runtime")
    asked = server.get("/mizuoto/runtime?path=/etc/passwd&engine=demo")
    assert set(asked) == set(plain) == {"device", "policy", "models", "requests"}
    assert asked["requests"] == plain["requests"]
    for method in ("POST", "PUT", "DELETE"):
        request = urllib.request.Request(f"{server.url}/mizuoto/runtime", data=b"{}", method=method)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 405, method


def test_cli_runtime_url_shows_the_servers_models(server: ComfyServer, two_runs: list[dict[str, Any]],
                                                   tmp_path: Path) -> None:
    chart = tmp_path / "last.svg"
    done = subprocess.run([COMFYUI_PYTHON, "-m", "mizuoto_runtime", "runtime", "--url", server.url,
                           "--timeline", str(chart)], cwd=REPO, env=comfyui_env(), capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    state = server.get("/mizuoto/runtime")
    assert shown["url"] == server.url
    assert {m["name"] for m in shown["models"]} == {m["name"] for m in state["models"]} >= {"talker", "decoder"}
    assert shown["requests"][-1]["id"] == state["requests"][-1]["id"]
    root = ET.parse(chart).getroot()
    phases = root.findall(".//{http://www.w3.org/2000/svg}g[@class='phase']")
    assert [g.get("data-phase") for g in phases] == [p["name"] for p in state["requests"][-1]["timeline"]]
