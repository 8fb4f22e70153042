"""The settings dialog's `compute.*` values reach the next request, below the graph's Memory
Settings node and validated by `VramPolicy` (issue 15 item 3; M9, M10); the dialog's list
(web/settings.js, run under Node) matches the policy's keys, defaults and ranges; the panel's
bars and timeline (web/panel.js) from the route's `requests`."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mizuoto_runtime import SettingError, VramPolicy
from mizuoto_runtime.app.host import ProcessRuntime
from mizuoto_runtime.app.ui_settings import (
    DIALOG_KEYS,
    DIALOG_PREFIX,
    UNSET,
    ComfyUISettings,
    graph_settings,
    read_dialog,
)
from mizuoto_runtime.memory.policy import _SETTINGS

REPO = Path(__file__).resolve().parents[2]
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="Node.js is not installed (the web extension's logic runs in it)")


class Queue:
    """Which prompt runs now, as ComfyUI's prompt queue would say."""

    def __init__(self) -> None:
        self.running: tuple[str, dict[str, Any]] | None = None

    def __call__(self) -> tuple[str, dict[str, Any]] | None:
        return self.running


def write_dialog(user_dir: Path, values: dict[str, Any]) -> None:
    folder = user_dir / "default"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "comfy.settings.json").write_text(json.dumps(
        {"Comfy.Other.Setting": True, **{DIALOG_PREFIX + k: v for k, v in values.items()}}))


def memory_node(**inputs: Any) -> dict[str, Any]:
    return {"class_type": "MizuotoMemorySettings", "inputs": inputs}


@pytest.fixture()
def process(tmp_path: Path) -> tuple[ProcessRuntime, Queue]:
    queue = Queue()
    host = ProcessRuntime()
    host.use_layers(ComfyUISettings(tmp_path, queue))
    return host, queue


def test_the_dialog_applies_to_the_next_request(tmp_path: Path, process: tuple[ProcessRuntime, Queue]) -> None:
    host, queue = process
    host.node_started()
    assert host.runtime().policy.vram_mode == "normal"  # no file: the defaults
    write_dialog(tmp_path, {"compute.vram_mode": "low", "compute.vram_limit_mb": 0, "compute.vram_reserve_mb": 64})
    queue.running = ("p1", {"1": {"class_type": "MizuotoTTS", "inputs": {}}})
    host.node_started()
    policy = host.runtime().policy
    assert (policy.vram_mode, policy.vram_limit_mb, policy.vram_reserve_mb) == ("low", None, 64)  # 0 = no limit


def test_the_graphs_memory_settings_win_for_that_graph_only(tmp_path: Path,
                                                            process: tuple[ProcessRuntime, Queue]) -> None:
    host, queue = process
    write_dialog(tmp_path, {"compute.vram_mode": "low", "compute.oom_fallback": True})
    queue.running = ("p1", {"5": memory_node(vram_mode="none", vram_reserve_mb=-1, simulate_vram_mb=0)})
    host.node_started()  # a node of p1 starts (its Memory Settings node was cached: read from the prompt)
    policy = host.runtime().policy
    assert (policy.vram_mode, policy.oom_fallback) == ("none", True)  # the graph's mode, the dialog's fallback
    queue.running = ("p2", {"1": {"class_type": "MizuotoTTS", "inputs": {}}})
    host.node_started()
    assert host.runtime().policy.vram_mode == "low"  # a graph without the node: the dialog again


def test_values_the_node_takes_from_links_hold_for_its_prompt(tmp_path: Path,
                                                               process: tuple[ProcessRuntime, Queue]) -> None:
    host, queue = process
    queue.running = ("p1", {"5": memory_node(vram_mode=["9", 0])})  # linked: not in the prompt
    host.set_graph_settings({"compute.vram_mode": "none"})  # the node ran with the linked value
    host.node_started()
    assert host.runtime().policy.vram_mode == "none"
    queue.running = ("p2", {})
    host.node_started()
    assert host.runtime().policy.vram_mode == "normal"


def test_a_changed_simulated_size_rebuilds_the_runtime_once(tmp_path: Path,
                                                            process: tuple[ProcessRuntime, Queue]) -> None:
    host, queue = process
    write_dialog(tmp_path, {"compute.simulate_vram_mb": 16})
    host.node_started()
    first = host.runtime()
    assert first.devices.describe()["simulated"] and first.devices.describe()["total_mb"] == 16
    host.node_started()
    assert host.runtime() is first  # the same settings again: nothing reloads
    write_dialog(tmp_path, {"compute.simulate_vram_mb": 0})  # 0 = off
    host.node_started()
    assert host.runtime() is not first and not host.runtime().devices.describe()["simulated"]


