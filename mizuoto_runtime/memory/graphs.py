"""CUDA Graphs over placed components: when they may be captured, and how (M24, M54).

Rules:
* `usable(policy)`: never under the `cudaMallocAsync` allocator (`compute.cuda_allocator =
  async`, unless `PYTORCH_CUDA_ALLOC_CONF` already says otherwise: the environment wins,
  M54): that stream-ordered allocator freed capture warm-up temporaries in a way that made
  replays fail with illegal memory access.
* `placement_refusal(handle)`: a component fully on the device may be captured; a partly
  placed one only if it is a `graphable` `sequence` handle whose streamed weights are all
  pinned — a graph's copy node reads a fixed host address, asynchronously.
* `host_refusal()`: a host may forbid capture for the whole process while its own memory
  manager could move memory under a graph — ComfyUI's dynamic VRAM, whose allocator evicts and
  re-faults weight pages behind PyTorch's back. The pack's ComfyUI side calls
  `refuse_capture(reason)` when it finds dynamic VRAM active, `refuse_capture(None)` to lift it.
* `eligible(handle)`: all of them, on a real CUDA device.

`capture(handle, fn, keep_rng=..., slots=...)` records `fn()` into a graph, on a stream of its
own, in ``thread_local`` capture mode, and only while no other request holds the device
(`slots`; see `capture` for why). With `keep_rng`, the warm-up runs' random draws are undone
(the device generator's state is put back before capture), so a graph that samples draws, at
its first replay, what an eager run would have. A capture that fails leaves the generator as
it was before the warm-up and its private pool released: the caller runs eagerly, with the
same numbers (`note_failure` logs it once and gives the reason for `meta.applied`). Nothing
synchronizes or empties a cache before capture, unless a capture ran out of memory. While a
graph lives, its private pool's free blocks are not counted as free device memory
(`devices.track_graph_pool`). During capture the handle's hooks do not
use the streamer: each leaf module's streamed weights are copied, when the leaf is entered,
from their fixed (pinned) host tensors into memory allocated inside the capture — the graph's
own pool, not the eager run's copy buffers, which are reused — and released when the leaf
exits, so the pool reuses that memory for the next leaf. Per leaf rather than per unit, so a
layer split over several graphs copies each weight once per step. Every `replay` adds the
bytes those copy nodes move to `ModelHandle.replayed` and to the streamer's count, so
`meta.memory.streamed_mb` stays exact. A replay after the handle's weights moved (another
placement, a re-pinned host copy) raises `GraphStale`: capture again.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import MizuotoError
from .cuda_allocator import ALLOC_CONF, allocator_env
from .devices import track_graph_pool
from .pinning import releases_deferred
from .policy import VramPolicy
from .rng import GLOBAL_RNG

if TYPE_CHECKING:
    from .handle import ModelHandle
    from .slots import DeviceSlots
    from .units import Slot

log = logging.getLogger(__name__)


class GraphRefused(MizuotoError):
    """This handle may not be captured now; the message says why (M24)."""


class GraphStale(MizuotoError):
    """The handle's weights moved since capture; the graph would read stale addresses."""


#: Why a capture is refused while another request holds the device (`compute.gpu_jobs` > 1).
BUSY = "another request is using the device"

_HOST_REFUSAL: list[str] = []  # at most one reason; a list so the setter needs no `global`


# ---- rules -----------------------------------------------------------------------------------
def refuse_capture(reason: str | None) -> None:
    """A host forbids CUDA Graph capture in this process (`reason`), or lifts it (None)."""
    _HOST_REFUSAL[:] = [reason] if reason else []


def host_refusal() -> str | None:
    """Why the host forbids capture now, or None."""
    return _HOST_REFUSAL[0] if _HOST_REFUSAL else None


def usable(policy: VramPolicy, environ: Mapping[str, str] | None = None) -> bool:
    """Whether CUDA Graphs may be captured under the allocator in force (M54): the one CUDA
    runs with once initialized, else the one the environment (which wins) or the policy picks."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.get_allocator_backend() != "cudaMallocAsync"
    conf = allocator_env(policy.cuda_allocator, environ).get(ALLOC_CONF, "")
    return "backend:cudamallocasync" not in conf.replace(" ", "").lower()


def placement_refusal(handle: ModelHandle) -> str | None:
    """Why the handle's placement forbids capture, or None when it allows it (M24)."""
    if not handle.loaded_bytes:
        return "the component is not placed on the device"
    if handle.is_whole:
        return None
    if not (handle.graphable and handle.kind == "sequence"):
        return "partly placed, and only graphable sequence handles may be captured so"
    unpinned = [s.name for s in _streamed_slots(handle) if s.host is None or not handle.streamer.is_pinned(s.host)]
    if unpinned:
        return f"{len(unpinned)} streamed weight(s) are not in pinned memory (first: {unpinned[0]})"
    return None


