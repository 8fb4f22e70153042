"""Bad arguments and requests: one clear error naming the thing, before any work (M7, M10, M16).

`DeviceService(simulate=...)` and a phase's `memory` are checked on entry; a request's text and
sampling are checked before its first phase, on every path (the runtime, an engine's own
`generate` as the nodes call it, and `mizuoto say`, which also checks its files before the
engine loads); a device smaller than a component's minimum working set ends in one line.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from mizuoto_runtime import (
    ArgumentError,
    DeviceService,
    DeviceTooSmallError,
    MizuotoError,
    ModelManager,
    Runtime,
    VramPolicy,
)
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.engines import Sampling

from conftest import MB
from support.models import TinyLM


# ---- arguments of runtime calls (M10) -----------------------------------------------------------
@pytest.mark.parametrize("simulate", [
    {"cpu": 1.5}, {"cpu": 64.0}, {"cpu": "64"}, {"cpu": -1}, {"cpu": 0}, {"cpu": True}, {"cpu": None},
    {"cpu": math.nan}, {"cpu": math.inf}, {"cuda": 64}, {"no such device": 64}, 64, [("cpu", 64)],
])
def test_a_bad_simulated_size_names_simulate(simulate: object) -> None:
    with pytest.raises(ValueError, match=r"^simulate") as err:
        DeviceService(simulate=simulate)  # type: ignore[arg-type]
    assert isinstance(err.value, MizuotoError)


def test_a_whole_number_of_bytes_simulates_a_device() -> None:
    import numpy as np

    assert DeviceService(simulate={"cpu": np.int64(8 * MB)}).total_bytes(torch.device("cpu")) == 8 * MB


def _manager(nbytes: int = 64 * MB, **settings: object) -> ModelManager:
    return ModelManager(DeviceService(simulate={"cpu": nbytes}, strict=True),
                        VramPolicy({f"compute.{k}": v for k, v in settings.items()}))


@pytest.mark.parametrize("memory", [-1, -0.5, math.nan, math.inf, -math.inf, "1 MB", None, True, torch.tensor(3)])
@pytest.mark.parametrize("entry", ["use", "run"])
def test_a_bad_working_memory_estimate_names_memory(memory: object, entry: str) -> None:
    m = _manager()
    h = m.register(TinyLM(layers=1), engine="eng", name="lm")
    ctx = m.request()
    with pytest.raises(ValueError, match=r"memory must be a finite number of bytes >= 0"):
        if entry == "use":
            with ctx.use([h], memory, "lm"):  # type: ignore[arg-type]
                pytest.fail("the block ran")
        else:
            ctx.run("lm", [h], lambda: pytest.fail("the phase ran"), memory)  # type: ignore[arg-type]
    assert m.devices.counted_bytes(torch.device("cpu")) == 0 and h.in_use == 0  # nothing placed or held


def test_float_and_numpy_estimates_are_numbers_of_bytes() -> None:
    import numpy as np

    m = _manager()
    h = m.register(TinyLM(layers=1), engine="eng", name="lm")
    for memory in (0, 1.5 * MB, np.int64(MB), np.float32(2.0)):
        assert m.request().run("lm", [h], lambda: "ok", memory) == "ok"  # type: ignore[arg-type]


# ---- requests (text, sampling) ------------------------------------------------------------------
BAD_REQUESTS = [
    ("", {}, "text is empty"),
    ("  \n\t ", {}, "text is empty"),
    ("hello", {"max_new_tokens": 0}, "max_new_tokens must be a whole number >= 1, got 0"),
    ("hello", {"max_new_tokens": -5}, "max_new_tokens must be a whole number >= 1, got -5"),
    ("hello", {"max_new_tokens": 2.5}, "max_new_tokens"),
    ("hello", {"temperature": math.nan}, "temperature must be a finite number >= 0"),
    ("hello", {"top_p": 1.5}, "top_p must be a finite number from 0 to 1"),
    ("hello", {"top_k": -1}, "top_k must be a whole number >= 0"),
    ("hello", {"repetition_penalty": 0.0}, "repetition_penalty must be a finite number > 0"),
]


@pytest.mark.parametrize("text, sampling, says", BAD_REQUESTS)
@pytest.mark.parametrize("engine_id", ["demo", "dummy"])
def test_a_bad_request_is_refused_before_any_phase(engine_id: str, text: str, sampling: dict, says: str) -> None:
    rt = Runtime({"compute.simulate_vram_mb": 64})
    engine = rt.engine(engine_id)
    reference = None
    if engine_id == "demo":  # the voice prompt would run first: it must not
        from mizuoto_runtime import Audio

        reference = Audio(torch.randn(1, 4096) * 0.1, 16000)
    with pytest.raises(ArgumentError, match=says):
        rt.say(engine, text, reference=reference, sampling=Sampling(**sampling))
    assert rt.manager.events == []  # nothing was placed


@pytest.mark.parametrize("text, sampling, says", BAD_REQUESTS)
def test_an_engines_own_generate_checks_the_request(text: str, sampling: dict, says: str) -> None:
    """The phase nodes call `engine.generate` directly; the base class checks it there too."""
    rt = Runtime({"compute.simulate_vram_mb": 64})
    engine = rt.engine("demo")
    ctx = rt.request()
    voice = engine.voice_prompt(ctx)
    with pytest.raises(ArgumentError, match=says):
        engine.generate(ctx, text, voice, Sampling(**sampling))
    assert rt.manager.events == []


def test_cli_refuses_a_bad_request_before_the_engine_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the engine was loaded")

    monkeypatch.setattr(Runtime, "engine", no_load)
    (tmp_path / "a_folder").mkdir()
    cases: list[tuple[list[str], str]] = [
        (["say", "   ", "-o", str(tmp_path / "x.wav")], "text is empty"),
        (["say", "hi", "--max-new-tokens", "0", "-o", str(tmp_path / "x.wav")], "max_new_tokens"),
        (["say", "hi", "-o", str(tmp_path / "missing" / "x.wav")],
         f"output folder {tmp_path / 'missing'} does not exist"),
        (["say", "hi", "-o", str(tmp_path / "a_folder")], "is a folder; give a file name"),
        (["say", "hi", "-o", str(tmp_path / "x.wav"), "--voice", str(tmp_path / "nope.wav")],
         f"reference file {tmp_path / 'nope.wav'} does not exist"),
        (["say", "hi", "-o", str(tmp_path / "x.wav"), "--voice", str(tmp_path / "a_folder")], "is not a file"),
    ]
    for argv, says in cases:
        caplog.clear()
        assert main(argv) == 2, argv
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(errors) == 1 and says in errors[0], (argv, errors)


# ---- a device below the minimum working set (M7, M16) -------------------------------------------
def test_a_device_below_the_minimum_working_set_is_one_line_naming_both_sizes(caplog: pytest.LogCaptureFixture) -> None:
    rt = Runtime({"compute.simulate_vram_mb": 1})
    engine = rt.engine("demo")
    need = engine.talker.min_working_set
    with caplog.at_level(logging.WARNING), pytest.raises(DeviceTooSmallError) as err:
        rt.say(engine, "hello")
    assert str(err.value) == f"talker needs at least {need / MB:.1f} MB on the device; the device has 1.0 MB"
    assert isinstance(err.value, torch.OutOfMemoryError)  # hosts' OOM handling still applies
    assert "retrying" not in caplog.text and rt.devices.counted_bytes(torch.device("cpu")) == 0


def test_cli_says_it_in_one_line(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    assert main(["say", "hello", "-o", str(tmp_path / "x.wav"), "--setting", "compute.simulate_vram_mb=1"]) == 2
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "needs at least" in lines[0] and "the device has 1.0 MB" in lines[0], lines
    assert not (tmp_path / "x.wav").exists()


@pytest.mark.parametrize("mode", ["normal", "low", "none"])
def test_a_device_of_exactly_the_minimum_working_set_still_runs(mode: str) -> None:
    """M7: the refusal is exact — the minimum working set is enough, one byte less is not."""
    probe = _manager()
    need = probe.register(TinyLM(), engine="eng", name="lm", kind="sequence").min_working_set
    for size, runs in ((need, True), (need - 1, False)):
        m = _manager(size, vram_mode=mode)
        h = m.register(TinyLM(), engine="eng", name="lm", kind="sequence")

        def step(h: object = h) -> torch.Tensor:
            with torch.no_grad():
                return h.module.step(torch.zeros(1, 4, dtype=torch.long), [[] for _ in h.module.layers])

        if runs:
            assert m.request().run("lm", [h], step, 0).shape == (1, 512)
        else:
            with pytest.raises(DeviceTooSmallError, match=rf"lm needs at least {need / MB:.1f} MB"):
                m.request().run("lm", [h], step, 0)


def test_a_phase_of_two_components_names_each() -> None:
    m = _manager(1 * MB)
    a = m.register(TinyLM(layers=1), engine="eng", name="codec_encoder")
    b = m.register(TinyLM(layers=1), engine="eng", name="speaker_encoder")
    with pytest.raises(DeviceTooSmallError, match=r"^codec_encoder and speaker_encoder needs at least .* MB on the "
                                                   r"device \(codec_encoder .* MB, speaker_encoder .* MB\); "
                                                   r"the device has 1\.0 MB$"):
        m.request().run("voice prompt", [a, b], lambda: None, 0)


def test_an_estimate_alone_never_refuses() -> None:
    """M7: working memory far beyond the device is still tried (the weights fit)."""
    m = _manager(64 * MB)
    h = m.register(TinyLM(layers=1), engine="eng", name="lm")
    assert m.request().run("lm", [h], lambda: "ran", 10 * 1024 * MB) == "ran"


def test_qwen3tts_requests_are_checked(qwen3tts_checkpoint: Callable[[str], Path]) -> None:
    """The engine a new user met it with: empty text used to run to max_new_tokens (148 s of noise)."""
    rt = Runtime({"compute.simulate_vram_mb": 1})
    engine = rt.engine("qwen3tts", qwen3tts_checkpoint("custom_voice"))
    ctx = rt.request()
    voice = engine.voice_prompt(ctx, speaker=engine.speakers[0])
    with pytest.raises(ArgumentError, match="text is empty"):
        engine.generate(ctx, " ", voice, Sampling(max_new_tokens=4))
    with pytest.raises(ArgumentError, match="max_new_tokens"):
        engine.generate(ctx, "hello", voice, Sampling(max_new_tokens=0))
    with pytest.raises(DeviceTooSmallError, match=r"^talker needs at least [\d.]+ MB on the device; "
                                                   r"the device has 1\.0 MB$"):
        engine.generate(ctx, "hello", voice, Sampling(max_new_tokens=4))
