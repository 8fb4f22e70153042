"""CUDA Graph rules and the capture helper (M24, M54), on the CPU.

No graph can be captured here; the tests check the rules (`usable`, `placement_refusal`,
`eligible`), that `capture` refuses cleanly before touching a device, the per-leaf copies
capture uses (run eagerly), and replay accounting with a stand-in graph.
"""
from __future__ import annotations

import gc
import threading
import time
from typing import Any

import pytest
import torch

from mizuoto_runtime import DeviceService, ModelHandle, VramPolicy
from mizuoto_runtime.memory import graphs
from mizuoto_runtime.memory.cuda_allocator import allocator_env
from mizuoto_runtime.memory.devices import track_graph_pool
from mizuoto_runtime.memory.pinning import PinnedBudget, Pinner, RecordingRegistrar
from mizuoto_runtime.memory.slots import DeviceSlots
from mizuoto_runtime.memory.streamer import Streamer
from mizuoto_runtime.memory.transfer import BufferedCopyEngine, SimulatedStreams

from support.cuda_standin import CudaStandIn, StandInGraph
from support.models import TinyDiT, TinyLM
from support.threads import another_request_holding

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


# ---- issue 27: capture failure, concurrent requests, free VRAM --------------------------------
# `CudaStandIn` answers the CUDA calls `capture` makes on the CPU (no CUDA here); the capture
# code that runs is ours. `bench/gpu_suite.py` checks the same on a GPU.

def _whole_handle(monkeypatch: pytest.MonkeyPatch) -> ModelHandle:
    h = lm_handle(strict=False)
    h.load()
    monkeypatch.setattr(graphs, "eligible", lambda handle: (True, "eligible"))  # no CUDA device here
    return h


def test_failed_capture_puts_the_generator_and_pool_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host synchronization inside the capture: CUDA invalidates it and `capture_end` raises.
    The device generator is put back as it was before the warm-up (the eager run then draws
    what a graph-off run draws), the pool stops taking allocations and is let go, each capture
    had its own stream, in thread_local mode, and nothing synchronized or emptied a cache."""
    cuda = CudaStandIn(monkeypatch)
    h = _whole_handle(monkeypatch)
    torch.manual_seed(11)
    graph_off = torch.rand(4)
    torch.manual_seed(11)

    def sampled_with_sync() -> torch.Tensor:
        drawn = torch.rand(4)
        cuda.host_sync()  # `.item()` inside the captured function
        return drawn

    for _ in range(2):
        with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
            graphs.capture(h, sampled_with_sync, keep_rng=True)
    assert torch.equal(torch.rand(4), graph_off)  # the eager fallback's draws
    names = cuda.names()
    assert names.count("capture_begin") == 2 and ("capture_begin", "(7, 0)", "thread_local") in cuda.calls
    assert names.count("end_allocate_to_pool") == 2 and names.count("release_pool") == 2
    assert names.count("reset") == 2
    assert {c[1] for c in cuda.calls if c[0] == "on_stream"} == {"capture-1", "capture-2"}  # a stream each
    assert not {"synchronize", "empty_cache", "host_empty_cache"} & set(names)
    assert h.graph_capture is None


def test_failure_is_reported_once_per_kind(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("DEBUG", logger="mizuoto_runtime.memory.graphs"):
        first = graphs.note_failure("talker-27", RuntimeError("operation not permitted\nmore"))
        again = graphs.note_failure("talker-27", RuntimeError("operation not permitted\nmore"))
    assert first == again == "capture failed (operation not permitted)"
    assert [r.levelname for r in caplog.records if "talker-27" in r.getMessage()] == ["WARNING", "DEBUG"]


def test_capture_empties_the_device_cache_only_when_it_ran_out_of_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = CudaStandIn(monkeypatch)
    h = _whole_handle(monkeypatch)
    captured = graphs.capture(h, lambda: cuda.allocate() or torch.ones(2))
    assert not {"synchronize", "empty_cache", "host_empty_cache"} & set(cuda.names())
    assert torch.equal(captured.output, torch.ones(2))
    cuda.calls.clear()
    cuda.oom_captures = 1
    graphs.capture(h, lambda: cuda.allocate() or torch.ones(2))
    names = cuda.names()
    assert names.count("capture_begin") == 2 and names.count("empty_cache") == 1 and names.count("synchronize") == 1
    assert names.index("empty_cache") < names.index("capture_begin", names.index("empty_cache"))
    assert "host_empty_cache" not in names  # the host cache plays no part in a capture


def test_no_capture_while_another_request_holds_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """`compute.gpu_jobs` = 2: with another request in a phase, capture is refused before any
    CUDA call; alone, it holds the device and a request starting meanwhile waits for its end."""
    cuda = CudaStandIn(monkeypatch)
    h = _whole_handle(monkeypatch)
    slots = DeviceSlots("cuda:0", lambda: 2)
    with another_request_holding(slots):
        slots.take(None, 5.0)
        with pytest.raises(graphs.GraphRefused, match=graphs.BUSY):
            graphs.capture(h, lambda: torch.ones(1), slots=slots)
    assert cuda.calls == []

    started: list[float] = []
    late = threading.Thread(target=lambda: (slots.take(None, 5.0), started.append(time.monotonic()), slots.give()))

    def fn() -> torch.Tensor:
        if not late.is_alive() and not started:
            late.start()
            time.sleep(0.3)  # the late request asks for a slot while this one captures
        return torch.ones(1)

    graphs.capture(h, fn, slots=slots, warmup=0)
    ended = time.monotonic()
    late.join(5.0)
    slots.give()
    assert started and started[0] >= ended - 0.05  # it waited for the capture to end


def test_the_capture_state_is_per_thread() -> None:
    """Another request's thread streams through the hooks as usual while one thread captures."""
    h = lm_handle(strict=False)
    h.graph_capture = marker = object()
    seen: list[Any] = []
    thread = threading.Thread(target=lambda: seen.append(h.graph_capture))
    thread.start()
    thread.join()
    assert seen == [None] and h.graph_capture is marker
    h.graph_capture = None