def eligible(handle: ModelHandle) -> tuple[bool, str]:
    """Whether `handle` may be captured now, and if not, why (M24, M54)."""
    if not usable(handle.policy):
        return False, ("the CUDA allocator is cudaMallocAsync (compute.cuda_allocator = async), "
                       "whose frees during capture make replays read freed memory")
    refused = host_refusal()
    if refused is not None:
        return False, refused
    if handle.device.type != "cuda" or handle.devices.is_simulated(handle.device):
        return False, f"{handle.device} is not a CUDA device"
    reason = placement_refusal(handle)
    return (reason is None), (reason or "eligible")


def _streamed_slots(handle: ModelHandle) -> list[Slot]:
    return [s for u in handle.streamed_units for s in u.slots]


# ---- capture -------------------------------------------------------------------------------
class LeafCopies:
    """The hooks' stand-in during capture: per-leaf copies into capture-allocated memory."""

    def __init__(self, handle: ModelHandle) -> None:
        self.device = handle.device
        self.copied_bytes = 0  # what one replay copies from host RAM
        self.hosts: list[torch.Tensor] = []  # the graph reads them: kept alive with it
        self._owned: dict[int, list[Slot]] = {}
        for slot in _streamed_slots(handle):
            for module, _ in slot.owners:
                owned = self._owned.setdefault(id(module), [])
                if slot not in owned:
                    owned.append(slot)
        self._active: dict[int, list[Any]] = {}  # id(slot) -> [device tensor, depth]

    def enter(self, module: nn.Module) -> None:
        for slot in self._owned.get(id(module), []):
            active = self._active.get(id(slot))
            if active is not None:
                active[1] += 1  # a weight shared by nested leaves: copied once
                continue
            host = slot.host
            assert host is not None, slot.name  # placement_refusal checked it is pinned
            meta = torch.empty_like(host, device="meta")  # the resident strides (M23)
            with torch.inference_mode(False):
                dev = torch.empty_strided(meta.size(), meta.stride(), dtype=host.dtype, device=self.device)
                dev.copy_(host, non_blocking=True)  # a memcpy node from the fixed host address
            slot.hold(dev)
            self._active[id(slot)] = [dev, 1]
            self.copied_bytes += slot.nbytes
            self.hosts.append(host)

    def exit(self, module: nn.Module) -> None:
        for slot in self._owned.get(id(module), []):
            active = self._active.get(id(slot))
            if active is None:
                continue
            active[1] -= 1
            if active[1] == 0:
                del self._active[id(slot)]
                assert slot.host is not None
                slot.hold(slot.host)  # capture never runs on the strict simulated device


@dataclasses.dataclass(eq=False)
class CapturedGraph:
    """A captured graph, its static output, and what each replay copies (M24)."""

    graph: Any  # torch.cuda.CUDAGraph
    output: Any
    handle: ModelHandle
    nbytes: int  # bytes each replay copies from host RAM
    hosts: list[torch.Tensor]
    placements: int
    addresses: tuple[int, ...]

    def replay(self) -> Any:
        self._check()
        self.graph.replay()
        if self.nbytes:
            self.handle.replayed += self.nbytes
            self.handle.streamer.count_replay(self.handle, self.nbytes)
        return self.output

    def _check(self) -> None:
        """After a placement, the weights the graph reads must still be where they were."""
        placements = self.handle.streamer.placements(self.handle)
        if placements == self.placements:
            return
        if _addresses(self.handle.module) != self.addresses:
            raise GraphStale(f"{self.handle.name}: weights moved since capture; capture the graph again")
        self.placements = placements


def _addresses(module: nn.Module) -> tuple[int, ...]:
    return tuple(t.data_ptr() for t in [*module.parameters(), *module.buffers()])


def capture(handle: ModelHandle, fn: Callable[[], Any], *, warmup: int = 2, pool: Any = None,
            keep_rng: bool = False, slots: DeviceSlots | None = None) -> CapturedGraph:
    """Capture `fn()` (which reads static inputs) over `handle`'s placement (M24).

    Refuses with `GraphRefused`, before touching the device, when `eligible` says no, or when
    another request holds the device (`slots`, the device's request slots; None: the caller
    owns the device, as a benchmark does). `keep_rng`: undo the warm-up's random draws, so
    replays draw what eager runs would.

    Concurrent requests (`compute.gpu_jobs` > 1): no capture while another request holds the
    device, and none starts while this one captures (`DeviceSlots.sole`). Why not capture
    beside them instead: during capture another thread's draw from the device generator, its
    synchronization, `empty_cache` or `cudaHostRegister` (a placement) fails or invalidates the
    capture, and a request already inside its phase cannot be paused at a safe point; refusing
    costs that request only the graph's speed (it runs eagerly, exact). The capture also holds
    the RNG lock and runs in ``thread_local`` mode, so a thread outside any request (a host's
    own work) does not invalidate it.

    A capture that fails leaves nothing behind: the device generator's state is put back
    (`_Recording`), the private pool stops taking allocations, and the error is raised for the
    caller to run eagerly. The device's caches are emptied only when a capture ran out of
    memory, then it is tried once more.
    """
    ok, reason = eligible(handle)
    if not ok:
        raise GraphRefused(f"{handle.name}: no CUDA Graph: {reason}")
    with GLOBAL_RNG, _alone(handle, slots):
        try:
            return _capture(handle, fn, warmup, pool, keep_rng)
        except torch.OutOfMemoryError:
            log.info("%s: CUDA Graph capture ran out of memory; emptying the device cache and trying again",
                     handle.name)
            torch.cuda.synchronize(handle.device)
            torch.cuda.empty_cache()
            return _capture(handle, fn, warmup, pool, keep_rng)


