"""Smaller stored weights (issue 36): fp8 / int8 Linear and Conv weights, stored small everywhere,
cast on the device in the forward; the choice per engine phase; pre-quantized fp8 checkpoints as
ComfyUI users share them; and one clear error for each bad input. M57 with the option on is in
`engines_native/streaming.py`."""
from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from mizuoto_runtime import Runtime
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines import Sampling, engine_class
from mizuoto_runtime.engines.demo.tiny import write as write_demo
from mizuoto_runtime.errors import ArgumentError, MizuotoError, SettingError
from mizuoto_runtime.memory import small_weights
from mizuoto_runtime.memory.devices import DeviceService
from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.memory.small_weights import PUBLISHED, is_stored_small, parse_weights, store_small

MB = 1 << 20
REFERENCE = Audio(torch.sin(torch.arange(8000) / 7.0).unsqueeze(0) * 0.3, 16000)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 256)
        self.norm = nn.LayerNorm(256)
        self.up = nn.Linear(256, 1024)
        self.conv = nn.Conv1d(1024, 256, 3, padding=1)
        self.head = nn.Linear(256, 64, bias=False)
        self.head.weight = self.embed.weight  # tied: stays as the embedding is

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.embed(tokens))
        x = self.conv(self.up(x).transpose(1, 2)).transpose(1, 2)
        return self.head(x)


