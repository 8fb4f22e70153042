"""Phases: exact OOM retry, caps, fallback, `use` not retried (M2–M3, M40–M43)."""
from __future__ import annotations

import logging

import pytest
import torch

from mizuoto_runtime import OomInjector, Runtime
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines import Sampling

from conftest import make_manager
from support.models import TinyLM
from support.oom import allocations_during

MB = 1 << 20
REFERENCE = Audio(torch.cos(torch.arange(4000) / 5.0).unsqueeze(0) * 0.2, 16000)


def demo_runtime(**settings: object) -> Runtime:
    return Runtime({"compute.simulate_vram_mb": 14, **{f"compute.{k}": v for k, v in settings.items()}})


def say(rt: Runtime, seed: int = 5) -> tuple[torch.Tensor, dict]:
    engine = rt.engine("demo")
    # 24 frames: the decoder's working memory (M45: its measured peak, ~0.1 MB a frame) leaves the
    # capped talker on the 14 MB device, so the cap is still there for the next request.
    audio, meta = rt.say(engine, "exact retry", reference=REFERENCE, sampling=Sampling(seed=seed, max_new_tokens=24))
    return audio.waveform, meta


def talker_allocations() -> list[int]:
    """Which counted allocations of a fresh run happen inside the talker phase."""
    rt = demo_runtime()
    with allocations_during(rt, rt.engine("demo"), "generate") as inside:
        say(rt)
    return inside


