"""Streamer: device copies of streamed units — few, reused, in learned order (M18–M20, M23).

A handle whose units do not all fit keeps the rest in host RAM; the handle's hooks ask the
streamer for a unit's device copy on entry and give it back on exit. Per handle the streamer
keeps at most `capacity` live copies: the running unit plus those in flight
(`compute.async_offload` + 1 for `oneshot`, one for `sequence`, M20). A unit that runs again
before its copy is dropped (CFG halves, beams) reuses it (M18). It learns each unit's
successor and copies the next units ahead (M19); on CUDA those copies run on a side stream
(see `transfer.py`), elsewhere synchronously. A unit entered out of the learned order is
copied on the spot, so correctness never depends on the order.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .devices import DeviceService
from .transfer import CopyEngine, make_copy_engine

if TYPE_CHECKING:
    from .units import Unit

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class UnitCopy:
    """A unit's weights on the device: one tensor per slot, and the event that marks them ready."""

    unit: Unit
    tensors: list[torch.Tensor]
    nbytes: int
    ready: object | None = None  # a device event where copies are asynchronous
    refs: int = 0


@dataclasses.dataclass(eq=False)
class _HandleCopies:
    capacity: int
    prefetch: int  # how many successors to copy ahead (0 for sequence handles, M20)
    copies: collections.OrderedDict[int, UnitCopy] = dataclasses.field(default_factory=collections.OrderedDict)
    successor: dict[int, Unit] = dataclasses.field(default_factory=dict)
    last: int | None = None
    streamed: int = 0  # bytes this handle's units were copied from host RAM


class Streamer:
    """Device copies of streamed units for one device (M18–M20)."""

    def __init__(self, devices: DeviceService, device: torch.device, engine: CopyEngine | None = None) -> None:
        self.devices = devices
        self.device = device
        self.engine = engine or make_copy_engine(devices, device)
        self.streamed_bytes = 0  # every byte copied from host RAM (M50's streamed_mb)
        self.cancel_check: Callable[[], None] | None = None  # set by the running request (M23)
        self._handles: dict[int, _HandleCopies] = {}

    # ---- registration --------------------------------------------------------------------
    def configure(self, owner: object, capacity: int, prefetch: int) -> None:
        """Set how many copies `owner` (a handle) may keep, and how far ahead to copy."""
        state = self._handles.get(id(owner))
        if state is None:
            self._handles[id(owner)] = _HandleCopies(max(1, capacity), max(0, prefetch))
        else:
            state.capacity, state.prefetch = max(1, capacity), max(0, prefetch)

    def forget(self, owner: object) -> int:
        """Drop `owner`'s copies and learned order; returns bytes freed."""
        freed = self.drop(owner)
        self._handles.pop(id(owner), None)
        return freed

    # ---- the hooks' side -----------------------------------------------------------------
    def acquire(self, owner: object, unit: Unit) -> list[torch.Tensor]:
        """The unit's device tensors, ready for use on the compute stream."""
        state = self._handles[id(owner)]
        self._learn(state, unit)
        copy = state.copies.get(unit.index)
        if copy is None:
            copy = self._make(state, unit)
        else:
            state.copies.move_to_end(unit.index)
        copy.refs += 1
        self.engine.wait(copy.ready)
        if state.prefetch:
            self._prefetch(state, unit)
        return copy.tensors

    def release(self, owner: object, unit: Unit) -> None:
        state = self._handles[id(owner)]
        copy = state.copies.get(unit.index)
        if copy is not None:
            copy.refs -= 1
            self.engine.record_use(copy.tensors)

    # ---- cache control -------------------------------------------------------------------
    def drop(self, owner: object | None = None) -> int:
        """Drop cached copies not in use (all handles when `owner` is None); bytes freed (M40)."""
        states = self._handles.values() if owner is None else [self._handles.get(id(owner))]
        freed = 0
        for state in states:
            if state is None:
                continue
            for index in [i for i, c in state.copies.items() if c.refs == 0]:
                freed += self._evict(state, index)
        return freed

    def cached_bytes(self, owner: object) -> int:
        state = self._handles.get(id(owner))
        return sum(c.nbytes for c in state.copies.values()) if state else 0

    def streamed_bytes_of(self, owner: object) -> int:
        state = self._handles.get(id(owner))
        return state.streamed if state else 0

    def cached_units(self, owner: object) -> list[int]:
        state = self._handles.get(id(owner))
        return list(state.copies) if state else []

    # ---- internals -----------------------------------------------------------------------
    def _learn(self, state: _HandleCopies, unit: Unit) -> None:
        if state.last is not None and state.last != unit.index:
            state.successor[state.last] = unit
        state.last = unit.index

    def _make(self, state: _HandleCopies, unit: Unit, ahead: bool = False) -> UnitCopy:
        self._make_room(state, keep=unit.index)
        if self.cancel_check is not None:
            self.cancel_check()  # M23: every copy checks for cancellation
        tensors, ready = self.engine.copy_unit(unit, ahead=ahead)
        copy = UnitCopy(unit, tensors, unit.nbytes, ready)
        state.copies[unit.index] = copy
        self.streamed_bytes += unit.nbytes
        state.streamed += unit.nbytes
        return copy

    def _make_room(self, state: _HandleCopies, keep: int) -> None:
        while len(state.copies) >= state.capacity:
            idle = [i for i, c in state.copies.items() if c.refs == 0 and i != keep]
            if not idle:
                return  # every copy is running (nested entry): go over capacity rather than fail
            self._evict(state, idle[0])

    def _evict(self, state: _HandleCopies, index: int) -> int:
        copy = state.copies.pop(index)
        self.engine.free(copy.tensors, copy.nbytes)
        return copy.nbytes

    def _prefetch(self, state: _HandleCopies, unit: Unit) -> None:
        """Copy the learned successors ahead while `unit` computes (M19)."""
        nxt = state.successor.get(unit.index)
        for _ in range(min(state.prefetch, state.capacity - 1)):
            if nxt is None or nxt.index == unit.index:
                return
            if nxt.index not in state.copies:
                idle = [i for i, c in state.copies.items() if c.refs == 0]
                if len(state.copies) >= state.capacity and not idle:
                    return
                self._make(state, nxt, ahead=True)
            nxt = state.successor.get(nxt.index)