def _block(dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    torch.manual_seed(0)
    return Block().to(dtype).eval()


@pytest.mark.parametrize(("choice", "stored", "tolerance"), [
    ("fp8_e4m3fn", torch.float8_e4m3fn, 0.08), ("fp8_e5m2", torch.float8_e5m2, 0.15), ("int8", torch.int8, 0.03)])
def test_linear_and_conv_weights_are_stored_small_and_compute_close(choice: str, stored: torch.dtype,
                                                                    tolerance: float) -> None:
    published, small = _block(), _block()
    size = ModelHandle(published, devices=DeviceService()).size_bytes
    assert store_small(small, choice) == 2  # up and conv; the tied head and the embedding stay
    assert small.up.weight.dtype == small.conv.weight.dtype == stored
    assert small.embed.weight.dtype == small.norm.weight.dtype == small.head.weight.dtype == torch.bfloat16
    assert small.head.weight is small.embed.weight
    handle = ModelHandle(small, devices=DeviceService())
    assert handle.weights == choice
    weights = 2 * (small.up.weight.numel() + small.conv.weight.numel())  # their bfloat16 bytes
    assert handle.size_bytes < size - weights // 2 * 0.98  # counted at their stored size
    tokens = torch.tensor([[1, 5, 9, 33, 2]])
    with torch.no_grad():
        expected, got = published(tokens).float(), small(tokens).float()
    assert got.dtype == expected.dtype and torch.isfinite(got).all()
    assert (got - expected).abs().mean() / expected.abs().mean() < tolerance


LAYERS = {
    "linear": (lambda: nn.Linear(48, 40), (3, 48)),
    "conv1d": (lambda: nn.Conv1d(48, 40, 3, padding=1), (2, 48, 9)),
    "conv2d": (lambda: nn.Conv2d(48, 40, 3, stride=2), (2, 48, 9, 9)),
    "conv_transpose1d": (lambda: nn.ConvTranspose1d(48, 40, 4, stride=2, padding=1), (2, 48, 9)),
    "conv_transpose2d": (lambda: nn.ConvTranspose2d(48, 40, 3, stride=2, output_padding=1), (2, 48, 5, 5)),
}


@pytest.mark.parametrize("choice", ["fp8_e4m3fn", "int8"])
@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_every_linear_and_conv_layer_computes_close_to_published(kind: str, choice: str) -> None:
    factory, shape = LAYERS[kind]
    torch.manual_seed(1)
    layer = factory()
    x = torch.randn(*shape)
    expected = layer(x)
    store_small(_behind_a_norm(layer), choice)
    assert layer.weight.dtype == small_weights.STORED[choice]
    got = layer(x)
    assert got.shape == expected.shape and (got - expected).abs().mean() / expected.abs().mean() < 0.05


def _behind_a_norm(layer: nn.Module) -> nn.Module:
    """`layer` in a model whose first parameter (the one code reads the model's dtype from, which
    stays as published) is a norm's."""
    return nn.Sequential(nn.LayerNorm(8), layer)


def test_the_parameter_code_reads_the_dtype_from_stays_as_published() -> None:
    alone = nn.Linear(8, 4)
    assert store_small(alone, "int8") == 0 and alone.weight.dtype == torch.float32
    model = _behind_a_norm(nn.Linear(8, 4))
    assert store_small(model, "int8") == 1 and model[1].weight.dtype == torch.int8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_cpus_e4m3_cast_is_torchs_for_every_value(dtype: torch.dtype) -> None:
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    finite = ~torch.isnan(codes.float())
    assert torch.equal(small_weights.e4m3_on_cpu(codes, dtype)[finite], codes.to(dtype)[finite])


@pytest.mark.parametrize("largest", [2000.0, 1e-3])
def test_fp8_weights_are_scaled_into_the_formats_range(largest: float) -> None:
    """Past float8_e4m3fn's 448 a weight would be NaN; at 0.02 and below most would be zero or
    subnormal: a per-tensor scale keeps both."""
    torch.manual_seed(0)
    layer = nn.Linear(64, 32)
    with torch.no_grad():
        layer.weight.mul_(largest / layer.weight.abs().max())
    x = torch.randn(3, 64)
    expected = layer(x) - layer.bias
    store_small(_behind_a_norm(layer), "fp8_e4m3fn")
    got = layer(x) - layer.bias
    assert layer.weight_scale is not None and torch.isfinite(got).all()
    assert (got - expected).abs().mean() / expected.abs().mean() < 0.05


def test_int8_linear_uses_torchs_weight_pack_matmul_on_a_cpu() -> None:
    layer = nn.Linear(32, 16).to(torch.bfloat16)
    store_small(_behind_a_norm(layer), "int8")
    x = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    assert layer.weight_scale is not None
    kernel = torch.ops.aten._weight_int8pack_mm(x.reshape(6, 32), layer.weight, layer.weight_scale)
    assert torch.equal(layer(x), (kernel + layer.bias).reshape(2, 3, 16))
    # a width the kernel does not take (not a multiple of 16) is dequantized, not a crash
    odd = nn.Linear(24, 8).to(torch.bfloat16)
    store_small(_behind_a_norm(odd), "int8")
    y = torch.randn(5, 24, dtype=torch.bfloat16)
    assert torch.equal(odd(y), F.linear(y, odd.weight.to(torch.bfloat16) * odd.weight_scale[:, None], odd.bias))
    # elsewhere (here: a float64 input, which the kernel does not take) the weight is dequantized
    wide = x.double()
    expected = wide @ (layer.weight.double() * layer.weight_scale.double()[:, None]).T + layer.bias.double()
    assert torch.equal(layer(wide), expected)


def test_one_choice_applies_to_every_phase_that_takes_it() -> None:
    demo = engine_class("demo")
    assert demo.weights_per_phase("fp8_e5m2") == {p: "fp8_e5m2" for p in ("voice_prompt", "generate", "decode")}
    # the decoder refuses int8: it stays as published
    assert demo.weights_per_phase("int8") == {"voice_prompt": "int8", "generate": "int8", "decode": PUBLISHED}
    assert demo.weights_per_phase(parse_weights("generate=int8")) == {
        "voice_prompt": PUBLISHED, "generate": "int8", "decode": PUBLISHED}


@pytest.mark.parametrize(("engine", "weights", "message"), [
    ("demo", "decode=int8", "the decode phase takes no int8 weights: its decoder's layers are too small"),
    ("demo", "talk=int8", "unknown phase 'talk'"),
    ("demo", "fp4", "weights must be one of"),
    ("demo", "generate=fp4", "weights for 'generate' must be one of"),
    ("demo", "generate int8", "weights must be one of"),
    ("dummy", "int8", "engine 'dummy' takes no int8 weights: its phases declare no smaller weights"),
])
def test_a_choice_an_engine_does_not_take_is_one_clear_error(engine: str, weights: str, message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        Runtime().engine(engine, weights=weights)


def test_fp8_halves_a_bfloat16_engines_host_and_streamed_bytes(caplog: pytest.LogCaptureFixture) -> None:
    """Stored small everywhere: host copies and streamed copies hold fp8's bytes (the embeddings
    and norms stay bfloat16)."""
    held, streamed = {}, {}
    for weights in (PUBLISHED, "fp8_e4m3fn"):
        rt = Runtime({"compute.simulate_vram_mb": 256, "compute.vram_mode": "none"})
        with caplog.at_level(logging.INFO, logger="mizuoto_runtime"):
            engine = rt.engine("demo", dtype="bfloat16", weights=weights)
        _, meta = rt.say(engine, "bytes fall", reference=REFERENCE, sampling=Sampling(seed=2))
        held[weights] = sum(h.describe()["host_bytes"] for h in engine.handles())
        streamed[weights] = meta["memory"]["streamed_mb"]
        lines = [c["line"] for c in meta["memory"]["request"]["components"]]
        models = [m["line"] for m in rt.describe()["models"]]
        said = "(weights stored as fp8_e4m3fn): "
        assert all((said in line) == (weights != PUBLISHED) for line in lines + models), lines + models
    assert held["fp8_e4m3fn"] <= 0.55 * held[PUBLISHED] and streamed["fp8_e4m3fn"] <= 0.55 * streamed[PUBLISHED]
    assert re.search(r"demo:talker: \d+ Linear and Conv weights stored as fp8_e4m3fn: [\d.]+ MB -> [\d.]+ MB",
                     caplog.text)


def test_the_setting_is_the_default_choice() -> None:
    engine = Runtime({"compute.weights": "fp8_e4m3fn"}).engine("demo")
    assert {h.weights for h in engine.handles()} == {"fp8_e4m3fn"}
    with pytest.raises(SettingError, match="compute.weights"):
        Runtime({"compute.weights": "fp16"})


def test_the_cli_takes_weights_and_says_them(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             caplog: pytest.LogCaptureFixture) -> None:
    import json

    assert main(["say", "small", "-o", str(tmp_path / "a.wav"), "--weights", "generate=fp8_e4m3fn,voice_prompt=int8",
                 "--voice", str(_reference_wav(tmp_path))]) == 0
    said = json.loads(capsys.readouterr().out)["applied"]["weights"]
    assert said == {"voice_prompt": "int8", "generate": "fp8_e4m3fn", "decode": PUBLISHED}
    assert main(["say", "small", "-o", str(tmp_path / "b.wav"), "--weights", "decode=int8"]) == 2
    assert "the decode phase takes no int8 weights" in caplog.text


def _reference_wav(tmp_path: Path) -> Path:
    from mizuoto_runtime.audio import write_wav

    path = tmp_path / "ref.wav"
    write_wav(path, REFERENCE)
    return path


# ---- pre-quantized fp8 checkpoints (ComfyUI's `scale_weight` / `weight_scale`) -------------------
def _fp8_demo(tmp_path: Path, scale_key: str = "scale_weight", scale_shape: tuple[int, ...] = ()) -> Path:
    """The demo's tiny checkpoint with its talker's Linear weights in float8_e4m3fn, each with a
    scale, as ComfyUI users share fp8 checkpoints."""
    folder = write_demo(tmp_path / "fp8")
    path = folder / "talker.safetensors"
    state = load_file(str(path))
    for name in [k for k in state if k.endswith(".weight") and state[k].dim() == 2 and "embed" not in k]:
        weight = state[name].float()
        scale = weight.abs().max() / 448.0
        state[name] = (weight / scale).to(torch.float8_e4m3fn)
        state[name.removesuffix(".weight") + "." + scale_key] = (
            scale.reshape(scale_shape) if scale_shape != (-1,) else scale.repeat(weight.shape[0] + 1))
    save_file(state, str(path))
    return folder


def _say(rt: Runtime, folder: Path | None, weights: str = PUBLISHED) -> tuple[torch.Tensor, dict]:
    engine = rt.engine("demo", folder, weights=weights)
    audio, meta = rt.say(engine, "pre-quantized", reference=REFERENCE, sampling=Sampling(seed=5))
    return audio.waveform, meta


@pytest.mark.parametrize("scale_key", ["scale_weight", "weight_scale"])
def test_an_fp8_checkpoint_loads_as_it_is_and_streams_exactly(tmp_path: Path, scale_key: str) -> None:
    folder = _fp8_demo(tmp_path, scale_key, (1,))
    plain, meta = _say(Runtime(), folder)
    talker = Runtime().engine("demo", folder).talker
    assert talker.weights == "fp8_e4m3fn" and all(
        m.weight.dtype == torch.float8_e4m3fn for m in talker.module.layers.modules() if is_stored_small(m))
    assert meta["applied"]["weights"]["generate"] == "fp8_e4m3fn"  # as published, and said
    published, _ = _say(Runtime(), write_demo(tmp_path / "published"))
    assert not torch.equal(plain, published)
    streamed, meta = _say(Runtime({"compute.simulate_vram_mb": 64, "compute.vram_mode": "none"}), folder)
    assert torch.equal(streamed, plain) and meta["memory"]["streamed_mb"] > 0


def test_an_fp8_checkpoint_loaded_as_another_choice_is_converted_once_and_said(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = _fp8_demo(tmp_path)
    with caplog.at_level(logging.INFO, logger="mizuoto_runtime"):
        engine = Runtime().engine("demo", folder, weights="int8")
    assert engine.talker.weights == "int8"
    assert re.search(r"demo:talker: \d+ layers stored as fp8_e4m3fn converted once to int8", caplog.text)


def test_a_scale_of_the_wrong_shape_is_one_clear_error(tmp_path: Path) -> None:
    folder = _fp8_demo(tmp_path, "scale_weight", (-1,))
    with pytest.raises(MizuotoError, match=r"^[\w.]+\.weight: its scale has shape \(\d+,\); a weight of "
                                           r"shape \(\d+, \d+\) takes one number or \d+ \(one per output channel\)$"):
        Runtime().engine("demo", folder)


def test_fp8_weights_on_a_device_without_fp8_are_one_clear_error(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(small_weights, "_fp8_works", lambda device, dtype: "no float8 kernels here")
    with pytest.raises(MizuotoError, match=r"demo:talker: fp8_e4m3fn weights cannot be used on cpu with torch .* "
                                           r"\(no float8 kernels here\); choose weights 'as published' or 'int8'"):
        Runtime().engine("demo", _fp8_demo(tmp_path))
    with pytest.raises(MizuotoError, match="fp8_e5m2 weights cannot be used"):
        Runtime().engine("demo", weights="fp8_e5m2")


@pytest.mark.usefixtures("one_torch_thread")
def test_a_lora_needs_the_weights_as_published(qwen3tts_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    """A LoRA's update is merged into the talker's weights as published; stored small, the
    talker refuses it before reading the file, with what to do."""
    from mizuoto_runtime.engines import LoraChoice

    lora = tmp_path / "voice.safetensors"
    lora.write_bytes(b"not read")
    engine = Runtime().engine("qwen3tts", qwen3tts_checkpoint("base"), weights="generate=int8")
    with pytest.raises(MizuotoError, match="the talker stores its weights as int8: load the engine with weights "
                                           "'as published' to use one"):
        engine.use_lora(LoraChoice(lora))
