"""Runtime: the host's object — engines built outside inference mode, allocator choice (M54)."""
from __future__ import annotations

import os

import pytest
import torch

from mizuoto_runtime import MizuotoError, Runtime
from mizuoto_runtime.engines import Sampling


def test_engine_built_inside_inference_mode_still_places() -> None:
    """ComfyUI runs nodes under inference mode; placing swaps parameter data, which inference
    tensors refuse. The runtime builds engines outside it."""
    rt = Runtime({"compute.simulate_vram_mb": 10})
    with torch.inference_mode():
        engine = rt.engine("demo")
        audio, meta = rt.say(engine, "inside inference mode", sampling=Sampling(seed=2))
    assert audio.waveform.numel() > 0 and meta["memory"]["streamed_mb"] > 0


def test_allocator_setting_after_torch_loaded_applies_from_the_next_start(monkeypatch: pytest.MonkeyPatch,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """M54, issue 27: torch read PYTORCH_CUDA_ALLOC_CONF when it loaded; a runtime made later does
    not write it (on torch 2.5-2.7 that aborts CUDA's start), says so once, and every request
    reports it in meta.applied."""
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    with caplog.at_level("WARNING", logger="mizuoto_runtime.memory.cuda_allocator"):
        rt = Runtime({"compute.cuda_allocator": "expandable"})
        engine = rt.engine("demo")
        _, meta = rt.say(engine, "one", sampling=Sampling(seed=1))
        _, again = rt.say(engine, "two", sampling=Sampling(seed=1))
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
    assert meta["applied"]["cuda_allocator"].startswith("expandable: applies from the next start")
    assert again["applied"]["cuda_allocator"] == meta["applied"]["cuda_allocator"]
    assert len([r for r in caplog.records if "applies from the next start" in r.getMessage()]) <= 1
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:native")
    rt = Runtime({"compute.cuda_allocator": "async"})
    _, meta = rt.say(rt.engine("demo"), "three", sampling=Sampling(seed=1))
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "backend:native"  # a value already set wins
    assert meta["applied"]["cuda_allocator"] == "async (PYTORCH_CUDA_ALLOC_CONF=backend:native)"


def test_engines_are_kept_per_folder_dtype_and_device() -> None:
    rt = Runtime()
    assert rt.engine("demo") is rt.engine("demo", None, "float32") is rt.engine("demo", None, "float32", "cpu")
    assert rt.engine("demo", None, "bfloat16") is not rt.engine("demo")
    assert rt.unload_engine("demo") and not rt.unload_engine("demo")


def test_the_engine_runs_on_the_device_it_was_given() -> None:
    rt = Runtime()
    engine = rt.engine("demo", device="cpu")
    assert engine.device == torch.device("cpu") and all(h.device == engine.device for h in engine.handles())
    with pytest.raises(MizuotoError, match=r"device 'cuda:7' is not available here; choose auto or one of cpu"):
        rt.engine("demo", device="cuda:7")
    with pytest.raises(MizuotoError, match="not a device name"):
        rt.engine("demo", device="gpu-please")
