"""A stand-in for the CUDA calls `graphs.capture` makes, answered on the CPU (issue 27).

No CUDA here: only the boundary is replaced — `torch.cuda.CUDAGraph`, streams, the pool calls,
the device generator, synchronize and the caches — so our capture code runs its real order of
operations, and every call is recorded. The stand-in follows CUDA's rules as far as the tests
need: a host synchronization inside a capture raises and invalidates it, `capture_end` of an
invalid capture raises, `pool()` answers only after a capture that ended, and the device
generator is the CPU's default one (the samplers draw from it on the CPU), so putting its
state back is observable in the codes.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch


class StandInGenerator:
    """`torch.cuda.default_generators[i]`'s `clone_state` / `graphsafe_set_state`, over a CPU generator."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def clone_state(self) -> StandInGenerator:
        return StandInGenerator(torch.Generator().set_state(self.generator.get_state()))

    def graphsafe_set_state(self, other: StandInGenerator) -> None:
        self.generator.set_state(other.generator.get_state())


class StandInStream:
    def __init__(self, cuda: CudaStandIn, name: str) -> None:
        self.cuda, self.name = cuda, name

    def wait_stream(self, other: StandInStream) -> None:
        self.cuda.calls.append(("wait_stream", self.name, other.name))


class StandInGraph:
    """`torch.cuda.CUDAGraph` as CUDA behaves for these tests."""

    def __init__(self, cuda: CudaStandIn) -> None:
        self.cuda = cuda
        self.ended = False

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        self.cuda.calls.append(("capture_begin", str(pool), capture_error_mode))
        self.cuda.capturing, self.cuda.invalid = True, False
        self.cuda.out_of_memory = self.cuda.oom_captures > 0
        self.cuda.oom_captures = max(0, self.cuda.oom_captures - 1)

    def capture_end(self) -> None:
        self.cuda.calls.append(("capture_end",))
        self.cuda.capturing = False
        if self.cuda.invalid or self.cuda.fail_at_end:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
        self.ended = True

    def pool(self) -> tuple[int, int]:
        if not self.ended:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return self.cuda.pool

    def reset(self) -> None:
        self.cuda.calls.append(("reset",))

    def replay(self) -> None:
        self.cuda.calls.append(("replay",))


class CudaStandIn:
    """Installs the stand-in with `monkeypatch`; `calls` lists what our code asked of CUDA."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, fail_at_end: bool = False, oom_captures: int = 0) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.capturing = False
        self.invalid = False
        self.fail_at_end = fail_at_end  # a kernel that cannot be captured: capture_end raises
        self.oom_captures = oom_captures  # the first captures run out of memory (in `allocate`)
        self.out_of_memory = False
        self.pool = (7, 0)
        self.generator = StandInGenerator(torch.default_generator)
        self.streams = 0
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "default_generators", (self.generator,))
        monkeypatch.setattr(cuda, "current_device", lambda: 0)
        monkeypatch.setattr(cuda, "Stream", self._new_stream)
        monkeypatch.setattr(cuda, "current_stream", lambda device=None: StandInStream(self, "current"))
        monkeypatch.setattr(cuda, "stream", self._stream)
        monkeypatch.setattr(cuda, "CUDAGraph", lambda: StandInGraph(self))
        monkeypatch.setattr(cuda, "graph_pool_handle", lambda: self.pool)
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: self.calls.append(("synchronize",)))
        monkeypatch.setattr(cuda, "empty_cache", lambda: self.calls.append(("empty_cache",)))
        monkeypatch.setattr(torch._C, "_host_emptyCache", lambda: self.calls.append(("host_empty_cache",)),
                            raising=False)  # CPU-only torch builds have no such binding
        monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", self._end_allocate)
        monkeypatch.setattr(torch._C, "_cuda_releasePool",
                            lambda index, pool: self.calls.append(("release_pool", str(index), str(pool))))

    def _new_stream(self, device: Any = None) -> StandInStream:
        self.streams += 1
        return StandInStream(self, f"capture-{self.streams}")

    @contextlib.contextmanager
    def _stream(self, stream: StandInStream) -> Iterator[None]:
        self.calls.append(("on_stream", stream.name))
        yield

    def _end_allocate(self, index: int, pool: tuple[int, ...]) -> None:
        self.calls.append(("end_allocate_to_pool", str(index), str(pool)))

    def host_sync(self) -> None:
        """What `.item()` does inside a capture: CUDA refuses and invalidates the capture."""
        if self.capturing:
            self.invalid = True
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    def allocate(self) -> None:
        """An allocation inside a capture, which runs out of memory in the first `oom_captures`."""
        if self.capturing and self.out_of_memory:
            self.invalid = True
            raise torch.OutOfMemoryError("CUDA out of memory (stand-in)")

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]
