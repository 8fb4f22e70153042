"""Copies and prefetch (M18–M21, M23) through the CUDA engine's code, run on the CPU.

`BufferedCopyEngine` is the engine used on CUDA and ROCm; here it runs on the simulated
device with `SimulatedStreams`, which log every event record and wait, so the tests check
both the results (identical to resident) and the event protocol that guards the static copy
buffers on a GPU.
"""
from __future__ import annotations

import pytest
import torch
from models import ConvVocoder, TinyDiT, TinyGPT2, TinyLM
from torch import nn

from mizuoto_runtime import DeviceService, ModelHandle, OomInjector, VramPolicy
from mizuoto_runtime.errors import CancelledError
from mizuoto_runtime.pinning import PinnedBudget, Pinner, RecordingRegistrar
from mizuoto_runtime.streamer import StreamCharge, Streamer, charging
from mizuoto_runtime.transfer import ALIGN, BufferedCopyEngine, SimulatedStreams, make_copy_engine

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
    """M20: a sequence handle has a single copy buffer and no side-stream copies."""
    model = TinyLM()
    prompt = torch.tensor([[1, 2, 3]])
    expected = model.generate(prompt, 4, torch.Generator().manual_seed(0))
    h, engine, log = handle(model, kind="sequence")
    h.load(h.min_working_set)
    assert torch.equal(model.generate(prompt, 4, torch.Generator().manual_seed(0)), expected)
    assert len(engine._pools[id(h)].buffers) == 1
    assert all(stream == "compute" for _, _, stream in log)


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


def test_make_copy_engine_uses_static_buffers_in_order_off_cuda() -> None:
    """M21: the simulated device, XPU and MPS copy in order on one stream, nothing pinned, into
    the same static buffers as CUDA: a streamed step allocates nothing (issue 13)."""
    devices = DeviceService(simulate={"cpu": MB})
    engine = make_copy_engine(devices, CPU)
    assert type(engine) is BufferedCopyEngine and engine.pinner is None
    assert type(engine.streams) is SimulatedStreams


def test_event_protocol_check_catches_a_missing_wait() -> None:
    """The checker above is not vacuous: a use without waiting for the copy fails it."""
    check_event_protocol([("record", 1, "copy"), ("wait", 1, "compute"), ("record", 1, "compute")])
    with pytest.raises(AssertionError):
        check_event_protocol([("record", 1, "copy"), ("record", 1, "compute")])
