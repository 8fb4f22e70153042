"""M61: the training.memory presets; M62: compute.cpu_allocator in the training process;
M63: peak estimates from a table of measured peaks, and the advice when they do not fit."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from mizuoto_runtime import MizuotoError
from mizuoto_runtime.app.training import MethodInfo, PeakRow, cpu_allocator, estimate_mb, fit_advice, memory_plan
from mizuoto_runtime.app.training.host_optimizer import HostAdamW
from mizuoto_runtime.app.training.memory import DeviceAdamW, activations, make_optimizer, trainable_dtype

REPO = Path(__file__).resolve().parents[3]


# ---- presets (M61) ---------------------------------------------------------------------------
def test_presets_pick_more_tools_as_memory_gets_lower() -> None:
    default, low, lowest = (memory_plan(p) for p in ("default", "low", "lowest"))
    assert (default.gradient_checkpointing, default.activation_offload, default.host_optimizer) == (False, False, False)
    assert (low.gradient_checkpointing, low.activation_offload, low.host_optimizer) == (True, False, True)
    assert (lowest.gradient_checkpointing, lowest.activation_offload, lowest.host_optimizer) == (True, True, True)
    assert (default.cpu_allocator, low.cpu_allocator, lowest.cpu_allocator) == ("auto", "auto", "no_hugepages")


def test_a_methods_own_hyperparameters_win() -> None:
    plan = memory_plan("lowest", {"gradient_checkpointing": False, "cpu_allocator": "auto", "lr": 1e-4,
                                  "host_optimizer": None})
    assert plan.preset == "lowest" and not plan.gradient_checkpointing and plan.cpu_allocator == "auto"
    assert plan.host_optimizer and plan.activation_offload  # None and unrelated keys leave the preset's


@pytest.mark.parametrize(("preset", "params", "match"), [
    ("fast", {}, "training.memory must be one of default, low, lowest"),
    ("low", {"activation_offload": "yes"}, "'activation_offload' must be true or false"),
    ("low", {"cpu_allocator": "big"}, "'cpu_allocator' must be one of auto, hugepages, no_hugepages"),
])
def test_bad_presets_and_overrides_are_named(preset: str, params: dict, match: str) -> None:
    with pytest.raises(MizuotoError, match=match):
        memory_plan(preset, params)


def test_the_optimizer_lives_where_the_plan_says() -> None:
    weight = nn.Parameter(torch.ones(3))
    assert isinstance(make_optimizer([weight], memory_plan("default"), 1e-3, 0.0), DeviceAdamW)
    assert isinstance(make_optimizer([weight], memory_plan("low"), 1e-3, 0.0), HostAdamW)
    # AdamW on the device needs float32 weights; the host keeps float32 masters itself
    assert trainable_dtype(memory_plan("default"), torch.bfloat16) == torch.float32
    assert trainable_dtype(memory_plan("lowest"), torch.bfloat16) == torch.bfloat16


def test_activation_offload_moves_saved_tensors_to_the_host_only_off_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []

    class Saving:
        def __init__(self, pin_memory: bool) -> None:
            calls.append(pin_memory)

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", Saving)
    with activations(memory_plan("lowest"), torch.device("cpu")):
        pass
    assert calls == []  # on the CPU activations are already in host memory
    with activations(memory_plan("lowest"), torch.device("cuda", 0)):
        pass
    with activations(memory_plan("low"), torch.device("cuda", 0)):
        pass
    assert calls == [True]  # pinned, and only under lowest


# ---- the CPU allocator (M62) -------------------------------------------------------------------
def test_cpu_allocator_reaches_the_training_environment() -> None:
    assert cpu_allocator.cpu_allocator_env("hugepages") == {"THP_MEM_ALLOC_ENABLE": "1"}
    assert cpu_allocator.cpu_allocator_env("no_hugepages") == {"THP_MEM_ALLOC_ENABLE": "0"}
    assert cpu_allocator.cpu_allocator_env("auto") == {}
    assert cpu_allocator.effective("auto", "no_hugepages") == "no_hugepages"  # the preset's, when not set
    assert cpu_allocator.effective("hugepages", "no_hugepages") == "hugepages"  # the setting's, when set


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge pages per process are a Linux feature")
def test_no_hugepages_turns_huge_pages_off_for_the_training_process() -> None:
    code = ("import os; from mizuoto_runtime.app.training.cpu_allocator import apply_in_process, huge_pages_enabled; "
            "before = huge_pages_enabled(); done = apply_in_process('no_hugepages', os.environ); "
            "print(before, done, huge_pages_enabled())")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    before, done, after = out.stdout.split()
    if before == "None":
        pytest.skip("this kernel does not report THP_enabled")
    assert (done, after) == ("True", "False")


# ---- estimates (M63) --------------------------------------------------------------------------
ROWS = (
    PeakRow("small", 1_000_000, "default", 2, 400.0, "cpu", "test"),
    PeakRow("small", 1_000_000, "low", 2, 200.0, "cpu", "test"),
    PeakRow("small", 1_000_000, "lowest", 2, 100.0, "cpu", "test"),
    PeakRow("small", 1_000_000, "low", 8, 320.0, "cpu", "test"),
    PeakRow("large", 100_000_000, "default", 2, 30_000.0, "cpu", "test"),
    PeakRow("large", 100_000_000, "low", 2, 16_000.0, "cpu", "test"),
    PeakRow("large", 100_000_000, "lowest", 2, 9_000.0, "cpu", "test"),
    PeakRow("large", 100_000_000, "default", 2, 20_000.0, "cuda: test GPU", "test"),
)


@pytest.mark.parametrize(("preset", "params", "batch", "scales", "device", "expected"), [
    # nearest by ratio (3M is nearer 1M than 100M), scaled by size, +10 %
    ("default", 3_000_000, 2, False, "cpu", 400.0 * 3 * 1.1),
    ("lowest", 30_000_000, 2, False, "cpu", 9_000.0 * 0.3 * 1.1),
    # on CUDA +512 MB, and a GPU row wins over CPU rows; without one, CPU rows stand in
    ("default", 50_000_000, 2, False, "cuda", 20_000.0 * 0.5 * 1.1 + 512),
    ("low", 50_000_000, 2, False, "cuda", 16_000.0 * 0.5 * 1.1 + 512),
    # batch size matters only where the method says its peak scales with it
    ("low", 1_000_000, 3, True, "cpu", 200.0 * 3 / 2 * 1.1),
    ("low", 1_000_000, 3, False, "cpu", 200.0 * 1.1),
    # of the nearest model's rows, the nearest batch size (then scaled from it)
    ("low", 1_000_000, 7, True, "cpu", 320.0 * 7 / 8 * 1.1),
    ("low", 1_000_000, 1, True, "cpu", 200.0 / 2 * 1.1),
])
def test_estimate_against_the_table(preset: str, params: int, batch: int, scales: bool, device: str,
                                    expected: float) -> None:
    assert estimate_mb(ROWS, preset, params, batch, scales, device) == pytest.approx(expected)


def test_an_estimate_needs_a_measured_preset() -> None:
    with pytest.raises(MizuotoError, match="no measured peak for preset 'lowest'"):
        estimate_mb(ROWS[:1], "lowest", 1_000_000, 1, False, "cpu")


def info(scales: bool) -> MethodInfo:
    return MethodInfo("m", "Test method", "demo", {}, ROWS[:3], batch_scales=scales)


def test_a_batch_size_below_one_is_refused() -> None:
    with pytest.raises(MizuotoError, match="batch_size must be at least 1"):
        estimate_mb(ROWS, "low", 1_000_000, 0, True, "cpu")


def test_memory_mb_gives_every_preset() -> None:
    assert info(False).memory_mb(2_000_000, 2, "cpu") == pytest.approx(
        {"default": 880.0, "low": 440.0, "lowest": 220.0})


def test_fit_advice_names_the_fastest_preset_that_fits() -> None:
    assert fit_advice(info(False), "default", 1_000_000, 2, 500.0, "cpu") is None  # 440 MB fits
    advice = fit_advice(info(False), "default", 2_000_000, 2, 500.0, "cpu")
    assert advice is not None and "needs about 880 MB" in advice and "training.memory=low fits (about 440 MB)" in advice


def test_fit_advice_names_the_largest_batch_when_no_preset_fits() -> None:
    advice = fit_advice(info(True), "default", 1_000_000, 8, 300.0, "cpu")  # lowest at 8: 440 MB
    assert advice is not None and "the largest batch that fits is batch_size=5 with training.memory=lowest" in advice
    none = fit_advice(info(False), "low", 10_000_000, 2, 300.0, "cpu")
    assert none is not None and "no preset fits" in none


# ---- memory/peak_mb (M63) ---------------------------------------------------------------------
PEAKS_IN_A_FRESH_PROCESS = """
import sys, torch
from mizuoto_runtime.app.training.meter import PeakMeter, current_rss
with PeakMeter(torch.device("cpu"), current_rss()) as held:
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MB, touched
    del block
with PeakMeter(torch.device("cpu"), current_rss()) as idle:
    pass
print(held.peak_mb, idle.peak_mb)
"""


def test_a_phase_peak_counts_what_the_phase_held() -> None:
    """In a process of its own, as a training job's worker is: a test process that freed memory
    earlier may hand the block pages it already holds, so its resident set would not grow."""
    out = subprocess.run([sys.executable, "-c", PEAKS_IN_A_FRESH_PROCESS], capture_output=True, text=True,
                         timeout=120, check=True, cwd=Path(__file__).resolve().parents[3])
    held, idle = (float(v) for v in out.stdout.split())
    assert 60 <= held < 200
    if sys.platform.startswith("linux"):  # the peak resets per phase there
        assert idle < 32