@pytest.mark.parametrize("values, key", [
    ({"compute.vram_mode": "tiny"}, "compute.vram_mode"),
    ({"compute.gpu_jobs": 0}, "compute.gpu_jobs"),
    ({"compute.vram_limit_mb": -5}, "compute.vram_limit_mb"),
    ({"compute.oom_retry": "maybe"}, "compute.oom_retry"),
    ({"compute.cuda_allocator": "async"}, "compute.cuda_allocator"),  # not a dialog setting
])
def test_a_bad_dialog_value_gets_the_policys_error_and_changes_nothing(
        tmp_path: Path, process: tuple[ProcessRuntime, Queue], values: dict[str, Any], key: str) -> None:
    host, _ = process
    write_dialog(tmp_path, {"compute.vram_mode": "low"})
    host.node_started()
    write_dialog(tmp_path, {"compute.vram_mode": "none", **values})
    with pytest.raises(SettingError, match=key.replace(".", r"\.")) as raised:
        host.node_started()
    assert "settings" in str(raised.value) and "M1" not in str(raised.value)  # says where, in plain words
    assert host.runtime().policy.vram_mode == "low"  # validated before anything applies
    if key != "compute.cuda_allocator":  # the policy's own message, with where it was set
        with pytest.raises(SettingError) as direct:
            VramPolicy({key: values[key]})
        assert str(direct.value) in str(raised.value)


def test_a_broken_settings_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "comfy.settings.json"
    path.write_text("{not json")
    with pytest.raises(SettingError, match="comfy.settings.json"):
        read_dialog(path)
    path.write_text("[1, 2]")
    with pytest.raises(SettingError, match="JSON object"):
        read_dialog(path)
    assert read_dialog(tmp_path / "absent.json") == {}


def test_a_bad_value_on_the_memory_settings_node_names_the_node() -> None:
    with pytest.raises(SettingError, match=r"compute\.vram_mode.*Memory Settings node 7"):
        graph_settings({"7": memory_node(vram_mode="tiny")})
    later = graph_settings({"12": memory_node(vram_mode="low"), "3": memory_node(vram_mode="none")})
    assert later == {"compute.vram_mode": "low"}  # the one ComfyUI runs last


def test_no_layers_means_the_host_keeps_what_it_was_given() -> None:
    host = ProcessRuntime({"compute.vram_mode": "low"})
    host.node_started()
    assert host.runtime().policy.vram_mode == "low"
    host.set_graph_settings({"compute.vram_mode": "none"})
    assert host.runtime().policy.vram_mode == "none"


