"""Pinned host memory (M21, M22): budget, threshold, register vs copy, fallback, finalizer order.

The CPU has no page-locked memory, so a `RecordingRegistrar` stands for the CUDA runtime: the
logic runs as on a GPU, and every device call is recorded in order.
"""
from __future__ import annotations

import gc
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from mizuoto_runtime import DeviceService, ModelHandle, VramPolicy
from mizuoto_runtime.memory.pinning import (
    REGISTER_MIN_BYTES,
    PinnedBudget,
    Pinner,
    RecordingRegistrar,
    host_block_bytes,
    released_together,
    releases_deferred,
    shared_pinner,
)
from mizuoto_runtime.memory.streamer import Streamer
from mizuoto_runtime.memory.transfer import BufferedCopyEngine, SimulatedStreams

MB = 1 << 20


def pinner(mode: str = "register", limit: int = 64 * MB, fail: bool = False) -> Pinner:
    return Pinner(mode, RecordingRegistrar(fail=fail), PinnedBudget(limit))  # type: ignore[arg-type]


def ops(p: Pinner) -> list[str]:
    return [c[0] for c in p.registrar.calls]  # type: ignore[union-attr]


def big(nbytes: int = 2 * MB) -> torch.Tensor:
    return torch.randn(nbytes // 4)


def collect() -> None:
    gc.collect()


def test_budget_takes_and_gives() -> None:
    """M21: reservations fit under the limit or take nothing."""
    b = PinnedBudget(10)
    assert b.take(6) and not b.take(5) and b.used == 6 and b.free == 4
    b.give(6)
    assert b.used == 0 and b.take(10)


def test_large_storage_is_registered_in_place() -> None:
    """M22: a whole storage >= 1 MB is registered, no data copied, and counted in the budget."""
    p = pinner()
    host = big()
    (pinned,) = p.pin_streamed([host])
    assert pinned.data_ptr() == host.data_ptr() and torch.equal(pinned, host)
    assert p.is_pinned(pinned) and p.is_pinned(host)  # the same memory
    assert p.registrar.calls == [("register", hex(host.data_ptr()), str(2 * MB))]  # type: ignore[union-attr]
    assert p.pinned_bytes == 2 * MB


def test_whole_storage_registered_for_a_view() -> None:
    """M22: registrations cover whole storages (they cannot overlap), even for a view of one."""
    p = pinner()
    base = big(4 * MB)
    view = base[1024:2048]
    (pinned,) = p.pin_streamed([view])
    assert p.registrar.calls == [("register", hex(base.data_ptr()), str(4 * MB))]  # type: ignore[union-attr]
    assert pinned.data_ptr() == view.data_ptr() and torch.equal(pinned, view)


def test_small_streamed_tensor_is_copied_into_pinned_memory_with_its_strides() -> None:
    """M22: small streamed tensors share pages: copied into pinned memory, strides kept (M23)."""
    p = pinner()
    host = torch.randn(64, 32).t()  # transposed: not contiguous
    (pinned,) = p.pin_streamed([host])
    assert ops(p) == ["pinned_empty"]
    assert pinned.data_ptr() != host.data_ptr() and torch.equal(pinned, host)
    assert pinned.stride() == host.stride()
    assert p.is_pinned(pinned) and not p.is_pinned(host)
    assert p.pinned_bytes == host.numel() * 4


def test_small_kept_host_copy_stays_pageable() -> None:
    """M22: host copies of whole-loaded components are registered, never copied."""
    p = pinner()
    small = torch.randn(100)
    assert p.pin_kept([small])[0] is small and p.registrar.calls == []  # type: ignore[union-attr]
    large = big()
    assert p.pin_kept([large])[0] is not large and ops(p) == ["register"]


def test_beyond_the_budget_stays_pageable() -> None:
    """M21: beyond `compute.max_pinned_mb` host copies stay pageable."""
    p = pinner(limit=3 * MB)
    first, second = big(), big()
    out = p.pin_streamed([first, second])
    assert out[0] is not first and out[1] is second
    assert ops(p) == ["register"] and p.pinned_bytes == 2 * MB


def test_failed_registration_is_cleared_and_falls_back_to_pageable() -> None:
    """M22: a failed cudaHostRegister clears the error and leaves the tensor pageable."""
    p = pinner(fail=True)
    host = big()
    assert p.pin_streamed([host])[0] is host
    assert ops(p) == ["register", "clear_error"]
    assert p.pinned_bytes == 0 and not p.is_pinned(host)


def test_finalizer_waits_unregisters_before_the_memory_is_freed() -> None:
    """M22: when the storage dies: synchronize, unregister, and only then free the memory."""
    p = pinner()
    events = p.registrar.calls  # type: ignore[union-attr]
    memory = np.ones(MB // 2, dtype=np.float32) * 3  # 2 MB whose release we can observe
    weakref.finalize(memory, events.append, ("freed",))
    host = torch.from_numpy(memory)
    del memory
    (pinned,) = p.pin_streamed([host])
    del host
    param = nn.Parameter(torch.zeros(MB // 2))
    param.data = pinned  # param.data shares the storage without keeping `pinned` alive
    del pinned
    collect()
    assert ops(p) == ["register"], "still held through param.data"
    param.data = torch.zeros(1)
    collect()
    assert ops(p) == ["register", "synchronize", "unregister", "freed"]
    assert p.pinned_bytes == 0


def test_storage_shared_by_two_tensors_is_registered_once() -> None:
    """M22: one registration per storage; released when its last view dies."""
    p = pinner()
    base = big(4 * MB)
    a, b = base[:1000], base[5000:9000]
    pa, pb = p.pin_streamed([a, b])
    assert ops(p) == ["register"]
    again = p.pin_streamed([base])[0]  # the original storage again: the same registration
    assert ops(p) == ["register"] and again.data_ptr() == base.data_ptr()
    assert p.pin_streamed([pa])[0] is pa  # already re-homed: untouched
    del pa, again
    collect()
    assert "unregister" not in ops(p)
    del pb
    collect()
    assert ops(p)[-1] == "unregister" and p.pinned_bytes == 0


def test_release_during_graph_capture_is_deferred_until_flush() -> None:
    """M22/M24: no synchronization while a CUDA Graph is captured; the memory stays until flush."""
    p = pinner()
    (pinned,) = p.pin_streamed([big()])
    p.registrar.capture = True  # type: ignore[union-attr]
    del pinned
    collect()
    assert ops(p) == ["register"] and p.pinned_bytes == 2 * MB
    p.flush()
    assert ops(p) == ["register"], "still capturing"
    p.registrar.capture = False  # type: ignore[union-attr]
    p.flush()
    assert ops(p) == ["register", "synchronize", "unregister"] and p.pinned_bytes == 0


def test_release_waits_for_a_capture_on_another_thread() -> None:
    """M22/M24: global capture mode forbids synchronizing from any thread: defer then too."""
    p = pinner()
    (pinned,) = p.pin_streamed([big()])
    with releases_deferred():
        del pinned
        collect()
        p.flush()
        assert ops(p) == ["register"]
    p.flush()
    assert ops(p) == ["register", "synchronize", "unregister"]


def test_copy_mode_copies_streamed_and_leaves_kept_pageable() -> None:
    """M22 on ROCm and other devices: streamed weights copied into pinned memory, kept stay pageable."""
    p = pinner(mode="copy")
    host = big()
    (pinned,) = p.pin_streamed([host])
    assert ops(p) == ["pinned_empty"] and pinned.data_ptr() != host.data_ptr()
    assert p.pin_kept([host])[0] is host
    del pinned
    collect()
    # issue 27: the freed block leaves torch's host cache, where it would stay locked
    assert ops(p) == ["pinned_empty", "synchronize", "empty_host_cache"] and p.pinned_bytes == 0


def test_off_mode_and_cpu_are_no_ops() -> None:
    """M21: on CPU, the simulated device, XPU and MPS copies are synchronous: nothing is pinned."""
    off = Pinner("off")
    host = big()
    assert off.pin_streamed([host])[0] is host and not off.is_pinned(host)
    assert shared_pinner(torch.device("cpu"), simulated=True) is None
    assert shared_pinner(torch.device("cpu"), simulated=False) is None
    with pytest.raises(ValueError):
        Pinner("register")


class Wide(nn.Module):
    """Two units of >= 1 MB weights (registered) with small biases (copied)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(512, 600), nn.Linear(600, 512)) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return x


def _handle(p: Pinner, model: nn.Module, **settings: object) -> ModelHandle:
    devices = DeviceService(simulate={"cpu": 64 * MB}, strict=True)
    cpu = torch.device("cpu")
    streamer = Streamer(devices, cpu, BufferedCopyEngine(devices, cpu, SimulatedStreams(), p))
    policy = VramPolicy({f"compute.{k}": v for k, v in settings.items()})
    return ModelHandle(model, devices=devices, policy=policy, streamer=streamer)


def test_handle_pins_streamed_and_kept_host_copies_and_releases_them_on_unload() -> None:
    """M21/M22 through a handle: streamed units pinned, keep_host copies registered at load,
    every registration released when the handle unloads (finalizers), outputs unchanged."""
    p = pinner(limit=1 << 30)
    model, x = Wide(), torch.randn(4, 512)
    with torch.no_grad():
        expected = model(x)
    h = _handle(p, model, host_copies="on")
    h.load(h.min_working_set + h.units[0].nbytes)  # one unit resident (host kept), two streamed
    registered = [c for c in p.registrar.calls if c[0] == "register"]  # type: ignore[union-attr]
    assert len(registered) == 6  # the three units' 1.2 MB weights: streamed and kept alike
    assert all(int(c[2]) >= REGISTER_MIN_BYTES for c in registered)
    assert all(h.streamer.is_pinned(s.host) for u in h.streamed_units for s in u.slots)
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    h.unload()
    collect()
    unregistered = [c for c in p.registrar.calls if c[0] == "unregister"]  # type: ignore[union-attr]
    assert sorted(c[1] for c in unregistered) == sorted(c[1] for c in registered)
    assert p.pinned_bytes == 0


def test_pinned_budget_comes_from_the_policy() -> None:
    """M21: `compute.max_pinned_mb` bounds what a handle's placement pins."""
    p = pinner(limit=0)
    h = _handle(p, Wide(), max_pinned_mb=3)
    h.load(h.min_working_set)
    assert p.budget.limit == 3 * MB
    assert 0 < p.pinned_bytes <= 3 * MB


class OwnerPinned(RecordingRegistrar):
    """Memory its owner already page-locked (e.g. loaded with `pin_memory`)."""

    def __init__(self, pinned: torch.Tensor) -> None:
        super().__init__()
        self.ptr = pinned.untyped_storage().data_ptr()

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() == self.ptr


def test_memory_pinned_by_its_owner_is_used_as_is() -> None:
    """M21/M22: already page-locked memory counts as pinned and is not registered again."""
    host = big()
    p = Pinner("register", OwnerPinned(host), PinnedBudget(64 * MB))
    assert p.pin_streamed([host])[0] is host and p.registrar.calls == []  # type: ignore[union-attr]
    assert p.is_pinned(host) and p.pinned_bytes == 0


# ---- issue 27: what copy mode locks, and releases in one batch --------------------------------
class Outside:
    """Another accountant in the process (ComfyUI's, through `ComfyPins`): its running total."""

    def __init__(self) -> None:
        self.total = 0

    def free(self) -> int | None:
        return None

    def add(self, nbytes: int) -> None:
        self.total += nbytes


def test_host_block_bytes_follows_the_host_allocators_rounding() -> None:
    """torch's CachingHostAllocator rounds each pinned block up to a power of two."""
    assert [host_block_bytes(n) for n in (0, 1, 3, 4, 5, 4096, 4097)] == [0, 1, 4, 4, 8, 4096, 8192]
    assert host_block_bytes(24 * MB) == 32 * MB and host_block_bytes(32 * MB) == 32 * MB


def test_copy_mode_counts_what_the_host_allocator_locks_and_credits_it_back() -> None:
    """A 24 MB weight copied into pinned memory locks 32 MB: the budget and the outside total
    count 32 MB while held and exactly that comes back at release, after one device wait and
    one host-cache flush for all of them (the freed blocks would stay cached, still locked)."""
    outside = Outside()
    p = Pinner("copy", RecordingRegistrar(), PinnedBudget(1 << 30, outside))
    hosts = [torch.zeros(6 * MB), torch.zeros(3000, dtype=torch.uint8), torch.zeros(1000)]  # 24 MB, 3000, 4000 B
    pinned = p.pin_streamed(hosts)
    locked = 32 * MB + 4096 + 4096
    assert p.pinned_bytes == locked and outside.total == locked
    assert all(torch.equal(a, b) for a, b in zip(pinned, hosts))
    with released_together(p):
        del pinned
        collect()
        assert p.pinned_bytes == locked  # released at the block's end
    assert ops(p).count("synchronize") == 1 and ops(p).count("empty_host_cache") == 1
    assert p.pinned_bytes == 0 and outside.total == 0


def test_dropping_host_copies_waits_for_the_device_once() -> None:
    """M29: a whole component dropping its registered host copies releases them in one batch."""
    p = pinner(limit=1 << 30)
    h = _handle(p, Wide(), host_copies="on")
    h.load()
    assert h.is_whole and ops(p).count("register") == 6
    assert h.drop_host_copies() > 0
    collect()
    assert ops(p).count("unregister") == 6 and ops(p).count("synchronize") == 1
    assert p.pinned_bytes == 0



def test_a_checkpoint_files_pages_are_copied_not_registered(tmp_path: Path) -> None:
    """M22 with tensors kept as a checkpoint's pages (`memory.mapped`): neighbours share pages,
    so a streamed one is copied into pinned memory, and a kept host copy stays pageable."""
    from safetensors.torch import save_file

    from mizuoto_runtime.memory.mapped import file_backed
    from mizuoto_runtime.nn.loading import SafetensorsFile

    save_file({"w": torch.randn(REGISTER_MIN_BYTES // 2)}, str(tmp_path / "w.safetensors"))
    with SafetensorsFile(tmp_path / "w.safetensors") as f:
        host = f.view("w")
    assert file_backed(host) and host.numel() * 4 >= REGISTER_MIN_BYTES
    p = pinner()
    (kept,) = p.pin_kept([host])
    assert kept is host and ops(p) == []
    (pinned,) = p.pin_streamed([host])
    assert ops(p) == ["pinned_empty"] and pinned.data_ptr() != host.data_ptr() and torch.equal(pinned, host)
