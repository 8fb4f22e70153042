"""How a unit's weights get to the device (M17–M23).

One engine, `BufferedCopyEngine`, serves every device that moves weights: CUDA and ROCm with a
side stream for copies (`CudaStreams`); the CPU-simulated device with a copy thread as its
side stream (`ThreadStreams`, standing in for a GPU's copy engine); XPU and MPS with work in
order on one stream (`SimulatedStreams`; M21: copies there are synchronous). So the strict
simulated device runs the same copy path and the same event protocol as a GPU, and none of
them allocates per step.

**Copy-buffer protection: static, event-guarded copy buffers**, not `record_stream`. Each handle
has a small pool of preallocated device buffers; a unit's tensors are views into one buffer
(each at a 512-byte offset, like the caching allocator's blocks, with the strides `.to(device)`
would give, so a streamed layer runs the same kernel as a resident one). Every buffer is
allocated on the compute stream and carries one event, recorded at allocation (the block's
previous user may still be queued), re-recorded after each write on the copy stream and after
each use on the compute stream; before a buffer is written again — on either stream — or handed
back to the allocator, the writing stream waits on that event. Why not `record_stream`: it
defers the block's reuse to the allocator, which polls events at allocation time and, when they
have not completed, takes fresh memory or stalls freeing the cache; and each step would allocate
and free one block per weight.
Static buffers allocate nothing per step, hold exactly the memory the handle's budget
counted (M16), and the single wait is explicit and cheap. Buffers are chosen best-fit (for
equal-sized units: round-robin), the pool never exceeds the `capacity` largest streamed
units, and it is released when the streamer drops the handle's copies (end of the last phase
using the handle, new placement, yielding, OOM: M32, M40). The streamer calls the engine
under its lock: one thread at a time.

Where copies run beside compute (pinned host tensors on CUDA, M21; always on the simulated
device) a unit of several copy groups (`Unit.groups`: its leaves' weights in leaf order, at
least `units.GROUP_MIN_BYTES` each) is copied group by group, each with its own event: the first on
the compute stream, the rest on the side stream, and a leaf waits only for its own weights, so
the unit's first leaves compute while its later weights are still copying. That needs no room
beyond the unit's one copy, so `sequence` handles get it too (M20: one copy, nothing copied
ahead). Prefetched copies (M19) go wholly on the side stream, made while the previous unit
computes. A unit of one group entered now, and pageable units on CUDA (synchronous, M21:
neither copied ahead nor split), are copied on the spot on the compute stream. A unit entered
out of the learned order is copied on the spot too, so correctness never depends on the order.

Copy rules (M23): copies are made outside inference mode, in the weight's own dtype. After
each placement the engine makes compiled parents of streamed units run eagerly (`compiled.py`).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from .compiled import Restore, run_compiled_eagerly
from .devices import DeviceService
from .intra_op import computing_thread
from .pinning import Pinner, shared_pinner
from .units import ALIGN

if TYPE_CHECKING:
    from .units import Slot, Unit

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class Lease:
    """A unit's weights on the device: one tensor per slot, and the engine's guard for them."""

    tensors: list[torch.Tensor]
    nbytes: int
    # Per copy group (`Unit.groups`): the event the compute stream waits on before the group's
    # leaves run (None for a group copied on the compute stream). None: the whole copy was
    # made on the compute stream.
    marks: list[Any] | None = None
    buffer: _Buffer | None = None
    waited: int = -1  # the last group the compute stream has waited for
    broken: bool = False  # a group's copy failed: the copy must not be used again


# ---- streams and events: CUDA, or a stand-in for the simulated device -----------------------
class StreamBackend(Protocol):
    def current(self) -> Any: ...
    def side(self) -> Any: ...
    def event(self) -> Any: ...
    def record(self, event: Any, stream: Any) -> None: ...
    def wait(self, stream: Any, event: Any) -> None: ...
    def copy(self, stream: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]], non_blocking: bool) -> None: ...
    def overlaps(self, pinned: bool) -> bool: ...
    def failure(self, event: Any) -> BaseException | None: ...


def _copy_pairs(pairs: list[tuple[torch.Tensor, torch.Tensor]], non_blocking: bool = False) -> None:
    for view, host in pairs:
        view.copy_(host, non_blocking=non_blocking)


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

    def copy(self, stream: torch.cuda.Stream, pairs: list[tuple[torch.Tensor, torch.Tensor]],
             non_blocking: bool) -> None:
        with torch.cuda.stream(stream):
            _copy_pairs(pairs, non_blocking)

    def overlaps(self, pinned: bool) -> bool:
        """Copies on the side stream run beside compute only from pinned memory (M21)."""
        return pinned

    def failure(self, event: torch.cuda.Event) -> None:
        return None  # CUDA reports a failed copy itself, at the next synchronizing call


class SimulatedStreams:
    """Streams where work runs in order on one stream (XPU, MPS, a simulated size on a real GPU):
    events only get logged.

    With `log` set, every record and wait is appended as (op, event id, stream) so tests can
    check the guard order that the CUDA engine relies on.
    """

    def __init__(self, log: list[tuple[str, int, str]] | None = None) -> None:
        self.log = log
        self._events = 0

    def current(self) -> str:
        return "compute"

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

    def copy(self, stream: str, pairs: list[tuple[torch.Tensor, torch.Tensor]], non_blocking: bool) -> None:
        _copy_pairs(pairs)  # in order: done when it returns

    def overlaps(self, pinned: bool) -> bool:
        """Take the side-stream path where CUDA would (pinned host tensors), for the tests' logs."""
        return pinned

    def failure(self, event: int) -> None:
        return None  # copies ran in order: a failure raised where it happened