def test_oom_in_a_phase_is_retried_exactly_and_the_cap_persists(caplog: pytest.LogCaptureFixture) -> None:
    expected, _ = say(demo_runtime())
    inside = talker_allocations()
    assert len(inside) > 10  # the talker streams: copies happen while it runs
    rt = demo_runtime()
    injector = OomInjector(at=inside[len(inside) // 2])  # mid-generation, during a streamed copy
    rt.devices.fault_hook = injector
    with caplog.at_level(logging.WARNING):
        got, meta = say(rt)
    assert injector.raised == 1
    assert torch.equal(got, expected)  # M40: same random numbers, same result
    assert meta["applied"]["oom_retries"] == 1 and "retrying exactly" in caplog.text
    talker = rt.engine("demo").talker
    assert talker.cap_bytes is not None
    assert talker.device_bytes <= max(talker.cap_bytes, talker.min_working_set)  # M7: never below the minimum
    assert meta["memory"]["partial"]["demo:talker"]["reason"] in ("capped after OOM", "yielded for another component")
    # the cap persists for the next request while the talker stays on the device
    rt.devices.fault_hook = None
    again, meta2 = say(rt)
    assert torch.equal(again, expected) and meta2["applied"]["oom_retries"] == 0


def test_third_failure_surfaces_the_original_error() -> None:
    rt = demo_runtime()
    say(rt)  # components are known; now every allocation fails
    rt.devices.fault_hook = OomInjector(at=list(range(1, 10_000)))
    with pytest.raises(torch.OutOfMemoryError, match="injected OOM"):
        say(rt, seed=6)


def test_use_phases_are_not_retried() -> None:
    m = make_manager(64)
    h = m.register(TinyLM(), engine="a", name="lm", kind="sequence")
    injector = OomInjector(at=1)
    m.devices.fault_hook = injector
    calls = []
    with pytest.raises(torch.OutOfMemoryError):
        with m.request().use([h], 0, "gen"):  # M41
            calls.append(1)
    assert injector.count == 1 and calls == [] and h.in_use == 0


def test_run_restores_every_generator_before_retrying() -> None:
    m = make_manager(64)
    h = m.register(TinyLM(), engine="a", name="lm", kind="sequence")
    named = torch.Generator().manual_seed(9)
    ctx = m.request(generator=torch.Generator().manual_seed(8))
    draws: list[tuple[float, float, float]] = []

    def fn() -> None:
        draws.append((torch.rand(1, generator=ctx.generator).item(), torch.rand(1, generator=named).item(),
                      torch.rand(1).item()))
        if len(draws) < 3:
            raise torch.OutOfMemoryError("simulated failure inside the phase")

    ctx.run("gen", [h], fn, generators=[named])
    assert len(draws) == 3 and draws[0] == draws[1] == draws[2]
    assert ctx.meta["applied"]["oom_retries"] == 2


def test_fallback_is_used_only_when_enabled(caplog: pytest.LogCaptureFixture) -> None:
    for enabled in (False, True):
        m = make_manager(64, oom_fallback=enabled)
        h = m.register(TinyLM(), engine="a", name="dec", kind="oneshot")
        ctx = m.request()

        def fails() -> str:
            raise torch.OutOfMemoryError("always")

        if not enabled:
            with pytest.raises(torch.OutOfMemoryError):
                ctx.run("decode", [h], fails, fallback=("tiled_1d", lambda: "tiled"))
            assert ctx.meta["applied"]["fallbacks"] == []
            continue
        with caplog.at_level(logging.WARNING):
            assert ctx.run("decode", [h], fails, fallback=("tiled_1d", lambda: "tiled")) == "tiled"
        assert ctx.meta["applied"]["fallbacks"] == ["tiled_1d"]  # M42: named in the output
        assert "using fallback 'tiled_1d'" in caplog.text


def test_a_caller_switch_overrides_the_setting() -> None:
    """M44: a node's toggle allows the fallback whatever `compute.oom_fallback` says, and can refuse it."""
    for setting, switch, used in ((False, True, True), (True, False, False), (True, None, True)):
        m = make_manager(64, oom_fallback=setting)
        h = m.register(TinyLM(), engine="a", name="dec", kind="oneshot")

        def fails() -> str:
            raise torch.OutOfMemoryError("always")

        ctx = m.request()
        if used:
            assert ctx.run("decode", [h], fails, fallback=("tiled_1d", lambda: "t"), allow_fallback=switch) == "t"
        else:
            with pytest.raises(torch.OutOfMemoryError):
                ctx.run("decode", [h], fails, fallback=("tiled_1d", lambda: "t"), allow_fallback=switch)


def test_demo_decoder_fallback_through_the_runtime() -> None:
    rt = demo_runtime(oom_fallback=True)
    engine = rt.engine("demo")
    ctx = rt.request(seed=1)
    voice = engine.voice_prompt(ctx, REFERENCE)
    codes = engine.generate(ctx, "fallback", voice, Sampling(seed=1))
    rt.devices.fault_hook = OomInjector(at=[1, 2, 3])  # the three whole-decode attempts fail at placement
    audio = engine.decode(ctx, codes, allow_fallback=True)
    assert ctx.meta["applied"]["fallbacks"] == ["tiled_1d"] and ctx.meta["applied"]["oom_retries"] == 2
    assert audio.waveform.shape[-1] == codes.tokens.shape[-1] * 256


def test_oom_retry_can_be_switched_off() -> None:
    m = make_manager(64, oom_retry=False)
    h = m.register(TinyLM(), engine="a", name="lm", kind="sequence")
    calls = []

    def fn() -> None:
        calls.append(1)
        raise torch.OutOfMemoryError("no retry")

    with pytest.raises(torch.OutOfMemoryError):
        m.request().run("gen", [h], fn)
    assert calls == [1]


def test_cached_voice_never_places_the_voice_prompt_components() -> None:
    rt = demo_runtime()
    engine = rt.engine("demo")
    say(rt)
    rt.manager.events.clear()
    say(rt, seed=9)
    placed = {name for action, name, _ in rt.manager.events if action == "place"}
    assert "demo:speaker_encoder" not in placed and placed == {"demo:talker", "demo:decoder"}  # M4
    assert engine.voices


def test_the_voice_cache_keeps_the_most_recent_voices(monkeypatch: pytest.MonkeyPatch) -> None:
    """M4 within a bound: a session prompting many references keeps the last VOICES_KEPT, and a
    dropped voice is prompted (its encoder placed) again."""
    from mizuoto_runtime.engines import base

    monkeypatch.setattr(base, "VOICES_KEPT", 2)
    rt = demo_runtime()
    engine = rt.engine("demo")
    references = [Audio(REFERENCE.waveform * (1 + i / 10), 16000) for i in range(3)]

    def prompt(reference: Audio) -> set[str]:
        rt.manager.events.clear()
        rt.say(engine, "hi", reference=reference, sampling=Sampling(seed=1, max_new_tokens=4))
        return {name for action, name, _ in rt.manager.events if action == "place"}

    for reference in references:
        assert "demo:speaker_encoder" in prompt(reference)
    assert len(engine.voices) == 2
    assert "demo:speaker_encoder" not in prompt(references[2])  # still kept
    assert "demo:speaker_encoder" in prompt(references[0])  # dropped, prompted again