class Graph:
    """Stands for a live `CapturedGraph`."""


def test_free_vram_leaves_out_a_live_graphs_private_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """A live graph's pool holds free blocks only its replays can use (torch's CUDA memory
    queries stood in for: no CUDA here; `free_bytes` is ours)."""
    cuda0 = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * MB, 1000 * MB))
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {
        "reserved_bytes.all.current": 300 * MB, "allocated_bytes.all.current": 200 * MB})
    segments = [{"device": 0, "total_size": 64 * MB, "allocated_size": 24 * MB, "segment_pool_id": (7, 0)},
                {"device": 0, "total_size": 256 * MB, "allocated_size": 176 * MB, "segment_pool_id": (0, 0)},
                {"device": 1, "total_size": 64 * MB, "allocated_size": 0, "segment_pool_id": (7, 0)}]
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: segments)
    gc.collect()  # graphs of earlier tests
    service = DeviceService()
    assert service.free_bytes(cuda0) == 200 * MB
    graph = Graph()
    track_graph_pool(graph, cuda0, (7, 0))
    assert service.free_bytes(cuda0) == 160 * MB
    del graph
    gc.collect()
    assert service.free_bytes(cuda0) == 200 * MB


def test_a_capture_that_cannot_begin_lets_its_pool_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """`capture_begin` fails (e.g. another process-wide capture): the pool it may have started
    feeding is released and the generator put back, as for any failed capture."""
    cuda = CudaStandIn(monkeypatch)
    h = _whole_handle(monkeypatch)

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(StandInGraph, "capture_begin", refuse)
    torch.manual_seed(3)
    graph_off = torch.rand(2)
    torch.manual_seed(3)
    with pytest.raises(RuntimeError, match="not permitted"):
        graphs.capture(h, lambda: torch.rand(2))
    assert torch.equal(torch.rand(2), graph_off)
    assert {"end_allocate_to_pool", "reset", "release_pool"} <= set(cuda.names())