class _Done(threading.Event):
    """Set when the work queued before a record is done; `error`: the first copy that failed
    since the record before it."""

    error: BaseException | None = None


class _Mark:
    """An event of `ThreadStreams`: done once the work queued before its last record is."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = _DONE


_DONE = _Done()
_DONE.set()

COPY_THREAD_IDLE_S = 2.0  # the copy thread ends after this long with nothing to copy


class ThreadStreams:
    """The CPU-simulated device's streams: compute is the calling thread, and the side stream is
    a copy thread standing in for a GPU's copy engine, so copies really run beside compute —
    copies made ahead (M19), and a unit's later leaves while its first leaves run (M17) — and
    the events guard a buffer exactly as they must on CUDA (a missing wait gives wrong numbers
    here, not only on a GPU).

    The copy thread runs its work in order and ends when idle (`COPY_THREAD_IDLE_S`); it runs
    with the intra-op thread count of the request that started it (`intra_op`, issue 31). A copy
    that fails is told by the event recorded after it (`failure`): the engine raises where a
    leaf waits for those weights, and drops that copy.
    """

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = False
        self._failed: BaseException | None = None  # since the last record (the copy thread's)

    def current(self) -> str:
        return "compute"

    def side(self) -> str:
        return "copy"

    def event(self) -> _Mark:
        return _Mark()

    def record(self, event: _Mark, stream: str) -> None:
        if stream == "compute":
            event.done = _DONE  # the calling thread's work is done when it records
            return
        done = _Done()
        event.done = done
        self._submit(functools.partial(self._settle, done))

    def _settle(self, done: _Done) -> None:
        done.error, self._failed = self._failed, None
        done.set()

    def wait(self, stream: str, event: _Mark) -> None:
        done = event.done
        if stream == "compute":
            done.wait()
        elif not done.is_set():
            self._submit(done.wait)

    def failure(self, event: _Mark) -> BaseException | None:
        return event.done.error

    def copy(self, stream: str, pairs: list[tuple[torch.Tensor, torch.Tensor]], non_blocking: bool) -> None:
        if stream == "compute":
            _copy_pairs(pairs)
        else:
            self._submit(functools.partial(_copy_pairs, pairs))

    def overlaps(self, pinned: bool) -> bool:
        return True

    def _submit(self, work: Callable[[], object]) -> None:  # what `work` returns is not used
        with self._lock:
            self._work.put(work)
            if not self._running:
                self._running = True
                computing_thread(self._run, name="mizuoto-copy", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                work = self._work.get(timeout=COPY_THREAD_IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._work.empty():
                        self._running = False
                        return
                continue
            try:
                with torch.no_grad():
                    work()
            except Exception as error:  # noqa: BLE001 -- told by the next event (`failure`)
                self._failed = self._failed or error


# ---- static, event-guarded copy buffers ---------------------------------------------------
@dataclasses.dataclass(eq=False)
class _Buffer:
    data: torch.Tensor  # uint8, on the device
    nbytes: int
    done: Any  # event: at allocation, then after each write (copy stream) or use (compute stream)
    stream: Any  # the stream it was allocated on (where the allocator reuses it)
    busy: bool = False
    views: dict[_Layout, list[torch.Tensor]] = dataclasses.field(default_factory=dict)  # made once per layout
    marks: list[Any] = dataclasses.field(default_factory=list)  # an event per copy group but the last, reused


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
        self._eager: dict[int, list[Restore]] = {}  # key -> compiled modules made eager (M23)

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
        """Only copies that run beside compute are made ahead: a pageable copy blocks the host
        anyway (M21)."""
        return self.streams.overlaps(self._layout_of(self._pool(key), unit).pinned)

    def fits(self, key: int, unit: Unit, held: Sequence[Lease]) -> bool:
        """Whether `unit`'s copy can be made beside the copies `held` within the pool's limit,
        once every other copy is freed: a buffer none of them holds is large enough, or their
        buffers plus a new one of its size stay within the limit (`_take` releases the others
        first). A handle not placed yet has no limit."""
        pool = self._pool(key)
        if not pool.limit:
            return True
        need = self._layout_of(pool, unit).nbytes
        busy = {id(lease.buffer) for lease in held if lease.buffer is not None}
        if any(b.nbytes >= need for b in pool.buffers if id(b) not in busy):
            return True
        return sum(b.nbytes for b in pool.buffers if id(b) in busy) + need <= pool.limit

    # ---- copies --------------------------------------------------------------------------
    def copy_unit(self, key: int, unit: Unit, ahead: bool) -> Lease:
        """The unit's copy, started: on the side stream group by group where copies run beside
        compute and it is made ahead or has several groups (each group's leaves wait only for
        it: `wait_group`); else on the spot, where a small unit's copy costs least."""
        pool = self._pool(key)
        layout = self._layout_of(pool, unit)
        buffer = self._take(pool, layout.nbytes)
        try:
            views = buffer.views.get(layout)
            if views is None:  # units of one shape share them: nothing is made per step
                with torch.inference_mode(False):  # M23: normal tensors, the resident kernels
                    views = buffer.views[layout] = _views(buffer.data, layout)
            # Writing into a normal tensor keeps it normal, in inference mode too.
            split = self.streams.overlaps(layout.pinned) and (ahead or len(unit.groups) > 1)
            marks = self._fill(buffer, views, [_host_of(s) for s in unit.slots], layout,
                               unit.groups if split else [], ahead)
        except BaseException:
            buffer.busy = False
            raise
        return Lease(views, unit.nbytes, marks, buffer)

    def _fill(self, buffer: _Buffer, views: list[torch.Tensor], hosts: list[torch.Tensor],
              layout: _Layout, groups: list[tuple[int, ...]], ahead: bool) -> list[Any] | None:
        """Copy `hosts` into `views`. With `groups`: one event per group; the groups go on the
        side stream — but for a unit entered now the first, which is needed at once, goes on
        the compute stream after the rest are queued (it costs no hand-over, and the side stream
        copies the next group meanwhile). Without: on the spot on the compute stream (pinned:
        asynchronous; pageable: synchronous, M21)."""
        streams = self.streams
        compute = streams.current()
        if not groups:
            streams.wait(compute, buffer.done)  # e.g. an unused prefetch into it may be in flight
            streams.copy(compute, list(zip(views, hosts)), non_blocking=layout.pinned)
            return None
        side = streams.side()
        while len(buffer.marks) < len(groups) - 1:
            buffer.marks.append(streams.event())
        # The last group's event is the buffer's own: waiting for it is waiting for the copy.
        marks = [*buffer.marks[:len(groups) - 1], buffer.done]
        here = 0 if ahead else 1  # groups copied on the compute stream
        if here:
            streams.wait(compute, buffer.done)  # the buffer's previous use is over
        streams.wait(side, buffer.done)
        for group, mark in zip(groups[here:], marks[here:]):
            streams.copy(side, [(views[i], hosts[i]) for i in group], non_blocking=True)
            streams.record(mark, side)
        if here:  # ordered on the compute stream: nothing to wait for
            streams.copy(compute, [(views[i], hosts[i]) for i in groups[0]], non_blocking=True)
            marks[0] = None
        return marks

    def wait_group(self, lease: Lease, group: int) -> None:
        """The compute stream waits until the lease's groups up to `group` are copied; raises if
        one of them failed (the copy is then `broken`: never used again)."""
        failed = self._wait(lease, group)
        if failed is not None:
            raise RuntimeError(f"copying a streamed unit's weights to {self.device} failed: {failed}") from failed

    def _wait(self, lease: Lease, group: int) -> BaseException | None:
        if lease.marks is None or group <= lease.waited:
            return None
        mark = lease.marks[group]
        if mark is not None:
            self.streams.wait(self.streams.current(), mark)
        failures = [self.streams.failure(m) for m in lease.marks[lease.waited + 1:group + 1] if m is not None]
        lease.waited = group
        failed = next((f for f in failures if f is not None), None)
        lease.broken = lease.broken or failed is not None
        return failed

    def is_ready(self, lease: Lease) -> bool:
        """Whether the compute stream has waited for the whole copy (or it was made on it)."""
        return not lease.broken and (lease.marks is None or lease.waited >= len(lease.marks) - 1)

    def record_use(self, lease: Lease) -> None:
        if lease.buffer is None:
            return
        # Leaves that did not run left their groups unwaited: order the buffer's next user after
        # those copies too (the allocator may hand the block to compute work when it is freed).
        # Their weights were not read, so a failure there only marks the copy broken.
        self._wait(lease, len(lease.marks) - 1 if lease.marks else -1)
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


def make_copy_engine(devices: DeviceService, device: torch.device) -> BufferedCopyEngine:
    """CUDA and ROCm: a side stream for copies, pinned host memory. The CPU-simulated device: a
    copy thread as the side stream, nothing pinned. XPU, MPS (and a simulated size on a real
    GPU): the same static buffers, copies in order on one stream, nothing pinned (M21)."""
    simulated = devices.is_simulated(device)
    if device.type == "cuda" and not simulated:
        return BufferedCopyEngine(devices, device, CudaStreams(device), shared_pinner(device, simulated))
    if device.type == "cpu" and simulated:
        return BufferedCopyEngine(devices, device, ThreadStreams())
    return BufferedCopyEngine(devices, device, SimulatedStreams())
