"""Copies and prefetch (M18–M21, M23) through the CUDA engine's code, run on the CPU.

`BufferedCopyEngine` is the engine used on CUDA and ROCm; here it runs on the simulated
device with `SimulatedStreams`, which log every event record and wait, so the tests check
both the results (identical to resident) and the event protocol that guards the static copy
buffers on a GPU.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from mizuoto_runtime import DeviceService, ModelHandle, OomInjector, VramPolicy
from mizuoto_runtime.errors import CancelledError
from mizuoto_runtime.memory import transfer
from mizuoto_runtime.memory.pinning import PinnedBudget, Pinner, RecordingRegistrar
from mizuoto_runtime.memory.streamer import StreamCharge, Streamer, charging
from mizuoto_runtime.memory.transfer import ALIGN, BufferedCopyEngine, SimulatedStreams, ThreadStreams, make_copy_engine

from support.models import ConvVocoder, TinyDiT, TinyGPT2, TinyLM

MB = 1 << 20
CPU = torch.device("cpu")
Log = list[tuple[str, int, str]]


def handle(model: nn.Module, *, pinned: bool = True, kind: str = "oneshot", strict: bool = True,
           **settings: object) -> tuple[ModelHandle, BufferedCopyEngine, Log]:
    devices = DeviceService(simulate={"cpu": 256 * MB}, strict=strict)
    log: Log = []
    pinner = Pinner("register", RecordingRegistrar(), PinnedBudget(1 << 30)) if pinned else None
    engine = BufferedCopyEngine(devices, CPU, SimulatedStreams(log), pinner)
    policy = VramPolicy({f"compute.{k}": v for k, v in settings.items()})
    h = ModelHandle(model, devices=devices, policy=policy, streamer=Streamer(devices, CPU, engine),
                    kind=kind)  # type: ignore[arg-type]
    return h, engine, log


def dit_run(model: TinyDiT) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return model.sample(torch.randn(2, 8, 192, generator=g), torch.tensor([1, 2]))


def check_event_protocol(log: Log) -> None:
    """The guards of M19 on a GPU: a buffer is written on the copy stream only after the wait
    for its last use, and used on the compute stream only after the wait for its copy."""
    last: dict[int, str] = {}  # event -> stream of its latest record
    waited: dict[int, set[str]] = {}  # event -> streams that waited on that record
    for op, event, stream in log:
        if op == "wait":
            waited.setdefault(event, set()).add(stream)
            continue
        previous = last.get(event)
        if previous is not None and previous != stream:
            assert stream in waited.get(event, set()), f"{stream} touched buffer {event} without waiting"
        last[event], waited[event] = stream, set()


def test_streamed_dit_is_exact_and_prefetches_on_the_side_stream() -> None:
    """M18/M19: all units streamed, copies ahead on the side stream, output == resident."""
    model = TinyDiT()
    expected = dit_run(model)
    h, engine, log = handle(model)
    h.load(h.min_working_set)
    assert len(h.streamed_units) == len(h.units)
    assert torch.equal(dit_run(model), expected)
    assert any(stream == "copy" for _, _, stream in log), "nothing was prefetched"
    check_event_protocol(log)
    # M18: capacity = async_offload + 1 copies; the pool holds that many equal buffers, reused.
    pool = engine._pools[id(h)]
    assert len(pool.buffers) == h.copies == 2
    assert h.streamer.cached_bytes(h) == sum(b.nbytes for b in pool.buffers) <= pool.limit
    # CFG halves reuse the running copy (M18): each block is copied once per velocity call,
    # plus the last block's prefetch of block 0 for a next step that does not come.
    unit, copies = h.units[0].nbytes, 3 * len(h.units)
    assert copies * unit <= h.streamer.streamed_bytes <= (copies + 1) * unit


def test_buffers_are_reused_not_reallocated() -> None:
    """Static buffers (transfer.py): after the first pass, a step allocates nothing."""
    model = TinyDiT()
    h, engine, _ = handle(model)
    h.load(h.min_working_set)
    dit_run(model)
    buffers = list(engine._pools[id(h)].buffers)
    dit_run(model)
    assert engine._pools[id(h)].buffers == buffers


def test_units_of_one_shape_share_one_layout_and_one_set_of_views() -> None:
    """Nothing is made per step (issue 13): units of one shape share one layout object, kept
    across placements, and each buffer's views of it are made once; every copy of a step
    writes into those same tensors."""
    model = TinyLM(layers=4)
    h, engine, _ = handle(model, pinned=False, kind="sequence")
    h.load(h.min_working_set)
    pool = engine._pools[id(h)]
    layouts = {id(pool.layouts[u.index]) for u in h.streamed_units}
    assert len(h.streamed_units) == 4 and len(layouts) == 1
    seen: list[int] = []
    for unit in h.streamed_units * 2:
        lease = engine.copy_unit(id(h), unit, ahead=False)
        assert all(torch.equal(t, s.host) for t, s in zip(lease.tensors, unit.slots))
        seen.append(id(lease.tensors[0]))
        engine.free(id(h), lease)
    assert len(set(seen)) == 1 and len(pool.buffers) == 1 and len(pool.buffers[0].views) == 1
    before = dict(pool.layouts)
    engine.placed(id(h), model, h.streamed_units, [], h.copies, 0)  # placed again: same objects
    assert all(pool.layouts[i] is layout for i, layout in before.items())


def test_pageable_units_are_copied_on_the_spot_without_side_stream() -> None:
    """M21: beyond the pinned budget copies are synchronous: no prefetch, still exact."""
    model = TinyDiT()
    expected = dit_run(model)
    h, _, log = handle(model, pinned=False)
    h.load(h.min_working_set)
    assert torch.equal(dit_run(model), expected)
    assert all(stream == "compute" for _, _, stream in log)
    check_event_protocol(log)


def test_sequence_handle_keeps_one_copy_and_never_prefetches() -> None:
    """M20: a sequence handle has a single copy buffer and copies no unit ahead: each unit is
    copied once per token, when it is entered — its later leaves on the side stream (M17)."""
    model = TinyLM(dim=512, layers=2)
    prompt = torch.tensor([[1, 2, 3]])
    expected = model.generate(prompt, 4, torch.Generator().manual_seed(0))
    h, engine, log = handle(model, kind="sequence")
    h.load(h.min_working_set)
    assert torch.equal(model.generate(prompt, 4, torch.Generator().manual_seed(0)), expected)
    assert len(engine._pools[id(h)].buffers) == 1
    assert h.streamer.streamed_bytes_of(h) == 4 * sum(u.nbytes for u in h.units)
    assert any(stream == "copy" for _, _, stream in log)
    check_event_protocol(log)


def test_out_of_order_unit_is_copied_on_the_spot() -> None:
    """M19: correctness never depends on the learned order."""
    model = TinyDiT()
    x, t = torch.randn(2, 8, 192), torch.randn(2, 192)
    with torch.no_grad():
        expected = [block(x, t) for block in model.blocks]
    h, _, log = handle(model)
    h.load(h.min_working_set)
    with torch.no_grad():
        for block in model.blocks:  # learn 0 -> 1 -> 2 -> 3
            block(x, t)
        got = {i: model.blocks[i](x, t) for i in (3, 1, 0, 2)}  # against the learned order
    assert all(torch.equal(got[i], expected[i]) for i in range(4))
    check_event_protocol(log)


def test_heterogeneous_units_stay_within_the_pool_limit() -> None:
    """Static buffers never exceed the `capacity` largest streamed units (M16's count)."""
    model = ConvVocoder()
    mel = torch.randn(1, 80, 16)
    with torch.no_grad():
        expected = model(mel)
    h, engine, _ = handle(model)
    h.load(h.min_working_set)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(model(mel), expected)
    pool = engine._pools[id(h)]
    assert sum(b.nbytes for b in pool.buffers) <= pool.limit


def test_views_keep_resident_strides_dtype_and_alignment() -> None:
    """M23: a streamed weight has the dtype and strides a resident copy would have, and the
    caching allocator's alignment, so the same kernel runs."""
    model = TinyDiT(dim=256).to(torch.bfloat16)  # bf16 blocks of >= 1 MB (M12)
    for block in model.blocks:
        block.ff1.weight.data = block.ff1.weight.data.t().contiguous().t()  # column-major
    h, engine, _ = handle(model, strict=False)
    h.load(h.min_working_set)
    unit = h.units[0]
    tensors = h.streamer.acquire(h, unit)
    try:
        for slot, dev in zip(unit.slots, tensors):
            resident = slot.host.to(CPU, copy=True)  # type: ignore[union-attr]
            assert dev.dtype == slot.host.dtype == torch.bfloat16  # type: ignore[union-attr]
            assert dev.stride() == resident.stride() and torch.equal(dev, slot.host)  # type: ignore[arg-type]
            base = engine._pools[id(h)].buffers[0].data.data_ptr()
            assert (dev.data_ptr() - base) % ALIGN == 0
    finally:
        h.streamer.release(h, unit)


@pytest.mark.parametrize("buffered", [True, False])
def test_copies_are_made_outside_inference_mode(buffered: bool) -> None:
    """M23: device copies are normal tensors even when the forward runs in inference mode."""
    model = TinyDiT()
    if buffered:
        h, _, _ = handle(model)
    else:
        devices = DeviceService(simulate={"cpu": 256 * MB}, strict=True)
        h = ModelHandle(model, devices=devices)
    h.load(h.min_working_set)
    with torch.inference_mode():
        tensors = h.streamer.acquire(h, h.units[1])
    assert tensors and not any(t.is_inference() for t in tensors)
    h.streamer.release(h, h.units[1])


def test_every_copy_checks_for_cancellation() -> None:
    """M23: a cancelled request stops at the next copy; the check is the request's own, so a
    thread charging no request (or another one) is not cancelled by it."""
    model = TinyDiT()
    h, _, _ = handle(model)
    h.load(h.min_working_set)
    checks: list[int] = []

    def check() -> None:
        checks.append(1)
        if len(checks) > 2:
            raise CancelledError("cancelled")

    with pytest.raises(CancelledError), charging(StreamCharge(check)):
        dit_run(model)
    assert len(checks) == 3
    with charging(StreamCharge()) as other:
        dit_run(model)  # another request's copies: not this cancel check
    assert len(checks) == 3 and other.streamed_bytes > 0


def test_drop_releases_the_copy_buffers() -> None:
    """M32/M40: dropping the handle's copies gives their device memory back."""
    model = TinyDiT()
    h, _, _ = handle(model)
    h.load(h.min_working_set)
    dit_run(model)
    held = h.streamer.cached_bytes(h)
    assert held > 0
    assert h.streamer.drop(h) == held
    assert h.streamer.cached_bytes(h) == 0
    assert h.devices.counted_bytes(CPU) == h.loaded_bytes


def test_buffer_allocation_failure_is_an_oom_and_leaves_no_count() -> None:
    """An allocation that fails raises OOM (M40 retries it) and counts nothing."""
    model = TinyDiT()
    h, _, _ = handle(model)
    h.load(h.min_working_set)
    h.devices.fault_hook = OomInjector(at=1)
    with pytest.raises(torch.OutOfMemoryError):
        dit_run(model)
    h.devices.fault_hook = None
    assert h.devices.counted_bytes(CPU) == h.loaded_bytes
    assert torch.equal(dit_run(model), dit_run(model))


def test_compiled_parent_of_streamed_units_runs_eagerly() -> None:
    """M23: a `torch.compile`d parent and a `module.compile()`d unit run eagerly while units
    stream (a compiled graph would hold the weights), and compile again once whole."""
    model = TinyGPT2()
    tokens = torch.randint(0, 300, (1, 6))
    with torch.no_grad():
        expected = model(tokens)
    compiled = torch.compile(model, backend="eager")
    model.h[1].compile(backend="eager")
    compiled_forward = compiled.forward
    h, _, _ = handle(compiled, strict=False)
    h.load(h.min_working_set)
    assert h.streamed_units
    assert compiled.forward == model.__call__ and model.h[1]._compiled_call_impl is None
    with torch.no_grad():
        assert torch.equal(compiled(tokens), expected)
    h.load(None)  # whole: no hooks, compiled again
    assert compiled.forward is compiled_forward and model.h[1]._compiled_call_impl is not None
    with torch.no_grad():
        assert torch.equal(compiled(tokens), expected)


def test_make_copy_engine_off_cuda_uses_the_same_static_buffers() -> None:
    """M21: off CUDA nothing is pinned and the copies go into the same static buffers as on
    CUDA (a streamed step allocates nothing, issue 13): the simulated device through a copy
    thread standing in for a GPU's copy engine, XPU and MPS in order on one stream."""
    devices = DeviceService(simulate={"cpu": MB})
    engine = make_copy_engine(devices, CPU)
    assert type(engine) is BufferedCopyEngine and engine.pinner is None
    assert type(engine.streams) is ThreadStreams
    other = make_copy_engine(devices, torch.device("mps"))
    assert other.pinner is None and type(other.streams) is SimulatedStreams


def test_event_protocol_check_catches_a_missing_wait() -> None:
    """The checker above is not vacuous: a use without waiting for the copy fails it."""
    check_event_protocol([("record", 1, "copy"), ("wait", 1, "compute"), ("record", 1, "compute")])
    with pytest.raises(AssertionError):
        check_event_protocol([("record", 1, "copy"), ("record", 1, "compute")])


# ---- the simulated device's copy thread (ThreadStreams) -------------------------------------
class GatedStreams(ThreadStreams):
    """The copy thread, where every copy waits for `gate` (at most `GATE_S`): what a leaf waits
    for shows in what it can run before the gate opens. (A unit's first group is copied on
    the compute stream, so it never waits for the gate.)"""

    GATE_S = 10.0

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.passed = 0  # gated copies that went through

    def copy(self, stream: str, pairs: list[tuple[torch.Tensor, torch.Tensor]], non_blocking: bool) -> None:
        if stream == "copy":
            self._submit(self._through_gate)
        super().copy(stream, pairs, non_blocking)

    def _through_gate(self) -> None:
        self.gate.wait(self.GATE_S)
        self.passed += 1


def threaded(model: nn.Module, streams: ThreadStreams, kind: str = "sequence") -> ModelHandle:
    devices = DeviceService(simulate={"cpu": 256 * MB}, strict=True)
    h = ModelHandle(model, devices=devices, streamer=Streamer(devices, CPU, BufferedCopyEngine(devices, CPU, streams)),
                    kind=kind)  # type: ignore[arg-type]
    h.load(h.min_working_set)
    return h


def test_a_units_first_leaf_runs_while_its_later_weights_still_copy() -> None:
    """M17/M20: on the simulated device a unit's copy runs on the copy thread group by group and
    a leaf waits only for its own weights: the first leaf runs before the unit's later groups
    are copied (they wait for a gate the first leaf opens), and a later leaf's weight read
    before its own forward is the strict stand-in, not a copy still being written. Exact."""
    model = TinyLM(dim=512, layers=2)
    prompt = torch.tensor([[1, 2, 3]])
    expected = model.generate(prompt, 3, torch.Generator().manual_seed(0))
    streams = GatedStreams()
    h = threaded(model, streams)
    assert all(len(u.groups) == 3 for u in h.units)  # qkv and out, up, down
    seen: list[tuple[bool, bool]] = []

    def first_leaf(module: nn.Module, args: object) -> None:
        layer = next(layer for layer in model.layers if layer.qkv is module)
        try:
            layer.down.weight.sum()
            read = True
        except RuntimeError:
            read = False
        seen.append((streams.passed > 0, read))
        streams.gate.set()

    hooks = [layer.qkv.register_forward_pre_hook(first_leaf) for layer in model.layers]
    try:
        streams.gate.clear()
        got = model.generate(prompt, 3, torch.Generator().manual_seed(0))
    finally:
        for hook in hooks:
            hook.remove()
    assert torch.equal(got, expected)
    assert seen[0] == (False, False)  # ran before its unit's later groups, and could not read them
    assert all(not read for _, read in seen)


def test_a_failed_copy_raises_where_the_leaf_waits_and_loses_nothing() -> None:
    """A copy that fails on the copy thread raises in the request that waits for it, naming
    what failed — also when the copy thread is done with it before the leaf waits — the
    handle is left between calls, and the next run is exact."""

    class Failing(ThreadStreams):
        fail, failed = True, False

        def copy(self, stream: str, pairs: list[tuple[torch.Tensor, torch.Tensor]], non_blocking: bool) -> None:
            if stream == "copy" and self.fail:
                self.fail, self.failed = False, True
                pairs = [(pairs[0][0], torch.empty(3))]  # a shape that cannot be copied into the view
            super().copy(stream, pairs, non_blocking)

        def record(self, event: Any, stream: str) -> None:
            super().record(event, stream)
            if self.failed:  # the failed group's event: done before anything waits for it
                self.failed = False
                assert event.done.wait(10)

    model = TinyLM(dim=512, layers=2)  # groups: qkv and out (on the compute stream), up, down
    prompt = torch.tensor([[1, 2, 3]])

    def logits() -> torch.Tensor:  # not sampled tokens: those could hide a wrong weight
        with torch.no_grad():
            return model.step(prompt, [[] for _ in model.layers])

    expected = logits()
    h = threaded(model, Failing())
    ran: list[int] = []
    hook = model.layers[0].up.register_forward_hook(lambda *_: ran.append(1))
    with pytest.raises(RuntimeError, match="copying a streamed unit's weights to cpu failed"):
        logits()
    hook.remove()
    assert not ran  # the leaf whose copy failed never ran on it
    h.end_call()
    assert not any(h.streamer.users(h, u) for u in h.units)
    assert torch.equal(logits(), expected)  # the failed copy was made again, not reused


class _Branchy(nn.Module):
    """A unit whose forward runs its second leaf only when asked."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(1024, 1024)  # 4 MB each: two copy groups
        self.b = nn.Linear(1024, 1024)

    def forward(self, x: torch.Tensor, both: bool) -> torch.Tensor:
        x = self.a(x)
        return self.b(x) if both else x


def branchy_model() -> tuple[nn.Module, Callable[[], list[torch.Tensor]]]:
    model = nn.Module()
    model.embed = nn.Embedding(4, 1024)
    model.blocks = nn.ModuleList(_Branchy() for _ in range(3))
    x = torch.randn(2, 1024)

    def run() -> list[torch.Tensor]:
        with torch.no_grad():
            return [block(x, both=i % 2 == 1) for i, block in enumerate(model.blocks)] + [model.blocks[0](x, True)]

    return model, run


def test_a_unit_left_before_its_later_leaves_ran_orders_its_buffer_after_their_copies() -> None:
    """A unit whose later leaves did not run leaves their copies unwaited. Before the buffer's
    next use is recorded, the compute stream waits for the whole copy, so on a GPU the next
    writer (or the allocator, once the buffer is freed) comes after those copies. Exact."""
    model, run = branchy_model()
    expected = run()
    h, _, log = handle(model)
    h.load(h.min_working_set)
    assert len(h.streamed_units) == 3
    for _ in range(2):
        assert all(torch.equal(g, e) for g, e in zip(run(), expected))
    check_event_protocol(log)


def test_the_copy_thread_ends_when_idle_and_starts_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated device's copy thread ends after a while with nothing to copy and starts
    again with the next copy; results stay exact."""
    monkeypatch.setattr(transfer, "COPY_THREAD_IDLE_S", 0.05)
    model, run = branchy_model()
    expected = run()
    streams = ThreadStreams()
    threaded(model, streams, kind="oneshot")
    for _ in range(2):
        assert all(torch.equal(g, e) for g, e in zip(run(), expected))  # the second: copied by a new thread
        deadline = time.monotonic() + 5
        while streams._running and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not streams._running
