"""ModelHandle: placement, hooks, yielding, host copies, strict misuse (M15–M17, M25–M28, M56)."""
from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

from mizuoto_runtime import DeviceService, MizuotoError, ModelHandle, StrictDeviceError, VramPolicy

from conftest import make_manager
from support.models import ConvVocoder, TinyLM

MB = 1 << 20
CPU = torch.device("cpu")


def lm_handle(devices: DeviceService, kind: str = "sequence", **kw: object) -> ModelHandle:
    return ModelHandle(TinyLM(layers=4), devices=devices, kind=kind, name="lm", **kw)  # type: ignore[arg-type]


def test_strict_component_used_outside_placement_raises(strict_device: DeviceService) -> None:
    h = lm_handle(strict_device)
    with pytest.raises(StrictDeviceError, match=r"lm\.embed\.weight .*not on the device"):
        h.module.step(torch.tensor([[1]]), [[] for _ in range(4)])


def test_strict_streamed_weight_read_outside_forward_raises(strict_device: DeviceService) -> None:
    h = lm_handle(strict_device)
    h.load(0)
    assert h.streamed_units
    with pytest.raises(StrictDeviceError, match=r"layers\.3\.up\.weight"):
        h.module.layers[3].up.weight.sum()
    h.module.norm.weight.sum()  # the fixed part is placed: readable
    assert h.module.layers[3].up.weight.shape == (1024, 256)  # metadata stays readable


def test_whole_placement_has_no_hooks_and_counts_bytes(strict_device: DeviceService) -> None:
    h = lm_handle(strict_device)
    h.load(None)
    assert h.is_whole and not h.has_hooks()
    assert strict_device.counted_bytes(CPU) == h.size_bytes == h.loaded_bytes
    h.offload()
    assert strict_device.counted_bytes(CPU) == 0 and h.loaded_bytes == 0


def test_sequence_keeps_first_layers_oneshot_keeps_largest(strict_device: DeviceService) -> None:
    h = lm_handle(strict_device)
    h.load(h.min_working_set + 2 * h.units[0].nbytes)
    assert [u.name for u in h.streamed_units] == ["layers.2", "layers.3"]  # M15: run order

    voc = ModelHandle(ConvVocoder(), devices=strict_device, kind="oneshot", name="voc")
    sizes = sorted((u.nbytes for u in voc.units), reverse=True)
    voc.load(voc.min_working_set + sizes[0])
    resident = [u for u in voc.units if u not in voc.streamed_units]
    assert [u.nbytes for u in resident] == [sizes[0]]  # M15: largest first


def test_hot_marks_come_first(strict_device: DeviceService) -> None:
    h = lm_handle(strict_device)
    h.mark(h.module.layers[3], "hot")
    h.load(h.min_working_set + h.units[0].nbytes)
    assert [u.name for u in h.units if u not in h.streamed_units] == ["layers.3"]


def test_fixed_mark_joins_the_fixed_part(strict_device: DeviceService) -> None:
    h = lm_handle(strict_device)
    h.mark(h.module.layers[0], "fixed")
    assert [u.name for u in h.units] == ["layers.1", "layers.2", "layers.3"]
    assert "layers.0.qkv.weight" in {s.name for s in h.plan.fixed}


def test_partially_unload_gives_units_back_in_reverse_placement_order(strict_device: DeviceService) -> None:
    h = lm_handle(strict_device)
    h.load(None)
    unit = h.units[0].nbytes
    freed = h.partially_unload(unit + 1)
    assert freed == 2 * unit  # two whole units: honest bytes
    assert [u.name for u in h.streamed_units] == ["layers.2", "layers.3"]
    assert h.has_hooks() and strict_device.counted_bytes(CPU) == h.loaded_bytes
    freed = h.partially_unload(10 * h.size_bytes)  # more than it holds: the whole component leaves
    assert h.loaded_bytes == 0 and strict_device.counted_bytes(CPU) == 0


def test_streamed_run_reuses_copies_and_counts_them(strict_device: DeviceService) -> None:
    plain = TinyLM(layers=4)
    h = ModelHandle(copy.deepcopy(plain), devices=strict_device, kind="sequence", name="lm")
    h.load(0)
    x = torch.tensor([[3, 4]])
    with torch.no_grad():
        assert torch.equal(h.module.step(x, [[] for _ in range(4)]), plain.step(x, [[] for _ in range(4)]))
    assert h.streamer.streamed_bytes == sum(u.nbytes for u in h.units)
    # one live copy for a sequence handle (M20): placement + one unit on the device
    assert strict_device.counted_bytes(CPU) == h.loaded_bytes + h.units[-1].nbytes


def test_leaf_entry_path_streams_without_the_unit_forward(strict_device: DeviceService) -> None:
    plain = TinyLM(layers=4)
    h = ModelHandle(copy.deepcopy(plain), devices=strict_device, kind="sequence", name="lm")
    h.load(0)
    x = torch.randn(1, 2, 256)
    with torch.no_grad():
        assert torch.equal(h.module.layers[2].up(x), plain.layers[2].up(x))  # M17: hooks on leaves


def test_exception_inside_forward_restores_the_streamed_state(strict_device: DeviceService) -> None:
    h = lm_handle(strict_device)
    h.load(0)
    with pytest.raises(RuntimeError):
        h.module.layers[1](torch.randn(1, 2, 7), [])  # wrong width: fails inside the unit
    with pytest.raises(StrictDeviceError):
        h.module.layers[1].qkv.weight.sum()  # back to absent: the copy did not leak