# ---- the dialog's list, under Node --------------------------------------------------------------
def run_module(tmp_path: Path, script: str, code: str, *args: str) -> Any:
    for name in ("settings", "panel"):
        shutil.copy(REPO / "web" / f"{name}.js", tmp_path / f"{name}.mjs")
    (tmp_path / "probe.mjs").write_text(code)
    done = subprocess.run([NODE, "probe.mjs", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@needs_node
def test_the_dialog_offers_the_policys_settings_with_its_defaults_and_ranges(tmp_path: Path) -> None:
    code = ('import * as s from "./settings.mjs";\n'
            'console.log(JSON.stringify({table: s.COMPUTE_SETTINGS, defs: s.settingDefinitions()}));')
    out = run_module(tmp_path, "settings", code)
    table = {s["key"]: s for s in out["table"]}
    assert tuple(table) == DIALOG_KEYS
    for key, entry in table.items():
        spec = _SETTINGS[key.removeprefix("compute.")]
        default = None if key in UNSET and entry["defaultValue"] == UNSET[key] else entry["defaultValue"]
        assert default == spec.default, key
        assert entry.get("unset") == UNSET.get(key), key
        assert tuple(entry.get("options", ())) == spec.choices, key
        # the field's range: the policy's minimum, or the unset number
        if "attrs" in entry and spec.minimum is not None:
            assert entry["attrs"]["min"] == UNSET.get(key, spec.minimum), key
        assert entry["type"] == {bool: "boolean", str: "combo"}.get(spec.kind, "number"), key
        assert not any(f"M{n}" in entry["tooltip"] + entry["name"] for n in range(1, 64)), key  # plain words
    ids = [d["id"] for d in out["defs"]]
    assert ids == [DIALOG_PREFIX + k for k in DIALOG_KEYS] and all(d["category"][0] == "Mizuoto" for d in out["defs"])


PANEL_PROBE = """
import * as p from "./panel.mjs";
const data = JSON.parse(process.argv[2]);
const layout = p.timelineShapes(data.requests[data.requests.length - 1], 300);
console.log(JSON.stringify({
  bars: p.modelBars(data.models[0]), label: p.deviceLabel(data.device), plain: p.deviceLabel({device: "cuda:0"}),
  empty: p.timelineShapes(null).shapes, shapes: layout.shapes, seconds: layout.seconds,
}));
"""


def route_payload() -> dict[str, Any]:
    """A `/mizuoto/runtime` answer in report.py's documented format: a request whose talker
    phase ran twice (two chunks), a yield, a retry and a fallback."""
    def run(name: str, start: float, end: float, component: str, loaded: float, streamed: float,
            **marks: Any) -> dict[str, Any]:
        return {"name": name, "lane": 0, "start_s": start, "end_s": end, "working_mb": 1.0, "reserve_mb": 0.0,
                "components": [{"name": component, "loaded_mb": loaded, "streamed_mb": streamed, "working_mb": 1.0}],
                "yields": [], "retries": [], "fallbacks": [], **marks}
    timeline = [
        run("talker", 0.0, 1.0, "demo:talker", 4.2, 7.5,
            retries=[{"at_s": 0.5, "attempt": 1, "error": "out of memory"}]),
        run("decoder", 1.0, 1.5, "demo:decoder", 2.0, 0.0,
            yields=[{"component": "demo:talker", "for_whom": ["demo:decoder"], "mb": 4.2, "at_s": 1.0}],
            fallbacks=[{"what": "tiled decode", "at_s": 1.4}]),
        run("talker", 1.5, 2.0, "demo:talker", 4.2, 7.5),
    ]
    return {"device": {"device": "cpu", "simulated": True, "free_mb": 10, "total_mb": 16,
                       "name": "simulated GPU, 16 MB"},
            "policy": {"mode": "normal"},
            "models": [{"engine": "demo", "name": "talker", "size_bytes": 12_268_339, "loaded_bytes": 4_404_019,
                        "host_bytes": 12_268_339, "streamed_bytes": 15_728_640, "streamed_bytes_total": 347_000_000}],
            "requests": [{"id": 1, "timeline": []}, {"id": 2, "streamed_mb": 15.0, "timeline": timeline}]}


@needs_node
def test_the_panel_shows_the_last_requests_streamed_bytes_and_each_phase(tmp_path: Path) -> None:
    data = route_payload()
    out = run_module(tmp_path, "panel", PANEL_PROBE, json.dumps(data))
    bars = {label: (nbytes, whole) for label, nbytes, whole in out["bars"]}
    model = data["models"][0]
    assert bars["loaded"] == (model["loaded_bytes"], model["size_bytes"])
    assert bars["streamed"][0] == model["streamed_bytes"]  # the last request's, not the running total
    assert bars["host"][0] == model["host_bytes"]
    assert (out["label"], out["plain"]) == ("simulated GPU, 16 MB", "cuda:0") and out["empty"] == []
    lanes = [s for s in out["shapes"] if s["kind"] == "lane"]
    assert [lane["phase"] for lane in lanes] == ["talker", "decoder"] and out["seconds"] == 2.0  # one lane per phase
    runs = sorted((s for s in out["shapes"] if s["kind"] == "run"), key=lambda r: r["x"])
    assert [r["phase"] for r in runs] == ["talker", "decoder", "talker"]  # placed by time
    assert runs[0]["y"] == runs[2]["y"] < runs[1]["y"] and runs[2]["x"] >= runs[1]["x"] + runs[1]["w"] - 0.01
    parts = {(s["component"], s["part"]): s for s in out["shapes"] if s["kind"] == "bar"}
    talker = {part: parts[("demo:talker", part)] for part in ("loaded", "working", "streamed")}
    assert talker["streamed"]["mb"] == 15.0  # its two runs summed
    assert talker["working"]["x"] == pytest.approx(talker["loaded"]["x"] + talker["loaded"]["w"])  # stacked
    assert talker["loaded"]["w"] / talker["working"]["w"] == pytest.approx(4.2)  # one VRAM scale
    assert parts[("demo:decoder", "streamed")]["w"] == 0 < talker["streamed"]["w"]
    (mark,) = [s for s in out["shapes"] if s["kind"] == "yield"]
    assert (mark["component"], mark["forWhom"]) == ("demo:talker", "decoder") and "for decoder" in mark["title"]
    assert [(s["kind"], s["phase"]) for s in out["shapes"] if s["kind"] in ("retry", "fallback")] == [
        ("retry", "talker"), ("fallback", "decoder")]
    assert not any("M5" in s.get("title", "") for s in out["shapes"])
