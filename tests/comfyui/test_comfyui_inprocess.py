"""The bridge inside a real ComfyUI process (M35): a ComfyUI `ModelPatcher` and Mizuoto handles
in one `current_loaded_models`. All checks run in one ComfyUI subprocess (`comfy_inprocess.py`,
see its docstring for the shared simulated device); each test reads its check's result."""
from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest
from comfyui_harness import COMFYUI_PATH, COMFYUI_PYTHON, REPO, comfyui_env, requires_comfyui

pytestmark = requires_comfyui

SCRIPT = Path(__file__).with_name("comfy_inprocess.py")
TIMEOUT_S = 900  # all checks in one ComfyUI process; ~3 min alone, much more on a loaded 2-core machine


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="mizuoto-pack-") as folder:
        link = Path(folder) / "mizuoto"  # the pack under the name a user would give it
        link.symlink_to(REPO, target_is_directory=True)
        done = subprocess.run([COMFYUI_PYTHON, str(SCRIPT)], cwd=COMFYUI_PATH, capture_output=True, text=True,
                              timeout=TIMEOUT_S, env={**comfyui_env(), "MIZUOTO_PACK_LINK": str(link),
                                                      "MIZUOTO_CACHE": str(Path(folder) / "cache")})
    found = {}
    for line in done.stdout.splitlines():
        if line.startswith("MIZUOTO-CHECK "):
            result = json.loads(line[len("MIZUOTO-CHECK "):])
            found[result["check"]] = result
    assert found, f"no check ran (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return found


def assert_check(results: dict[str, dict[str, object]], name: str) -> None:
    assert name in results, f"check {name!r} did not run; ran: {sorted(results)}"
    assert results[name]["ok"], results[name]["error"]


def test_adapter_load_device_is_comfyuis(results: dict[str, dict[str, object]]) -> None:
    assert_check(results, "adapter_load_device_is_comfyuis")


def test_partial_request_takes_exactly_enough_units_and_keeps_the_entry(results: dict[str, dict[str, object]]) -> None:
    assert_check(results, "partial_request_takes_exactly_enough_units")


def test_larger_request_detaches_the_handle(results: dict[str, dict[str, object]]) -> None:
    assert_check(results, "larger_request_detaches")


def test_our_request_evicts_comfyui_model_not_our_handle_in_use(results: dict[str, dict[str, object]]) -> None:
    assert_check(results, "our_request_evicts_comfyui_not_our_handle_in_use")


def test_registering_twice_leaves_one_entry(results: dict[str, dict[str, object]]) -> None:
    assert_check(results, "registering_twice_leaves_one_entry")


def test_unload_all_models_frees_our_handles(results: dict[str, dict[str, object]]) -> None:
    assert_check(results, "unload_all_models_frees_our_handles")


def test_entry_dies_with_its_handle(results: dict[str, dict[str, object]]) -> None:
    assert_check(results, "entry_dies_with_its_handle")


def test_interrupt_stops_a_node_request(results: dict[str, dict[str, object]]) -> None:
    assert_check(results, "interrupt_stops_a_node_request")


def test_pack_loads_as_a_custom_node(results: dict[str, dict[str, object]]) -> None:
    assert_check(results, "pack_loads_as_a_custom_node")


def test_fallback_toggle_allows_and_off_defers_to_the_setting(results: dict[str, dict[str, object]]) -> None:
    assert_check(results, "fallback_toggle_allows_and_off_defers_to_the_setting")
