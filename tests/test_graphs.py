"""CUDA Graph rules and the capture helper (M24, M54), on the CPU.

No graph can be captured here; the tests check the rules (`usable`, `placement_refusal`,
`eligible`), that `capture` refuses cleanly before touching a device, the per-leaf copies
capture uses (run eagerly), and replay accounting with a stand-in graph.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch
from models import TinyDiT, TinyLM

from mizuoto_runtime import DeviceService, ModelHandle, VramPolicy, graphs
from mizuoto_runtime.cuda_allocator import allocator_env
from mizuoto_runtime.pinning import PinnedBudget, Pinner, RecordingRegistrar
from mizuoto_runtime.streamer import Streamer
from mizuoto_runtime.transfer import BufferedCopyEngine, SimulatedStreams

MB = 1 << 20
CPU = torch.device("cpu")


def lm_handle(*, graphable: bool = True, kind: str = "sequence", pinned: bool = True,
              strict: bool = True, **settings: object) -> ModelHandle:
    devices = DeviceService(simulate={"cpu": 64 * MB}, strict=strict)
    pinner = Pinner("register", RecordingRegistrar(), PinnedBudget(1 << 30)) if pinned else None
    streamer = Streamer(devices, CPU, BufferedCopyEngine(devices, CPU, SimulatedStreams(), pinner))
    policy = VramPolicy({f"compute.{k}": v for k, v in settings.items()})
    return ModelHandle(TinyLM(), devices=devices, policy=policy, streamer=streamer, kind=kind,  # type: ignore[arg-type]
                       graphable=graphable)


def test_usable_follows_the_allocator() -> None:
    """M54: no CUDA Graphs under cudaMallocAsync, chosen by setting or by the environment."""
    asynchronous = VramPolicy({"compute.cuda_allocator": "async"})
    assert graphs.usable(VramPolicy(), environ={})
    assert not graphs.usable(asynchronous, environ={})
    assert not graphs.usable(VramPolicy(), environ={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    # A value already in the environment wins over the setting.
    assert graphs.usable(asynchronous, environ={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})


def test_allocator_env_is_written_once_and_the_environment_wins() -> None:
    """M54: the setting becomes PYTORCH_CUDA_ALLOC_CONF (for this process or a training child)."""
    assert allocator_env("auto", {}) == {} and allocator_env("native", {}) == {}
    assert allocator_env("async", {}) == {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}
    assert allocator_env("expandable", {}) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert allocator_env("async", {"PYTORCH_CUDA_ALLOC_CONF": "x"}) == {"PYTORCH_CUDA_ALLOC_CONF": "x"}


def test_placement_rules() -> None:
    """M24: whole components, or graphable sequence handles whose streamed weights are pinned."""
    h = lm_handle()
    assert "not placed" in str(graphs.placement_refusal(h))
    h.load(None)
    assert graphs.placement_refusal(h) is None
    h.load(h.min_working_set)
    assert h.streamed_units and graphs.placement_refusal(h) is None

    unpinned = lm_handle(pinned=False)
    unpinned.load(unpinned.min_working_set)
    assert "not in pinned memory" in str(graphs.placement_refusal(unpinned))

    for kind, graphable in (("sequence", False), ("oneshot", True)):
        other = lm_handle(kind=kind, graphable=graphable)
        other.load(other.min_working_set)
        assert "graphable sequence" in str(graphs.placement_refusal(other))


def test_eligible_and_capture_refuse_cleanly_off_cuda() -> None:
    """M24: on the CPU (and under an async allocator) capture refuses before running anything."""
    h = lm_handle()
    h.load(None)
    assert graphs.eligible(h) == (False, "cpu is not a CUDA device")
    ran: list[int] = []
    with pytest.raises(graphs.GraphRefused, match="not a CUDA device"):
        graphs.capture(h, lambda: ran.append(1))
    assert ran == [] and h.graph_capture is None
    asynchronous = lm_handle(cuda_allocator="async")
    asynchronous.load(None)
    ok, reason = graphs.eligible(asynchronous)
    assert not ok and "async" in reason


def test_leaf_copies_copy_each_weight_once_per_leaf_entry() -> None:
    """M24: during capture each leaf copies its own streamed weights from the fixed host
    tensors; the streamer is not used, results are those of the resident run."""
    model = TinyDiT()
    noise, label = torch.randn(2, 8, 192), torch.tensor([1, 2])
    expected = model.sample(noise, label, steps=1)
    devices = DeviceService(simulate={"cpu": 64 * MB})
    h = ModelHandle(model, devices=devices)
    h.load(h.min_working_set)
    leaves = graphs.LeafCopies(h)
    h.graph_capture = leaves
    try:
        got = model.sample(noise, label, steps=1)
    finally:
        h.graph_capture = None
    assert torch.equal(got, expected)
    assert h.streamer.streamed_bytes == 0
    # Each block runs twice (CFG halves), and each entry of a leaf copies its weights.
    assert leaves.copied_bytes == 2 * sum(u.nbytes for u in h.units)
    assert all(s.current().data_ptr() == s.host.data_ptr() for u in h.units for s in u.slots)  # type: ignore[union-attr]


class FakeGraph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


def test_replays_are_counted_and_stale_graphs_refuse() -> None:
    """M24/M50: each replay adds its copied bytes to `replayed` and the streamed count; after
    the weights move, a replay raises `GraphStale`."""
    h = lm_handle(strict=False)
    h.load(h.min_working_set)
    nbytes = sum(u.nbytes for u in h.streamed_units)
    graph: Any = FakeGraph()
    captured = graphs.CapturedGraph(graph, "out", h, nbytes, [], h.streamer.placements(h),
                                    graphs._addresses(h.module))
    assert captured.replay() == "out" and captured.replay() == "out"
    assert graph.replays == 2 and h.replayed == 2 * nbytes
    assert h.streamer.streamed_bytes == 2 * nbytes == h.streamer.streamed_bytes_of(h)
    h.load(h.min_working_set)  # placed again, nothing moved: still valid
    captured.replay()
    h.load(None)  # the streamed units become resident: new addresses
    with pytest.raises(graphs.GraphStale):
        captured.replay()
