"""RuntimeService: resident-model limit, idle unloading, RAM relief, release after OOM (M29, M34)."""
from __future__ import annotations

import time

import pytest
import torch

from mizuoto_runtime import OomInjector, Runtime
from mizuoto_runtime.engines import Sampling

CPU = torch.device("cpu")


def runtime(**settings: object) -> Runtime:
    return Runtime({"compute.simulate_vram_mb": 64, **{f"compute.{k}": v for k, v in settings.items()}})


def test_at_most_max_resident_models_stay_loaded() -> None:
    rt = runtime(max_resident_models=1)
    demo = rt.engine("demo")
    rt.say(demo, "one")
    dummy = rt.engine("dummy")  # the least recently used one goes
    assert len(rt.service) == 1 and all(h.unloaded for h in demo.handles())
    assert rt.engine("dummy") is dummy and not dummy.handles()[0].unloaded


def test_engines_in_use_or_pinned_are_kept() -> None:
    rt = runtime(max_resident_models=1)
    rt.policy.update({"engines.demo.pinned_models": ["talker"]})
    demo = rt.engine("demo")
    rt.engine("dummy")
    assert not any(h.unloaded for h in demo.handles()) and len(rt.service) == 2
    rt.policy.update({"engines.demo.pinned_models": []})
    dummy = rt.engine("dummy")
    with rt.request().use(dummy.handles(), 0, "busy"):
        rt.engine("demo", None, "bfloat16")  # over the limit: the idle, unpinned demo goes
    assert all(h.unloaded for h in demo.handles())
    assert not dummy.handles()[0].unloaded and len(rt.service) == 2  # in use: kept


def test_idle_engines_unload_after_the_set_minutes() -> None:
    rt = runtime(unload_after_minutes=1)
    demo = rt.engine("demo")
    assert rt.service.unload_idle() == []
    gone = rt.service.unload_idle(now=time.monotonic() + 61)
    assert gone == [("demo", "", "torch.float32", "cpu", "as published")] and all(h.unloaded for h in demo.handles())


def test_low_ram_drops_host_copies_first_then_unloads_idle_engines() -> None:
    rt = runtime()
    demo = rt.engine("demo")
    rt.say(demo, "placed whole")
    rt.policy.update({"compute.ram_reserve_mb": 1})
    decoder = demo.decoder
    assert decoder.is_whole and all(s.host is not None for s in decoder.plan.fixed)

    calls = []

    def free_after_drop() -> int:
        calls.append(1)
        return 2 << 20 if len(calls) > 1 else 0  # host copies dropped: RAM is back above the reserve

    rt.service.free_ram = free_after_drop
    released = rt.service.relieve_ram()
    assert released > 0 and not any(h.unloaded for h in demo.handles())
    assert all(s.host is None for s in decoder.plan.fixed if not s.is_buffer)
    decoder.offload()  # VRAM held the only copy: moving it off copies back
    assert all(s.host is not None for s in decoder.plan.fixed)

    rt.service.free_ram = lambda: 0  # still short: idle engines are unloaded
    rt.service.relieve_ram()
    assert all(h.unloaded for h in demo.handles()) and len(rt.service) == 0


def test_a_failed_job_moves_idle_components_off_every_device() -> None:
    rt = runtime()
    other = rt.engine("dummy")
    rt.say(other, "resident")
    assert other.handles()[0].device_bytes > 0
    demo = rt.engine("demo")
    rt.devices.fault_hook = OomInjector(at=list(range(1, 100_000)))
    with pytest.raises(torch.OutOfMemoryError):
        rt.say(demo, "fails", sampling=Sampling(seed=1))
    assert rt.devices.counted_bytes(CPU) == 0  # M34: ComfyUI's unload_all_models


def test_release_device_moves_idle_components_off() -> None:
    rt = runtime()
    demo = rt.engine("demo")
    rt.say(demo, "placed")
    assert rt.devices.counted_bytes(CPU) > 0
    assert rt.service.release_device(CPU) > 0 and rt.devices.counted_bytes(CPU) == 0


def test_ram_relief_between_phases_never_unloads_an_engine_another_request_is_serving() -> None:
    """M29 with two requests: one request's RAM relief, run while another request on the same
    engine is between its phases, keeps that engine (it would otherwise be unloaded under it)."""
    rt = runtime()
    demo = rt.engine("demo")
    rt.policy.update({"compute.ram_reserve_mb": 1})
    rt.service.free_ram = lambda: 0  # always short of RAM
    voice_prompt = demo.voice_prompt
    relieved: list[bool] = []

    def then_another_request_ends(*args: object, **kwargs: object) -> object:
        voice = voice_prompt(*args, **kwargs)
        rt.service.relieve_ram()  # what another request's end does, between this one's phases
        relieved.append(not any(h.unloaded for h in demo.handles()))
        return voice

    demo.voice_prompt = then_another_request_ends  # type: ignore[method-assign]
    audio, _ = rt.say(demo, "between phases", sampling=Sampling(seed=3, max_new_tokens=8))
    assert relieved == [True] and audio.waveform.numel() > 0
    assert all(h.unloaded for h in demo.handles())  # its own end relieves RAM: idle now, it goes
