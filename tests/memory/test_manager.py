"""ModelManager: phases place only their components; idle ones yield in M30 order, unit by unit;
components in use never yield; budgets, modes and the phase split (M4–M9, M30–M33, M50)."""
from __future__ import annotations

import pytest
import torch

from mizuoto_runtime import DeviceService, ModelManager, VramPolicy

from conftest import make_manager
from support.models import ConvVocoder, TinyLM

MB = 1 << 20
CPU = torch.device("cpu")


def lm(layers: int = 4, dim: int = 256) -> TinyLM:
    return TinyLM(layers=layers, dim=dim)


def yields(manager: ModelManager) -> list[str]:
    return [name for action, name, _ in manager.events if action == "yield"]


def test_a_phase_places_only_its_components() -> None:
    m = make_manager(64)
    a = m.register(lm(), engine="a", name="talker", kind="sequence")
    b = m.register(ConvVocoder(), engine="a", name="decoder")
    with m.request().use([a], 0, "talker"):
        assert a.is_whole and b.loaded_bytes == 0  # M1, M4
    assert m.devices.counted_bytes(CPU) == a.device_bytes


def test_idle_components_yield_in_m30_order_unit_by_unit() -> None:
    m = make_manager(48, **{})
    m.policy.update({"engines.b.pinned_models": ["pinned"]})
    pinned = m.register(lm(), engine="b", name="pinned", kind="sequence")
    old = m.register(lm(), engine="a", name="old", kind="sequence")
    partial = m.register(lm(), engine="a", name="partial", kind="sequence")
    newer = m.register(lm(), engine="a", name="newer", kind="sequence")
    for h in (pinned, old, newer):
        with m.request().use([h], 0, "p"):
            pass
    partial.load(partial.min_working_set + partial.units[0].nbytes)  # idle, partially loaded
    assert partial.is_partial and old.is_whole and pinned.is_whole and newer.is_whole
    m.events.clear()
    big = m.register(lm(layers=6, dim=320), engine="c", name="big", kind="sequence")
    with m.request().use([big], 0, "big"):
        pass
    # partial first, then unpinned least recently used first; the pinned one is not needed (M30)
    assert yields(m) == ["a:partial", "a:old", "a:newer"]
    assert big.is_whole and pinned.is_whole
    # unit by unit: the last yielder gave back only the units the deficit needed (M32)
    assert newer.is_partial and newer.loaded_bytes == newer.plan.fixed_bytes + 2 * newer.units[0].nbytes


def test_a_component_in_use_never_yields() -> None:
    m = make_manager(40)
    busy = m.register(lm(), engine="a", name="busy", kind="sequence")
    idle = m.register(lm(), engine="a", name="idle", kind="sequence")
    with m.request().use([idle], 0, "p"):
        pass
    with m.request().use([busy], 0, "running"):
        m.events.clear()
        other = m.register(lm(layers=6, dim=320), engine="b", name="other", kind="sequence")
        with m.request().use([other], 0, "p2"):
            assert busy.is_whole  # M31: in use by a request
            assert other.loaded_bytes > 0
        assert "a:busy" not in yields(m) and "a:idle" in yields(m)


def test_phase_split_smaller_whole_largest_streams() -> None:
    m = make_manager(28)
    small = m.register(ConvVocoder(), engine="a", name="small")
    large = m.register(lm(layers=6), engine="a", name="large", kind="sequence")
    ctx = m.request()
    with ctx.use([small, large], 1 * MB, "both"):
        assert small.is_whole and large.is_partial  # M33
    partial = ctx.meta["memory"]["partial"]
    assert set(partial) == {"a:large"}
    entry = partial["a:large"]
    assert entry["reason"] == "budget too small" and entry["mode"] == "normal"
    assert set(entry) == {"reason", "mode", "free_mb", "working_mb", "reserve_mb", "loaded_mb", "size_mb",
                          "gave_up_for"}
    assert entry["working_mb"] == 1.0 and entry["loaded_mb"] < entry["size_mb"]


@pytest.mark.parametrize("mode", ["none", "low", "normal", "high"])
def test_vram_modes(mode: str) -> None:
    m = make_manager(64, vram_mode=mode)
    h = m.register(lm(), engine="a", name="lm", kind="sequence")
    ctx = m.request()
    with ctx.use([h], 0, "p"):
        if mode in ("normal", "high"):
            assert h.is_whole
        elif mode == "none":
            assert len(h.streamed_units) == len(h.units)
        else:
            assert h.is_partial
    partial = ctx.meta["memory"]["partial"]
    if mode in ("none", "low"):
        assert partial["a:lm"]["reason"] == f"vram_mode {mode}"  # M9: the reason names the mode
    else:
        assert partial == {}


def test_shared_mode_yields_whole_components() -> None:
    m = make_manager(24, vram_mode="shared")
    idle = m.register(lm(), engine="a", name="idle", kind="sequence")
    with m.request().use([idle], 0, "p"):
        pass
    other = m.register(lm(layers=5), engine="a", name="other", kind="sequence")
    with m.request().use([other], 0, "p"):
        pass
    assert idle.loaded_bytes == 0  # M32: moved whole, not unit by unit


def test_high_mode_tries_whole_even_when_the_estimate_says_no() -> None:
    m = make_manager(20, vram_mode="high")
    h = m.register(lm(), engine="a", name="lm", kind="sequence")
    with m.request().use([h], 50 * MB, "p"):  # the estimate never refuses (M7)
        assert h.is_whole


def test_vram_limit_caps_the_budget() -> None:
    m = make_manager(256, vram_limit_mb=8)
    h = m.register(lm(), engine="a", name="lm", kind="sequence")
    with m.request().use([h], 0, "p"):
        assert h.is_partial and h.device_bytes <= 8 * MB


def test_working_memory_and_reserve_shrink_the_budget() -> None:
    m = make_manager(20, vram_reserve_mb=4)
    h = m.register(lm(), engine="a", name="lm", kind="sequence")
    with m.request().use([h], 4 * MB, "p") as placements:
        assert h.is_partial
        assert h.device_bytes <= 20 * MB - 8 * MB
    assert placements[0].reserve_bytes == 4 * MB and placements[0].working_bytes == 4 * MB


def test_plain_cpu_counts_nothing() -> None:
    m = ModelManager(DeviceService(), VramPolicy())
    h = m.register(lm(), engine="a", name="lm", kind="sequence")
    ctx = m.request()
    with ctx.use([h], 10 * MB, "p"):
        assert h.loaded_bytes == 0 and not h.has_hooks()  # M5
    memory = ctx.meta["memory"]
    assert memory["loaded_mb"] == memory["size_mb"] > 0 and memory["partial"] == {} and memory["streamed_mb"] == 0


def test_yielder_reports_who_it_gave_up_for() -> None:
    m = make_manager(24)
    first = m.register(lm(), engine="a", name="first", kind="sequence")
    second = m.register(lm(layers=5), engine="a", name="second", kind="sequence")
    ctx = m.request()
    with ctx.use([first], 0, "one"):
        pass
    with ctx.use([second], 0, "two"):
        pass
    entry = ctx.meta["memory"]["partial"]["a:first"]
    assert entry["reason"] == "yielded for another component" and entry["gave_up_for"] == ["a:second"]
