"""How a unit's weights get to the device (M18–M23).

One engine, `BufferedCopyEngine`, serves every device that moves weights: CUDA and ROCm with a
side stream for copies made ahead (`CudaStreams`), and the CPU-simulated device, XPU and MPS
with work in order on one stream (`SimulatedStreams`; M21: copies there are synchronous). So the
strict simulated device runs the same copy path as a GPU, and neither allocates per step.

**Copy-buffer protection: static, event-guarded copy buffers**, not `record_stream`. Each handle has a small pool of preallocated device
buffers; a unit's tensors are views into one buffer (each at a 512-byte offset, like the
caching allocator's blocks, with the strides `.to(device)` would give, so a streamed layer
runs the same kernel as a resident one). Every buffer is allocated on the compute stream
and carries one event, recorded at allocation (the block's previous user may still be
queued), re-recorded after each write on the copy stream and after each use on the compute
stream; before a buffer is written again — on either stream — or handed back to the
allocator, the writing stream waits on that event. Why not `record_stream`: it defers the
block's reuse to the allocator, which polls events at allocation time and, when they have not
completed, takes fresh memory or stalls freeing the cache; and each step would allocate and
free one block per weight.
Static buffers allocate nothing per step, hold exactly the memory the handle's budget
counted (M16), and the single wait is explicit and cheap. Buffers are chosen best-fit (for
equal-sized units: round-robin), the pool never exceeds the `capacity` largest streamed
units, and it is released when the streamer drops the handle's copies (end of the last phase
using the handle, new placement, yielding, OOM: M32, M40). The streamer calls the engine
under its lock: one thread at a time.

Prefetched copies (M19) run on a side stream while the current unit computes; the compute
stream waits on the buffer's event before use. Only pinned host tensors (see `pinning.py`)
are copied ahead: a pageable copy blocks the host, so pageable units are copied on the spot,
synchronously, on the compute stream (M21). A unit entered out of the learned order is
copied on the spot too, so correctness never depends on the order.

Copy rules (M23): copies are made outside inference mode, in the weight's own dtype.
Compiled modules (`torch.compile(module)`, `module.compile()`) above streamed units run
eagerly while those units stream — a compiled graph would hold the weights — and compile
again when the component is whole. A compiled *function* wrapping a component cannot be
seen from the handle; engines must not compile across streamed units that way.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from .devices import DeviceService
from .pinning import Pinner, shared_pinner

if TYPE_CHECKING:
    from .units import Slot, Unit

log = logging.getLogger(__name__)

ALIGN = 512  # the caching allocator's block alignment: kernels see the same pointer alignment


@dataclasses.dataclass(eq=False)
class Lease:
    """A unit's weights on the device: one tensor per slot, and the engine's guard for them."""

    tensors: list[torch.Tensor]
    nbytes: int
    ready: Any = None  # an event the compute stream waits on (copies made ahead)
    buffer: _Buffer | None = None


# ---- streams and events: CUDA, or a stand-in for the simulated device -----------------------
class StreamBackend(Protocol):
    def current(self) -> Any: ...
    def side(self) -> Any: ...
    def event(self) -> Any: ...
    def record(self, event: Any, stream: Any) -> None: ...
    def wait(self, stream: Any, event: Any) -> None: ...
    def use(self, stream: Any) -> contextlib.AbstractContextManager[Any]: ...


class CudaStreams:
    """One side stream per device for copies; events without timing (cheaper to record)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._side: torch.cuda.Stream | None = None

    def current(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def side(self) -> torch.cuda.Stream:
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        return self._side

    def event(self) -> torch.cuda.Event:
        return torch.cuda.Event()

    def record(self, event: torch.cuda.Event, stream: torch.cuda.Stream) -> None:
        event.record(stream)

    def wait(self, stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
        stream.wait_event(event)

    def use(self, stream: torch.cuda.Stream) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(stream)


class SimulatedStreams:
    """Streams where work runs in order on one stream (the simulated device, XPU, MPS): events
    only get logged.

    With `log` set, every record and wait is appended as (op, event id, stream) so tests can
    check the guard order that the CUDA engine relies on.
    """

    def __init__(self, log: list[tuple[str, int, str]] | None = None) -> None:
        self.log = log
        self._stream = "compute"
        self._events = 0

    def current(self) -> str:
        return self._stream

    def side(self) -> str:
        return "copy"

    def event(self) -> int:
        self._events += 1
        return self._events

    def record(self, event: int, stream: str) -> None:
        if self.log is not None:
            self.log.append(("record", event, stream))

    def wait(self, stream: str, event: int) -> None:
        if self.log is not None:
            self.log.append(("wait", event, stream))

    @contextlib.contextmanager
    def use(self, stream: str) -> Iterator[str]:
        previous, self._stream = self._stream, stream
        try:
            yield stream
        finally:
            self._stream = previous


# ---- static, event-guarded copy buffers ---------------------------------------------------
@dataclasses.dataclass(eq=False)
class _Buffer:
    data: torch.Tensor  # uint8, on the device
    nbytes: int
    done: Any  # event: at allocation, then after each write (copy stream) or use (compute stream)
    stream: Any  # the stream it was allocated on (where the allocator reuses it)
    busy: bool = False
    views: dict[_Layout, list[torch.Tensor]] = dataclasses.field(default_factory=dict)  # made once per layout


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where each of a unit's weights lies in a buffer, and with which strides.

    Equal layouts are made one object per pool (`_Pool.canonical`), so the per-copy lookup of
    a buffer's views is a cached hash and an identity match, not a comparison of every
    weight's shape and strides."""

    offsets: tuple[int, ...]
    spans: tuple[int, ...]
    sizes: tuple[torch.Size, ...]
    strides: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    nbytes: int
    pinned: bool
    _hash: int = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = (self.offsets, self.spans, self.sizes, self.strides, self.dtypes, self.nbytes, self.pinned)
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash


@dataclasses.dataclass(eq=False)
class _Pool:
    buffers: list[_Buffer] = dataclasses.field(default_factory=list)
    layouts: dict[int, _Layout] = dataclasses.field(default_factory=dict)
    canonical: dict[_Layout, _Layout] = dataclasses.field(default_factory=dict)  # one object per layout
    limit: int = 0  # bytes: the `capacity` largest streamed units (0: not placed, no cap)

    def intern(self, layout: _Layout) -> _Layout:
        return self.canonical.setdefault(layout, layout)


class BufferedCopyEngine:
    """Copies into static, event-guarded buffers, ahead on a side stream where the device has one
    (M18–M23; module doc). `key` is the handle's identity."""

    def __init__(self, devices: DeviceService, device: torch.device, streams: StreamBackend,
                 pinner: Pinner | None = None) -> None:
        self.devices = devices
        self.device = device
        self.streams = streams
        self.pinner = pinner
        self._pools: dict[int, _Pool] = {}
        self._eager: dict[int, list[_Restore]] = {}  # key -> compiled modules made eager (M23)

    # ---- placement -----------------------------------------------------------------------
    def placed(self, key: int, root: nn.Module, streamed: Sequence[Unit], kept: Sequence[Slot],
               capacity: int, pinned_limit: int) -> None:
        """After a placement change: compiled parents eager (M23), host copies pinned (M21, M22),
        then the streamed units' layouts (they read whether a host tensor is pinned)."""
        self._restore_compiled(key)
        if streamed:
            self._eager[key] = run_compiled_eagerly(root, streamed)
        if self.pinner is not None:
            self.pinner.budget.limit = pinned_limit
            _pin_slots([s for u in streamed for s in u.slots], self.pinner.pin_streamed)
            _pin_slots([s for s in kept if not s.is_buffer], self.pinner.pin_kept)
        pool = self._pool(key)
        pool.layouts = {u.index: pool.intern(self._layout(u)) for u in streamed}
        sizes = sorted((lay.nbytes for lay in pool.layouts.values()), reverse=True)
        pool.limit = sum(sizes[:max(1, capacity)])

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return self.pinner is not None and self.pinner.is_pinned(tensor)

    def can_prefetch(self, key: int, unit: Unit) -> bool:
        """Only pinned units are copied ahead: a pageable copy blocks the host anyway (M21)."""
        return self._layout_of(self._pool(key), unit).pinned

    # ---- copies --------------------------------------------------------------------------
    def copy_unit(self, key: int, unit: Unit, ahead: bool) -> Lease:
        pool = self._pool(key)
        layout = self._layout_of(pool, unit)
        buffer = self._take(pool, layout.nbytes)
        try:
            views = buffer.views.get(layout)
            if views is None:  # units of one shape share them: nothing is made per step
                with torch.inference_mode(False):  # M23: normal tensors, the resident kernels
                    views = buffer.views[layout] = _views(buffer.data, layout)
            # Writing into a normal tensor keeps it normal, in inference mode too.
            ready = self._fill(buffer, views, [_host_of(s) for s in unit.slots], layout, ahead)
        except BaseException:
            buffer.busy = False
            raise
        return Lease(views, unit.nbytes, ready, buffer)

    def _fill(self, buffer: _Buffer, views: list[torch.Tensor], hosts: list[torch.Tensor],
              layout: _Layout, ahead: bool) -> Any:
        """Copy `hosts` into `views`: on the side stream when ahead and pinned, else on the spot."""
        streams = self.streams
        if ahead and layout.pinned:
            side = streams.side()
            streams.wait(side, buffer.done)  # the buffer's previous use is over
            with streams.use(side):
                for view, host in zip(views, hosts):
                    view.copy_(host, non_blocking=True)
            streams.record(buffer.done, side)
            return buffer.done
        compute = streams.current()
        streams.wait(compute, buffer.done)  # e.g. an unused prefetch into it may be in flight
        for view, host in zip(views, hosts):
            # Pinned: asynchronous, ordered on the compute stream. Pageable: synchronous (M21).
            view.copy_(host, non_blocking=layout.pinned)
        return None

    def wait(self, lease: Lease) -> None:
        if lease.ready is not None:
            self.streams.wait(self.streams.current(), lease.ready)

    def record_use(self, lease: Lease) -> None:
        if lease.buffer is not None:
            self.streams.record(lease.buffer.done, self.streams.current())

    def free(self, key: int, lease: Lease) -> None:
        lease.tensors = []  # the views stay with their buffer
        if lease.buffer is not None:
            lease.buffer.busy = False  # stays allocated for the next unit: reuse, not release

    def held_bytes(self, key: int) -> int:
        pool = self._pools.get(key)
        return sum(b.nbytes for b in pool.buffers) if pool else 0

    def trim(self, key: int) -> int:
        pool = self._pools.get(key)
        if pool is None:
            return 0
        idle = [b for b in pool.buffers if not b.busy]
        for buffer in idle:
            self._release(pool, buffer)
        return sum(b.nbytes for b in idle)

    def forget(self, key: int) -> None:
        self.trim(key)
        self._pools.pop(key, None)
        self._restore_compiled(key)

    def _restore_compiled(self, key: int) -> None:
        for restore in reversed(self._eager.pop(key, [])):
            restore()

    # ---- buffers -------------------------------------------------------------------------
    def _take(self, pool: _Pool, need: int) -> _Buffer:
        """The smallest idle buffer that fits; else a new one, within the pool's limit."""
        buffer = min((b for b in pool.buffers if not b.busy and b.nbytes >= need), key=_size, default=None)
        if buffer is None:
            idle = [b for b in pool.buffers if not b.busy]
            held = sum(b.nbytes for b in pool.buffers)
            for small in sorted(idle, key=_size):
                if not pool.limit or held + need <= pool.limit:
                    break
                self._release(pool, small)
                held -= small.nbytes
            # Over the limit only when every buffer is running (nested entry), like the streamer.
            buffer = self._allocate(pool, need)
        buffer.busy = True
        return buffer

    def _allocate(self, pool: _Pool, nbytes: int) -> _Buffer:
        self.devices.allocate(self.device, nbytes)  # counted on a simulated device; fault hook (M40)
        try:
            with torch.inference_mode(False):
                data = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        except BaseException:
            self.devices.release(self.device, nbytes)
            raise
        buffer = _Buffer(data, nbytes, self.streams.event(), self.streams.current())
        # The allocator may hand out a block whose last user is still queued on this stream:
        # a copy on the side stream must wait for that too, like for a reused buffer.
        self.streams.record(buffer.done, buffer.stream)
        pool.buffers.append(buffer)
        return buffer

    def _release(self, pool: _Pool, buffer: _Buffer) -> None:
        # The allocator reuses the block for work on its stream: order that after the last use.
        self.streams.wait(buffer.stream, buffer.done)
        pool.buffers.remove(buffer)
        self.devices.release(self.device, buffer.nbytes)

    # ---- layouts -------------------------------------------------------------------------
    def _pool(self, key: int) -> _Pool:
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool()
        return pool

    def _layout_of(self, pool: _Pool, unit: Unit) -> _Layout:
        layout = pool.layouts.get(unit.index)
        if layout is None:  # a streamer used without a handle's placement
            layout = pool.layouts[unit.index] = pool.intern(self._layout(unit))
        return layout

    def _layout(self, unit: Unit) -> _Layout:
        offsets, spans, sizes, strides, dtypes = [], [], [], [], []
        end = 0
        pinned = True
        for slot in unit.slots:
            host = _host_of(slot)
            meta = torch.empty_like(host, device="meta")  # the strides `.to(device)` gives
            offset = -(-end // ALIGN) * ALIGN
            span = _span_bytes(meta)
            offsets.append(offset)
            spans.append(span)
            sizes.append(meta.size())
            strides.append(meta.stride())
            dtypes.append(meta.dtype)
            end = offset + span
            pinned = pinned and self.is_pinned(host)
        return _Layout(tuple(offsets), tuple(spans), tuple(sizes), tuple(strides), tuple(dtypes),
                       max(end, 1), pinned)


def _size(buffer: _Buffer) -> int:
    return buffer.nbytes


def _views(data: torch.Tensor, layout: _Layout) -> list[torch.Tensor]:
    views = []
    for offset, span, size, stride, dtype in zip(layout.offsets, layout.spans, layout.sizes,
                                                 layout.strides, layout.dtypes):
        typed = data.narrow(0, offset, span).view(dtype)
        views.append(typed.as_strided(size, stride))
    return views


def _span_bytes(t: torch.Tensor) -> int:
    """Bytes from the first to the last element of a tensor with non-negative strides."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()


def _pin_slots(slots: list[Slot], pin: Any) -> None:
    """Replace the slots' host tensors by their pinned versions (same values and address)."""
    slots = [s for s in slots if s.host is not None]
    for slot, host in zip(slots, pin([s.host for s in slots])):
        slot.host = host


def _host_of(slot: Slot) -> torch.Tensor:
    host = slot.host
    if host is None:
        raise RuntimeError(f"{slot.name}: a streamed weight has no host copy")
    return host


# ---- M23: compiled modules above streamed units run eagerly --------------------------------
_Restore = Any  # a zero-argument callable that undoes one change


def _optimized_module_type() -> type | None:
    # Without torch._dynamo imported no module can have been compiled; don't import it (slow).
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", None) if eval_frame else None


def run_compiled_eagerly(root: nn.Module, streamed: Sequence[Unit]) -> list[_Restore]:
    """Make every compiled module whose subtree holds a streamed unit run eagerly (M23).

    `torch.compile(module)` wraps it in an `OptimizedModule` whose `forward` is the compiled
    call; `module.compile()` sets `_compiled_call_impl`. Both are switched to the eager call;
    the returned callables switch them back (when the component is whole again).
    """
    hooked = {id(m) for u in streamed for m in [u.module, *u.leaves]}
    optimized = _optimized_module_type()
    restores: list[_Restore] = []
    for module in root.modules():
        if optimized is not None and isinstance(module, optimized):
            compiled = module.__dict__.get("forward")
            if compiled is None or not _holds(module, hooked):
                continue
            original = module._orig_mod
            assert isinstance(original, nn.Module)
            module.forward = original.__call__
            restores.append(_setter(module, "forward", compiled))
        elif module._compiled_call_impl is not None and _holds(module, hooked):
            compiled_call = module._compiled_call_impl
            module._compiled_call_impl = None
            restores.append(_setter(module, "_compiled_call_impl", compiled_call))
    if restores:
        log.info("%d compiled module(s) above streamed units run eagerly while they stream", len(restores))
    return restores


def _holds(module: nn.Module, hooked: set[int]) -> bool:
    return any(id(m) in hooked for m in module.modules())


def _setter(module: nn.Module, attr: str, value: Any) -> _Restore:
    return lambda: setattr(module, attr, value)


def make_copy_engine(devices: DeviceService, device: torch.device) -> BufferedCopyEngine:
    """CUDA and ROCm: side-stream prefetch, pinned host memory. Elsewhere (the simulated device,
    XPU, MPS): the same static buffers, copies in order on one stream, nothing pinned (M21)."""
    simulated = devices.is_simulated(device)
    if device.type == "cuda" and not simulated:
        return BufferedCopyEngine(devices, device, CudaStreams(device), shared_pinner(device, simulated))
    return BufferedCopyEngine(devices, device, SimulatedStreams())
