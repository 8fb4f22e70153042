"""Streamer: device copies of streamed units — few, reused, in learned order (M18–M20, M23).

A handle whose units do not all fit keeps the rest in host RAM; the handle's hooks ask the
streamer for a unit's device copy on entry and give it back on exit. Per handle the streamer
keeps at most `capacity` live copies: the running unit plus those in flight
(`compute.async_offload` + 1 for `oneshot`, one for `sequence`, M20). A unit that runs again
before its copy is dropped (CFG halves, beams) reuses it (M18). It learns each unit's
successor and copies the next units ahead (M19); on CUDA those copies run on a side stream
(see `transfer.py`), elsewhere synchronously. A unit entered out of the learned order is
copied on the spot, so correctness never depends on the order. After each placement change
the handle calls `placed`: the copy engine pins host copies (M21, M22), sizes its copy
buffers and makes compiled parents of streamed units eager (M23). CUDA Graph replays are
counted with `count_replay` so `streamed_bytes` stays exact (M24).
"""
from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from .devices import DeviceService
from .transfer import CopyEngine, Lease, make_copy_engine

if TYPE_CHECKING:
    from .units import Slot, Unit

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class UnitCopy:
    """A unit's weights on the device: the copy engine's lease (tensors, ready event, buffer)."""

    unit: Unit
    lease: Lease
    nbytes: int
    refs: int = 0

    @property
    def tensors(self) -> list[torch.Tensor]:
        return self.lease.tensors


@dataclasses.dataclass(eq=False)
class _HandleCopies:
    key: int  # id of the handle: the copy engine's key
    capacity: int
    prefetch: int  # how many successors to copy ahead (0 for sequence handles, M20)
    copies: collections.OrderedDict[int, UnitCopy] = dataclasses.field(default_factory=collections.OrderedDict)
    successor: dict[int, Unit] = dataclasses.field(default_factory=dict)
    last: int | None = None
    streamed: int = 0  # bytes this handle's units were copied from host RAM
    placements: int = 0  # counts `placed` calls (a CUDA Graph checks its placement then, M24)


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
            self._handles[id(owner)] = _HandleCopies(id(owner), max(1, capacity), max(0, prefetch))
        else:
            state.capacity, state.prefetch = max(1, capacity), max(0, prefetch)

    def forget(self, owner: object) -> int:
        """Drop `owner`'s copies and learned order; returns bytes freed."""
        freed = self.drop(owner)
        self.engine.forget(id(owner))
        self._handles.pop(id(owner), None)
        return freed

    def placed(self, owner: object, root: nn.Module, streamed: list[Unit], kept: list[Slot],
               pinned_limit: int) -> None:
        """`owner`'s placement changed: `streamed` units stream, `kept` slots keep host copies."""
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
        self.streamed_bytes += nbytes
        state = self._handles.get(id(owner))
        if state is not None:
            state.streamed += nbytes

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
        self.engine.wait(copy.lease)
        if state.prefetch:
            self._prefetch(state, unit)
        return copy.tensors

    def release(self, owner: object, unit: Unit) -> None:
        state = self._handles[id(owner)]
        copy = state.copies.get(unit.index)
        if copy is not None:
            copy.refs -= 1
            self.engine.record_use(copy.lease)

    # ---- cache control -------------------------------------------------------------------
    def drop(self, owner: object | None = None) -> int:
        """Drop cached copies not in use (all handles when `owner` is None); bytes freed (M40)."""
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
        return freed

    def cached_bytes(self, owner: object) -> int:
        """Device bytes the copy engine holds for `owner` (its copies, or its copy buffers)."""
        state = self._handles.get(id(owner))
        return self.engine.held_bytes(state.key) if state else 0

    def streamed_bytes_of(self, owner: object) -> int:
        state = self._handles.get(id(owner))
        return state.streamed if state else 0

    # ---- internals -----------------------------------------------------------------------
    def _learn(self, state: _HandleCopies, unit: Unit) -> None:
        if state.last is not None and state.last != unit.index:
            state.successor[state.last] = unit
        state.last = unit.index

    def _make(self, state: _HandleCopies, unit: Unit, ahead: bool = False) -> UnitCopy:
        self._make_room(state, keep=unit.index)
        if self.cancel_check is not None:
            self.cancel_check()  # M23: every copy checks for cancellation
        copy = UnitCopy(unit, self.engine.copy_unit(state.key, unit, ahead=ahead), unit.nbytes)
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
                idle = [i for i, c in state.copies.items() if c.refs == 0]
                if len(state.copies) >= state.capacity and not idle:
                    return
                self._make(state, nxt, ahead=True)
            nxt = state.successor.get(nxt.index)
