"""M27: half precision without a float32 copy; clear errors for bad checkpoints."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from models import TinyLM
from mizuoto_runtime import CheckpointError, build_on_meta, load_safetensors


def write(tmp_path: Path, model: torch.nn.Module, name: str = "model.safetensors", drop: str = "",
          extra: dict | None = None) -> Path:
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight" and k != drop}
    state.update(extra or {})
    path = tmp_path / name
    save_file(state, str(path))
    return path


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_meta_then_copy_equals_load_then_convert(tmp_path: Path, dtype: torch.dtype) -> None:
    source = TinyLM(layers=2)
    path = write(tmp_path, source)
    model = load_safetensors(build_on_meta(lambda: TinyLM(layers=2), dtype), path)
    expected = TinyLM(layers=2)
    expected.load_state_dict(source.state_dict())
    expected = expected.to(dtype)
    for (name, a), (_, b) in zip(model.state_dict().items(), expected.state_dict().items()):
        assert a.dtype == dtype and torch.equal(a, b), name
    assert model.head.weight is model.embed.weight  # tied weights stay tied


def test_bf16_file_into_bf16_model(tmp_path: Path) -> None:
    source = TinyLM(layers=2).to(torch.bfloat16)
    path = write(tmp_path, source)
    model = load_safetensors(build_on_meta(lambda: TinyLM(layers=2), torch.bfloat16), path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), source.state_dict().values()))


def test_missing_unexpected_and_mismatched_tensors_are_named(tmp_path: Path) -> None:
    source = TinyLM(layers=2)
    path = write(tmp_path, source, drop="layers.1.up.weight", extra={
        "layers.9.extra": torch.zeros(2), "norm.weight": torch.zeros(3)})
    with pytest.raises(CheckpointError) as err:
        load_safetensors(build_on_meta(lambda: TinyLM(layers=2)), path)
    text = str(err.value)
    assert "missing layers.1.up.weight (1024, 256)" in text
    assert "unexpected layers.9.extra" in text
    assert "shape of norm.weight: checkpoint (3,), model (256,)" in text
    assert str(path) in text


def test_missing_file_and_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        load_safetensors(build_on_meta(TinyLM), tmp_path / "nope.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        load_safetensors(build_on_meta(TinyLM), bad)


def test_prefix_selects_a_component(tmp_path: Path) -> None:
    source = TinyLM(layers=1)
    state = {f"talker.{k}": v for k, v in source.state_dict().items() if k != "head.weight"}
    save_file(state, str(tmp_path / "all.safetensors"))
    model = load_safetensors(build_on_meta(lambda: TinyLM(layers=1)), tmp_path / "all.safetensors", prefix="talker.")
    assert torch.equal(model.layers[0].qkv.weight, source.layers[0].qkv.weight)


def test_demo_engine_loads_its_checkpoint_layout(tmp_path: Path) -> None:
    from mizuoto_runtime import Runtime
    from mizuoto_runtime.engines.demo import save_checkpoint

    save_checkpoint(tmp_path, seed=1234, dtype=torch.bfloat16)
    rt = Runtime()
    loaded = rt.engine("demo", tmp_path, "bfloat16")
    fresh = rt.engine("demo", None, "bfloat16")
    for a, b in zip(loaded.handles(), fresh.handles()):
        for (n, x), (_, y) in zip(a.module.state_dict().items(), b.module.state_dict().items()):
            assert x.dtype == torch.bfloat16 and torch.equal(x, y), n


def test_non_persistent_buffers_are_built_for_real(tmp_path: Path) -> None:
    class Rotary(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)
            self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)), persistent=False)

    source = Rotary()
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(tmp_path / "r.safetensors"))
    model = load_safetensors(build_on_meta(Rotary, torch.bfloat16), tmp_path / "r.safetensors")
    assert model.proj.weight.dtype == torch.bfloat16
    assert model.inv_freq.dtype == torch.float32 and torch.equal(model.inv_freq, source.inv_freq)
