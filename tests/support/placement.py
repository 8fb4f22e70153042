"""The placement invariants of `test_placement_properties.py` on one real model (issue 21, item 4):
a request running `call` on the strict simulated device at three sizes — the minimum working set,
the midpoint to the whole model, and one unit short of whole — and with `vram_mode = none` at the
minimum. Each run equals the plain run; the device never counts more than its size or than the
placement accounted for; resident bytes grow and streamed bytes shrink with the device; `none`
streams the most; after the request no copy is left and the device counts what the handle holds.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mizuoto_runtime import DeviceService
from mizuoto_runtime.memory.handle import Kind
from mizuoto_runtime.memory.manager import ModelManager, _footprint
from mizuoto_runtime.memory.policy import VramPolicy

CPU = torch.device("cpu")


def same(a: Any, b: Any) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)


@dataclasses.dataclass
class Run:
    resident: int
    streamed: int
    peak: int
    accounted: int


def run_on(factory: Callable[[], nn.Module], call: Callable[[nn.Module], Any], kind: Kind, size: int,
           expected: Any, mode: str = "normal") -> Run:
    torch.manual_seed(0)
    model = factory().eval()
    manager = ModelManager(DeviceService(simulate={"cpu": size}, strict=True), VramPolicy({"compute.vram_mode": mode}))
    h = manager.register(model, engine="real", name="model", kind=kind)
    ctx = manager.request()
    with ctx.use([h], 0, "call"):
        resident, accounted = h.loaded_bytes, _footprint(h)
        got = call(model)
    assert same(got, expected), f"{size} B ({mode}): differs from the plain run"
    assert not h._calls.units and all(h.streamer.users(h, u) == 0 for u in h.units)
    assert h.streamer.live_copies(h) == 0 and h.streamer.cached_bytes(h) == 0
    assert manager.devices.counted_bytes(CPU) == h.device_bytes
    return Run(resident, ctx.charge.streamed_bytes, manager.devices.peak_counted_bytes(CPU), accounted)


def check_three_sizes(factory: Callable[[], nn.Module], call: Callable[[nn.Module], Any], kind: Kind) -> list[int]:
    """The invariants at the three sizes; returns the sizes (bytes)."""
    torch.manual_seed(0)
    plain = factory().eval()
    expected = call(plain)
    probe = ModelManager(DeviceService(simulate={"cpu": 1 << 40}, strict=True)).register(
        factory(), engine="real", name="probe", kind=kind)
    need, whole = probe.min_working_set, probe.size_bytes
    short = whole - min(u.nbytes for u in probe.units)
    sizes = [need, (need + whole) // 2, short]
    assert sizes == sorted(sizes) and need < short, sizes
    runs = [run_on(factory, call, kind, size, expected) for size in sizes]
    for size, r in zip(sizes, runs):
        assert r.peak <= size and r.peak <= r.accounted, f"{size} B: peak {r.peak} B, accounted {r.accounted} B"
    assert [r.resident for r in runs] == sorted(r.resident for r in runs), [r.resident for r in runs]
    assert [r.streamed for r in runs] == sorted((r.streamed for r in runs), reverse=True), [r.streamed for r in runs]
    assert runs[-1].resident > runs[0].resident  # a larger device keeps more of it
    none = run_on(factory, call, kind, need, expected, mode="none")
    assert none.peak <= min(need, none.accounted)
    assert all(r.streamed <= none.streamed for r in runs), (none.streamed, [r.streamed for r in runs])
    return sizes