@contextlib.contextmanager
def _alone(handle: ModelHandle, slots: DeviceSlots | None) -> Iterator[None]:
    if slots is None:
        yield
        return
    with slots.sole(f"a CUDA Graph capture of {handle.name}") as alone:
        if not alone:
            raise GraphRefused(f"{handle.name}: no CUDA Graph: {BUSY}")
        yield


def _capture(handle: ModelHandle, fn: Callable[[], Any], warmup: int, pool: Any, keep_rng: bool) -> CapturedGraph:
    device = handle.device
    recording = _Recording(device, pool)
    current = torch.cuda.current_stream(device)
    recording.stream.wait_stream(current)
    try:
        with torch.cuda.stream(recording.stream):  # warm-up off the default stream, as torch recommends
            for _ in range(warmup):
                fn()
        current.wait_stream(recording.stream)
        if keep_rng:
            recording.undo_draws()  # capture itself does not advance the generator
        leaves = LeafCopies(handle)
        handle.graph_capture = leaves
        try:
            with releases_deferred():
                output = recording.record(fn)
        finally:
            handle.graph_capture = None
            pinner = handle.streamer.engine.pinner
            if pinner is not None:
                pinner.flush()  # releases deferred while capturing
    except BaseException:
        recording.undo_draws()  # the eager run that follows draws what it would have
        raise
    log.info("%s: captured a CUDA Graph; each replay copies %.1f MB from host RAM",
             handle.name, leaves.copied_bytes / 2**20)
    captured = CapturedGraph(recording.graph, output, handle, leaves.copied_bytes, leaves.hosts,
                             handle.streamer.placements(handle), _addresses(handle.module))
    track_graph_pool(captured, device, tuple(getattr(recording.pool, "id", recording.pool)))
    return captured


class _Recording:
    """One capture's CUDA side: its own stream, its own private pool, and the device
    generator's state from before it, put back when the capture fails (issue 27).

    Why: when capture fails inside CUDA, `CUDAGraph.capture_end` raises before the allocator
    stops routing the capture's allocations to its pool and before the generator leaves its
    capturing state, so every later draw in the process would raise."""

    def __init__(self, device: torch.device, pool: Any) -> None:
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self.generator = torch.cuda.default_generators[self.index]
        self.saved = self.generator.clone_state()
        self.stream = torch.cuda.Stream(device)
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()  # known even if capture fails
        self.graph = torch.cuda.CUDAGraph()

    def undo_draws(self) -> None:
        """Put the generator back as it was before the warm-up (a copy: `saved` stays intact)."""
        self.generator.graphsafe_set_state(self.saved.clone_state())

    def record(self, fn: Callable[[], Any]) -> Any:
        with torch.cuda.stream(self.stream):
            try:
                self.graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            except BaseException:
                self._release_pool()  # the pool may already be taking allocations
                raise
            try:
                output = fn()
            except BaseException:
                self._abandon()
                raise
            try:
                self.graph.capture_end()
            except BaseException:
                self._release_pool()
                raise
        return output

    def _abandon(self) -> None:
        """End a capture whose function raised, then let go of its pool."""
        try:
            self.graph.capture_end()  # ends the stream's capture even when CUDA invalidated it
        except RuntimeError as exc:
            log.debug("ending the failed capture: %s", exc)
        self._release_pool()

    def _release_pool(self) -> None:
        """Stop the pool taking allocations and let go of it (what `capture_end` skipped)."""
        pool_id = tuple(getattr(self.pool, "id", self.pool))
        try:
            torch._C._cuda_endAllocateToPool(self.index, pool_id)
        except RuntimeError:
            log.debug("the failed capture's pool had stopped taking allocations already")
        try:
            self.graph.pool()  # answers only once the capture ended: then `reset` lets the pool go
            ended = True
        except RuntimeError:
            ended = False
        self.graph.reset()  # forgets the capture in the generator's and torch's tables
        if not ended:
            try:
                torch._C._cuda_releasePool(self.index, pool_id)
            except RuntimeError:
                log.debug("the failed capture had made no pool")


_LOGGED_FAILURES: set[str] = set()


def note_failure(name: str, exc: BaseException) -> str:
    """Log a failed capture once per kind of failure (a request that retries it fails again),
    and return the reason `meta.applied.cuda_graphs` reports."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    key = f"{name}: {type(exc).__name__}: {reason}"
    if key not in _LOGGED_FAILURES:
        _LOGGED_FAILURES.add(key)
        log.warning("%s: CUDA Graph capture failed, running eagerly (%s)", name, reason)
    else:
        log.debug("%s: CUDA Graph capture failed again, running eagerly (%s)", name, reason)
    return f"capture failed ({reason})"
