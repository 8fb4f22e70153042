"""Streamer: device copies of streamed units — few, reused, in learned order (M18–M20, M23).

A handle whose units do not all fit keeps the rest in host RAM; the handle's hooks ask the
streamer for a unit's device copy when a thread enters the unit and give it back when the
thread leaves it. Per handle the streamer keeps at most `capacity` copies: the running unit
plus those in flight (`compute.async_offload` + 1 for `oneshot`, one for `sequence`, M20).

* Threads (two requests sharing one handle, M8). Everything here runs under `lock`, one
  thread at a time. A thread entering a unit another thread is inside shares its copy (a
  module's weights are one attribute: every caller sees the same tensor); the copy stays until
  the last of them leaves. A thread that needs a new copy while every copy is in use by other
  threads waits for one to be released — cancellably — so concurrent calls never hold more
  than the handle's minimum working set counted (M16). A thread already inside a unit never
  waits (that could deadlock); it goes over capacity instead, like a nested entry.
* Kept copies (M18). When the last thread leaves a unit its copy stays — so a unit entered
  leaf by leaf (VoxCPM's `forward_step` runs a layer's submodules directly) is copied once per
  step, not once per leaf — until its room is needed: a kept copy is room the placement counted
  for copies, and it is dropped (least recently used first) the moment another unit's copy
  needs that room, in number (`capacity`) or in bytes (the copy engine's limit). When another
  thread waits for room, a copy the learned order does not bring back goes at once. The
  manager drops the rest when the last phase using the handle ends.
* Learned order (M19). Each thread's previous unit is its own; a thread's order starts afresh
  with each phase (`end_call`), so successors never cross a phase boundary. The copies of the
  next units are made ahead (on a side stream, see `transfer.py`). A unit entered out of the
  learned order is copied on the spot: correctness never depends on the order.
* Per leaf (M17). Where copies run beside compute, a unit of several copy groups (its
  leaves' weights in leaf order, see `transfer.py`) is copied group by group; the handle's
  leaf hooks wait for their own group (`ready`), so a unit's first leaves run while its later
  weights still copy — within the unit's one copy, for `sequence` handles too.
* Per request (M23, M50). The request running on a thread is `charging` the streamers: its
  cancel check runs before every copy, and the bytes copied for it are counted in its own
  `StreamCharge`, never mixed with another request's.

After each placement change the handle calls `placed`: the copy engine pins host copies (M21,
M22), sizes its copy buffers and makes compiled parents of streamed units eager (M23). CUDA
Graph replays are counted with `count_replay` so streamed bytes stay exact (M24).

Invariants (tested as properties on random module trees, `tests/memory/test_placement_properties.py`,
and on real models at three device sizes, `tests/support/placement.py`):

1. A handle's copies never hold more device bytes than the room its placement counted for them
   (`UnitPlan.min_working_set` less the fixed part: its `capacity` largest units, each as its
   aligned copy buffer holds it) — kept, running and copied-ahead copies together — unless a
   thread enters a unit from inside another unit of the same handle (nested entry goes over
   rather than deadlock; the unit plan keeps a layer two units call in the fixed part, so
   module trees do not do this). So streaming never runs the device out of memory and never
   pushes resident units out.
2. Each streamed unit is copied at most once per call in a learned order (leaf by leaf too),
   plus the next call's first copies made ahead by the last one: a request never copies more
   than with every unit streamed (`vram_mode = none`), and copies no more on a larger device.
3. When a request's phase ends no thread is inside a unit, no copy has a reference, and once
   no request uses the handle no copy is left (`drop`): the device counts what handles hold.
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from .devices import DeviceService
from .profiling import label
from .transfer import BufferedCopyEngine, Lease, make_copy_engine

if TYPE_CHECKING:
    from .units import Slot, Unit

log = logging.getLogger(__name__)

# How long a thread waits for another thread to release a copy before going over capacity.
COPY_WAIT_S = 600.0
_POLL_S = 0.5  # cancellation is checked this often while waiting


@dataclasses.dataclass(eq=False)
class StreamCharge:
    """What one request is charged by the streamers: bytes copied for it from host RAM (its
    `meta.memory.streamed_mb`, M50) and its cancel check, run before every copy (M23)."""

    cancel_check: Callable[[], None] | None = None
    streamed_bytes: int = 0
    by_owner: dict[int, int] = dataclasses.field(default_factory=dict)  # id(handle) -> its bytes of these

    def check(self) -> None:
        if self.cancel_check is not None:
            self.cancel_check()


_charge: contextvars.ContextVar[StreamCharge | None] = contextvars.ContextVar("mizuoto_stream_charge", default=None)


@contextlib.contextmanager
def charging(charge: StreamCharge) -> Iterator[StreamCharge]:
    """Charge the copies this thread makes in the block to `charge` (a request's phase)."""
    token = _charge.set(charge)
    try:
        yield charge
    finally:
        _charge.reset(token)


class _Inside(threading.local):
    """How many units (any handle) the current thread is inside: such a thread never waits."""

    units = 0


_inside = _Inside()


@dataclasses.dataclass(eq=False)
class UnitCopy:
    """A unit's weights on the device: the copy engine's lease, and how many threads use it."""

    unit: Unit
    lease: Lease
    nbytes: int
    refs: int = 0

    @property
    def tensors(self) -> list[torch.Tensor]:
        return self.lease.tensors


class _Order(threading.local):
    """A thread's previous unit in one handle (M19: learned per call, reset per phase)."""

    last: int | None = None


@dataclasses.dataclass(eq=False)
class _HandleCopies:
    key: int  # id of the handle: the copy engine's key
    capacity: int
    prefetch: int  # how many successors to copy ahead (0 for sequence handles, M20)
    copies: collections.OrderedDict[int, UnitCopy] = dataclasses.field(default_factory=collections.OrderedDict)
    successor: dict[int, Unit] = dataclasses.field(default_factory=dict)
    repeats: set[int] = dataclasses.field(default_factory=set)  # units that ran twice in a row
    order: _Order = dataclasses.field(default_factory=_Order)
    streamed: int = 0  # bytes this handle's units were copied from host RAM
    placements: int = 0  # counts `placed` calls (a CUDA Graph checks its placement then, M24)
    name: str = ""  # the handle's, in profiler labels


class Streamer:
    """Device copies of streamed units for one device (M18–M20)."""

    def __init__(self, devices: DeviceService, device: torch.device, engine: BufferedCopyEngine | None = None) -> None:
        self.devices = devices
        self.device = device
        self.engine = engine or make_copy_engine(devices, device)
        self.streamed_bytes = 0  # every byte copied from host RAM on this device, all requests together
        # The handles' hooks and the copy engine run under it. A plain lock (entered several
        # times per unit, a `Condition`'s own enter and exit are Python calls); waiting for a
        # copy to be released goes through `_released`, which releases it.
        self.lock = threading.RLock()
        self._released = threading.Condition(self.lock)
        self._waiting = 0  # threads waiting in `_copy_for` for a copy to be released
        self._handles: dict[int, _HandleCopies] = {}

    # ---- registration --------------------------------------------------------------------
    def configure(self, owner: object, capacity: int, prefetch: int, name: str = "") -> None:
        """Set how many copies `owner` (a handle, `name` in profiler labels) may keep, and how
        far ahead to copy."""
        with self.lock:
            state = self._handles.get(id(owner))
            if state is None:
                self._handles[id(owner)] = _HandleCopies(id(owner), max(1, capacity), max(0, prefetch), name=name)
            else:
                state.capacity, state.prefetch, state.name = max(1, capacity), max(0, prefetch), name

    def forget(self, owner: object) -> int:
        """Drop `owner`'s copies and learned order; returns bytes freed."""
        with self.lock:
            freed = self.drop(owner)
            self.engine.forget(id(owner))
            self._handles.pop(id(owner), None)
            return freed

    def placed(self, owner: object, root: nn.Module, streamed: list[Unit], kept: list[Slot],
               pinned_limit: int) -> None:
        """`owner`'s placement changed: `streamed` units stream, `kept` slots keep host copies."""
        with self.lock:
            state = self._handles.get(id(owner))
            if state is None:
                return  # forgotten (unloaded): nothing streams
            state.placements += 1
            self.engine.placed(state.key, root, streamed, kept, state.capacity, pinned_limit)

    def placements(self, owner: object) -> int:
        state = self._handles.get(id(owner))
        return state.placements if state else 0

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        """Whether a host tensor is page-locked by this streamer's pinner (M21, M22)."""
        return self.engine.is_pinned(tensor)

    def count_replay(self, owner: object, nbytes: int) -> None:
        """Bytes a CUDA Graph replay copied from host RAM for `owner` (M24, M50)."""
        with self.lock:
            self._count(self._handles.get(id(owner)), nbytes)

    # ---- the hooks' side --------------------------------------------------------------------
    def acquire(self, owner: object, unit: Unit) -> list[torch.Tensor]:
        """The unit's device tensors for the calling thread, ready on the compute stream."""
        with self.lock:
            state = self._handles[id(owner)]
            self._learn(state, unit)
            copy = self._copy_for(state, unit)
            copy.refs += 1
            _inside.units += 1
            try:
                if state.prefetch:
                    self._prefetch(state, unit)  # its copies check for cancellation too
            except BaseException:
                self.release(owner, unit)
                raise
            return copy.tensors

    def is_ready(self, owner: object, unit: Unit) -> bool:
        """Whether the whole of `unit`'s copy is ready for the compute stream (else each leaf
        waits for its own group: `ready`)."""
        return self.engine.is_ready(self._handles[id(owner)].copies[unit.index].lease)

    def ready(self, owner: object, unit: Unit, group: int) -> list[torch.Tensor]:
        """`unit`'s device tensors, once its copy groups up to `group` are ready for the compute
        stream (a leaf about to run waits only for its own weights)."""
        with self.lock:
            copy = self._handles[id(owner)].copies[unit.index]
            self.engine.wait_group(copy.lease, group)
            return copy.tensors

    def users(self, owner: object, unit: Unit) -> int:
        """How many threads are inside `unit` now."""
        copy = self._handles[id(owner)].copies.get(unit.index)
        return copy.refs if copy is not None else 0

    def release(self, owner: object, unit: Unit) -> None:
        """The calling thread left `unit`. Its copy goes now only when another thread waits for
        room and the learned order does not bring the unit back; otherwise it stays until the
        next copy needs its room. Upstream code that runs a layer's submodules directly (VoxCPM's
        `forward_step`) enters the unit once per leaf, and an eager drop would copy it again for
        the next leaf."""
        with self.lock:
            state = self._handles[id(owner)]
            copy = state.copies.get(unit.index)
            if copy is None:
                return
            copy.refs -= 1
            _inside.units = max(0, _inside.units - 1)
            self.engine.record_use(copy.lease)
            if copy.refs == 0 and (copy.lease.broken or self._waiting and not self._may_run_again(state, unit)):
                self._evict(state, unit.index)  # a broken copy (a failed group) is made again
            if self._waiting:
                self._released.notify_all()

    def end_call(self, owner: object) -> None:
        """The calling thread's phase with `owner` ended: its learned order starts afresh (M19)."""
        state = self._handles.get(id(owner))
        if state is not None:
            state.order.last = None

    # ---- cache control -------------------------------------------------------------------
    def drop(self, owner: object | None = None) -> int:
        """Drop cached copies not in use (all handles when `owner` is None); bytes freed (M40)."""
        with self.lock:
            states = self._handles.values() if owner is None else [self._handles.get(id(owner))]
            freed = 0
            for state in states:
                if state is None:
                    continue
                held = self.engine.held_bytes(state.key)
                for index in [i for i, c in state.copies.items() if c.refs == 0]:
                    self._evict(state, index)
                self.engine.trim(state.key)  # copy buffers kept for reuse go too
                freed += held - self.engine.held_bytes(state.key)
            if self._waiting:
                self._released.notify_all()
            return freed

    def cached_bytes(self, owner: object) -> int:
        """Device bytes the copy engine holds for `owner` (its copy buffers)."""
        state = self._handles.get(id(owner))
        return self.engine.held_bytes(state.key) if state else 0

    def live_copies(self, owner: object) -> int:
        """Copies of `owner`'s units on the device now (in use, kept for reuse, or ahead)."""
        state = self._handles.get(id(owner))
        return len(state.copies) if state else 0

    def streamed_bytes_of(self, owner: object) -> int:
        state = self._handles.get(id(owner))
        return state.streamed if state else 0

    # ---- internals -----------------------------------------------------------------------
    def _learn(self, state: _HandleCopies, unit: Unit) -> None:
        last = state.order.last
        if last == unit.index:
            state.repeats.add(unit.index)
        elif last is not None:
            state.successor[last] = unit
        state.order.last = unit.index

    def _may_run_again(self, state: _HandleCopies, unit: Unit) -> bool:
        """Whether `unit` may run again while its copy could stay (M18): nothing is learned yet
        about what follows it, or the learned order brings it back within the copies the handle
        may keep (a repeat: CFG halves, beams)."""
        if unit.index in state.repeats or unit.index not in state.successor:
            return True
        nxt = state.successor.get(unit.index)
        for _ in range(state.capacity - 1):
            if nxt is None:
                return False
            if nxt.index == unit.index:
                return True
            nxt = state.successor.get(nxt.index)
        return False

    def _copy_for(self, state: _HandleCopies, unit: Unit) -> UnitCopy:
        """The unit's copy: shared if present, else made — after waiting for room if every copy
        is in use by other threads and this thread is inside no unit."""
        deadline: float | None = None
        while True:
            copy = state.copies.get(unit.index)
            if copy is not None:
                state.copies.move_to_end(unit.index)
                return copy
            if self._has_room(state, unit) or _inside.units > 0:
                return self._make(state, unit)
            charge = _charge.get()
            if charge is not None:
                charge.check()
            if deadline is None:
                deadline = time.monotonic() + COPY_WAIT_S
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("waited %.0f s for another request to release a streamed copy; copying anyway",
                            COPY_WAIT_S)
                return self._make(state, unit)
            self._waiting += 1
            try:
                self._released.wait(timeout=min(remaining, _POLL_S))
            finally:
                self._waiting -= 1

    def _has_room(self, state: _HandleCopies, unit: Unit) -> bool:
        """Whether `unit`'s copy fits once the copies no thread is inside are dropped: fewer
        copies in use than the handle may keep, and their buffers plus this copy within the
        bytes the placement counted for copies."""
        running = [c.lease for c in state.copies.values() if c.refs > 0]
        return len(running) < state.capacity and self.engine.fits(state.key, unit, running)

    def _make(self, state: _HandleCopies, unit: Unit, ahead: bool = False) -> UnitCopy:
        self._make_room(state, unit)
        charge = _charge.get()
        if charge is not None:
            charge.check()  # M23: every copy checks for cancellation
        with label("mizuoto::copy_ahead" if ahead else "mizuoto::copy", state.name, unit.name):
            copy = UnitCopy(unit, self.engine.copy_unit(state.key, unit, ahead=ahead), unit.nbytes)
        state.copies[unit.index] = copy
        self._count(state, unit.nbytes)
        return copy

    def _count(self, state: _HandleCopies | None, nbytes: int) -> None:
        self.streamed_bytes += nbytes
        if state is not None:
            state.streamed += nbytes
        charge = _charge.get()
        if charge is not None:
            charge.streamed_bytes += nbytes
            if state is not None:
                charge.by_owner[state.key] = charge.by_owner.get(state.key, 0) + nbytes

    def _make_room(self, state: _HandleCopies, unit: Unit) -> None:
        """Drop kept copies, least recently used first, until `unit`'s copy fits beside the
        others in number (`capacity`) and in bytes (the copy engine's limit): a kept copy is
        room the placement counted, given up the moment another unit needs it."""
        while len(state.copies) >= state.capacity or not self.engine.fits(
                state.key, unit, [c.lease for c in state.copies.values()]):
            idle = next((i for i, c in state.copies.items() if c.refs == 0 and i != unit.index), None)
            if idle is None:
                return  # every copy is running (nested entry): go over capacity rather than fail
            self._evict(state, idle)

    def _evict(self, state: _HandleCopies, index: int) -> int:
        copy = state.copies.pop(index)
        self.engine.free(state.key, copy.lease)
        return copy.nbytes

    def _prefetch(self, state: _HandleCopies, unit: Unit) -> None:
        """Copy the learned successors ahead while `unit` computes (M19)."""
        nxt = state.successor.get(unit.index)
        for _ in range(min(state.prefetch, state.capacity - 1)):
            if nxt is None or nxt.index == unit.index:
                return
            if nxt.index not in state.copies:
                if not self.engine.can_prefetch(state.key, nxt):
                    return  # pageable: copied on the spot when entered (M21)
                if not self._has_room(state, nxt):
                    return
                self._make(state, nxt, ahead=True)
            nxt = state.successor.get(nxt.index)