def test_budget_below_minimum_loads_at_the_minimum_and_says_so(strict_device: DeviceService,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """M7: trying at the minimum is the documented behaviour, said at INFO (not a WARNING: there
    is nothing for the user to act on)."""
    h = lm_handle(strict_device)
    with caplog.at_level(logging.INFO):
        h.load(1000)
    said = [r for r in caplog.records if "below the minimum working set" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]
    assert h.loaded_bytes == h.plan.fixed_bytes and len(h.streamed_units) == 4


def test_below_the_minimum_is_said_once_per_handle_and_request(caplog: pytest.LogCaptureFixture) -> None:
    """A long text's chunks place the same handle below its minimum phase after phase: one INFO
    line per handle and request, not one per phase; a new request says it again."""
    m = make_manager(16)
    lm = m.register(TinyLM(layers=4), engine="a", name="lm", kind="sequence")
    other = m.register(TinyLM(layers=2), engine="a", name="other", kind="sequence")
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            request = m.request()
            for _ in range(3):  # three chunks
                for handle in (lm, other):
                    with request.use([handle], 14 * MB, "chunk"):
                        assert handle.is_partial
    said = [r for r in caplog.records if "below the minimum working set" in r.getMessage()]
    assert ([(r.getMessage().split(":")[0], r.levelno) for r in said]
            == [("lm", logging.INFO), ("other", logging.INFO)] * 2)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_cap_bytes_limits_placement_until_it_leaves_the_device(strict_device: DeviceService) -> None:
    h = lm_handle(strict_device)
    h.cap_bytes = h.min_working_set + h.units[0].nbytes
    h.load(None)
    assert len(h.streamed_units) == 3
    h.offload()
    assert h.cap_bytes is None  # M40: kept only until the component leaves the device


def test_host_copies_off_frees_host_ram_and_copies_back() -> None:
    devices = DeviceService(simulate={"cpu": 64 * MB}, strict=True)
    plain = TinyLM(layers=2)
    h = ModelHandle(copy.deepcopy(plain), devices=devices, policy=VramPolicy({"compute.host_copies": "off"}),
                    kind="sequence", name="lm")
    h.load(None)
    assert all(s.host is None for s in h.plan.fixed + [s for u in h.units for s in u.slots] if not s.is_buffer)
    h.offload()  # nothing kept on the host: the weights are copied back
    for (name, p), (_, _q) in zip(plain.named_parameters(), h.module.named_parameters()):
        slot = next(s for s in h.plan.fixed + [s for u in h.units for s in u.slots] if s.name == name)
        assert torch.equal(slot.host, p), name


def test_host_copies_on_keep_host_tensors() -> None:
    devices = DeviceService(simulate={"cpu": 64 * MB}, strict=True)
    h = lm_handle(devices, policy=VramPolicy({"compute.host_copies": "on"}))
    h.load(None)
    assert all(s.host is not None for s in h.plan.fixed)


def test_replace_swaps_weights_through_the_handle(strict_device: DeviceService) -> None:
    h = lm_handle(strict_device)
    h.load(None)
    new = TinyLM(layers=4)
    expected = copy.deepcopy(new)
    h.replace(new)  # M28
    assert h.loaded_bytes == 0 and h.module is new
    h.load(0)
    x = torch.tensor([[1, 2]])
    with torch.no_grad():
        assert torch.equal(new.step(x, [[] for _ in range(4)]), expected.step(x, [[] for _ in range(4)]))


def test_unload_frees_everything_and_the_handle_is_spent(strict_device: DeviceService) -> None:
    h = lm_handle(strict_device)
    h.load(None)
    h.unload()  # M26
    assert strict_device.counted_bytes(CPU) == 0
    assert all(s.host is None for s in h.plan.fixed)
    with pytest.raises(MizuotoError, match="was unloaded"):
        h.load(None)


def test_pinned_to_cpu_subtree_never_moves(strict_device: DeviceService) -> None:
    lm = TinyLM(layers=3)
    DeviceService.pin_to_cpu(lm.layers[1])
    before = lm.layers[1].qkv.weight
    h = ModelHandle(lm, devices=strict_device, kind="sequence", name="lm")
    h.load(None)
    assert lm.layers[1].qkv.weight is before and not lm.layers[1].qkv.weight.is_meta
    assert h.size_bytes == sum(s.nbytes for s in h.plan.fixed) + sum(u.nbytes for u in h.units)


def test_plain_cpu_moves_nothing() -> None:
    lm = TinyLM(layers=2)
    ptr = lm.layers[0].qkv.weight.data_ptr()
    h = ModelHandle(lm, devices=DeviceService(), kind="sequence", name="lm")
    assert h.load(None) == 0 and h.loaded_bytes == 0  # M5
    assert lm.layers[0].qkv.weight.data_ptr() == ptr and not h.has_hooks()


def test_parameterless_module_places_trivially(strict_device: DeviceService) -> None:
    h = ModelHandle(nn.Sequential(nn.ReLU()), devices=strict_device, name="relu")
    h.load(None)
    assert h.size_bytes == 0 and h.is_whole and not h.has_hooks()
    assert torch.equal(h.module(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))
