"""The bridge inside a real ComfyUI process (M35): a ComfyUI `ModelPatcher` and Mizuoto handles
in one `current_loaded_models`. All checks run in one ComfyUI subprocess (`comfy_inprocess.py`,
see its docstring for the shared simulated device); each test reads its check's result."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from comfyui_harness import COMFYUI_PATH, COMFYUI_PYTHON, REPO, check_names, comfyui_env, requires_comfyui, run_checks

pytestmark = requires_comfyui

SCRIPT = Path(__file__).with_name("comfy_inprocess.py")
ACCOUNTING_CHECKS = Path(__file__).with_name("accounting_checks.py")
TIMEOUT_S = 900  # all checks in one ComfyUI process; ~3 min alone, much more on a loaded 2-core machine


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="mizuoto-pack-") as folder:
        link = Path(folder) / "mizuoto"  # the pack under the name a user would give it
        link.symlink_to(REPO, target_is_directory=True)
        return run_checks([COMFYUI_PYTHON, str(SCRIPT)], COMFYUI_PATH, TIMEOUT_S,
                          {**comfyui_env(), "MIZUOTO_PACK_LINK": str(link),
                           "MIZUOTO_CACHE": str(Path(folder) / "cache")})


def assert_check(results: dict[str, dict[str, object]], name: str) -> None:
    assert name in results, f"check {name!r} did not run; ran: {sorted(results)}"
    assert results[name]["ok"], results[name]["error"]


@pytest.mark.parametrize("name", check_names(ACCOUNTING_CHECKS))
def test_comfyuis_accounting_holds_over_our_adapters(results: dict[str, dict[str, object]], name: str) -> None:
    """`accounting_checks.py`: free_memory, load_models_gpu, unload_all_models, cleanup_models, ..."""
    assert_check(results, name)


def test_adapter_load_device_is_comfyuis(results: dict[str, dict[str, object]]) -> None:
    assert_check(results, "adapter_load_device_is_comfyuis")


def test_interrupt_stops_a_node_request(results: dict[str, dict[str, object]]) -> None:
    assert_check(results, "interrupt_stops_a_node_request")


def test_pack_loads_as_a_custom_node(results: dict[str, dict[str, object]]) -> None:
    assert_check(results, "pack_loads_as_a_custom_node")


def test_fallback_toggle_allows_and_off_defers_to_the_setting(results: dict[str, dict[str, object]]) -> None:
    assert_check(results, "fallback_toggle_allows_and_off_defers_to_the_setting")


def test_demo_and_a_comfy_unet_evict_each_other_by_unit(results: dict[str, dict[str, object]]) -> None:
    assert_check(results, "demo_and_a_comfy_unet_evict_each_other_by_unit")
