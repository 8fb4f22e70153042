"""ModelManager: budgets, yielding and placement for every component on a device (M6–M9, M30–M33).

`load(handles, memory)` (M6):
1. needed = what the mode will put on the device for the handles (whole, or for `low`/`none`
   and capped handles what that placement holds, issue 17 item 5) + working memory ×
   calibration + reserve (`compute.vram_reserve_mb`, else the external accounting's own, else
   the default), counted against what the handles already hold;
2. free = the device service's free memory plus what an external accounting would give up on
   demand (ComfyUI's dynamic VRAM), capped by `compute.vram_limit_mb`;
3. if short, idle components yield (M30 order, unit by unit in reverse placement order, M32),
   after asking an external accounting (ComfyUI, M35) to free its own models first;
4. load whole if it fits, else split the budget (M33) and load partially.
An estimate never refuses (M7): below the minimum working set the load is tried at the minimum.

Requests (M8, M31). `compute.gpu_jobs = N`: at most N requests hold a device at once — each
phase holds one of the device's slots (`slots.py`) while it runs; `exclusive(device)` takes
them all (M60: a training job owns the device). Two requests may use one handle at once: a
handle in use keeps its placement — the manager budgets around what it holds (its placement
and its streamer copies) and never re-places or yields it until the last request using it
releases it (an OOM's cap, M40, applies when it is next placed); then its copies are dropped,
so an idle component holds only its placement.
A request waits only for other requests: what its own thread's phases hold (a phase nested in
another) is never waited for.

Invariants of placement (tested as properties on random module trees and devices,
`tests/memory/test_placement_properties.py`; on real models, `tests/support/placement.py`):

1. A device smaller than the phase's minimum working sets (M16, `_check_device_size`) refuses
   the phase in one line ("needs at least") before anything is placed or copied; on any larger
   device it runs, and its output equals the plain run (M7: an estimate never refuses — below
   the minimum working set plus the working-memory estimate it is tried at the minimum).
2. The device never counts more than its size, nor more than the placements accounted for:
   each handle's placement plus, where units stream, its copies' room (`_footprint`).
3. For the same request, a larger device never keeps fewer resident bytes (units are placed
   greedily largest first — `oneshot` — or in run order, and the resident sum grows with the
   budget) and never streams more; no VRAM mode streams more than `none` on the same device.
4. After a request, no handle is in use, no copy is left, and the device counts exactly what
   the handles hold (`device_bytes`).
"""
from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from ..errors import DeviceTooSmallError, MizuotoError
from .calibration import Calibration
from .devices import DeviceService
from .handle import Kind, ModelHandle
from .phases import RequestContext
from .policy import VramPolicy
from .report import REASON_BUDGET, REASON_CAPPED, REASON_MODE, REASON_YIELDED, Placement, RequestLog
from .slots import DeviceSlots
from .streamer import Streamer

log = logging.getLogger(__name__)

# M8: how long a request waits for another to release the device.
GPU_JOB_WAIT_S = 600.0
# `low` mode keeps this share of the streamable weights resident (M9).
LOW_MODE_RESIDENT_SHARE = 0.25
# The placement log keeps the latest entries only: a server runs for weeks.
EVENTS_KEPT = 1000


def _check_device_size(total: int, handles: Sequence[ModelHandle]) -> None:
    """M7's one refusal before trying: an estimate never refuses, but a device whose whole size is
    below the phase's minimum working set (M16) can never run it — say so in one line."""
    need = sum(h.min_working_set for h in handles)
    if need <= total:
        return
    what = handles[0].name if len(handles) == 1 else " and ".join(h.name for h in handles)
    parts = "" if len(handles) == 1 else " (" + ", ".join(f"{h.name} {h.min_working_set / 2**20:.1f} MB"
                                                       for h in handles) + ")"
    raise DeviceTooSmallError(f"{what} needs at least {need / 2**20:.1f} MB on the device{parts}; "
                              f"the device has {total / 2**20:.1f} MB")


class EventLog(list[tuple[str, str, int]]):
    """The placement log, (action, component, bytes): a list keeping the latest EVENTS_KEPT."""

    def append(self, event: tuple[str, str, int]) -> None:
        super().append(event)
        if len(self) > EVENTS_KEPT:
            del self[: len(self) - EVENTS_KEPT]


class _Held(threading.local):
    """The handles the calling thread's phases hold in use now (nested phases add up)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[ModelHandle] = collections.Counter()


class ExternalAccounting(Protocol):
    """Another memory manager on the same device (ComfyUI, M35). `free_for` and `on_placed` are
    required; an accounting may also define (`ModelManager._ask` calls them where present):
    `on_released(handles)` (a phase ended), `reserve_bytes(device) -> int | None` (its own VRAM
    reserve), `reclaimable_bytes(device) -> int` (used VRAM it gives up on demand) and
    `is_oom(exc) -> bool` (what it counts as out of memory, M40)."""

    def free_for(self, device: torch.device, nbytes: int, keep: Sequence[ModelHandle]) -> int: ...
    def on_placed(self, handles: Sequence[ModelHandle]) -> None: ...


class ModelManager:
    """Places components for phases, makes idle ones yield, and records what happened."""

    def __init__(
        self,
        devices: DeviceService | None = None,
        policy: VramPolicy | None = None,
        *,
        wait_timeout_s: float = GPU_JOB_WAIT_S,
        calibration: Calibration | None = None,
    ) -> None:
        self.devices = devices or DeviceService()
        self.policy = policy or VramPolicy()
        self.wait_timeout_s = wait_timeout_s
        self.handles: list[ModelHandle] = []
        self.external: ExternalAccounting | None = None
        self.calibration = calibration or Calibration()  # M47: factors on working-memory estimates
        self.events = EventLog()  # the placement log: (action, component, bytes)
        self.requests = RequestLog()  # the last requests' reports (M50; the route's `requests`)
        self._streamers: dict[str, Streamer] = {}
        self._slots: dict[str, DeviceSlots] = {}
        self._unload_pending: list[ModelHandle] = []  # unregistered while in use (M31)
        self._held = _Held()  # what this thread's own phases hold: never waited for (M8)
        self._cond = threading.Condition(threading.RLock())

    # ---- components ----------------------------------------------------------------------
    def streamer(self, device: torch.device) -> Streamer:
        key = str(device)
        if key not in self._streamers:
            self._streamers[key] = Streamer(self.devices, device)
        return self._streamers[key]

    def streamed_bytes(self) -> int:
        """Bytes copied from host RAM on every device so far, all requests and jobs together
        (what one request streamed is its own `meta.memory.streamed_mb`, M50)."""
        return sum(s.streamed_bytes for s in self._streamers.values())

    def slots(self, device: torch.device) -> DeviceSlots:
        """The device's request slots: `compute.gpu_jobs` of them (M8, M60)."""
        with self._cond:
            key = str(device)
            if key not in self._slots:
                self._slots[key] = DeviceSlots(key, lambda: self.policy.gpu_jobs)
            return self._slots[key]

    def register(
        self, module: nn.Module, *, engine: str, name: str, kind: Kind = "oneshot",
        graphable: bool = False, device: torch.device | None = None,
    ) -> ModelHandle:
        """A handle for `module`. A module (or one inside or around it) already registered is an
        error naming the handle that holds it: two handles would move the same weights."""
        device = device or self.devices.compute_device()
        label = f"{engine}:{name}" if engine else name
        with self._cond:
            self._check_unregistered(module, label)
            handle = ModelHandle(
                module, devices=self.devices, policy=self.policy, streamer=self.streamer(device),
                device=device, kind=kind, engine=engine, name=name, graphable=graphable,
            )
            self.handles.append(handle)
        return handle

    def _check_unregistered(self, module: nn.Module, label: str) -> None:
        inside = {id(m) for m in module.modules()}
        for h in self.handles:
            if h.unloaded:
                continue  # its module holds no weights: the handle says so if used again
            if id(h.module) in inside or any(m is module for m in h.module.modules()):
                raise MizuotoError(f"{label}: the module is already registered as {self.key(h)}; "
                                   f"use that handle, or unregister it first")

    def unregister(self, handle: ModelHandle) -> None:
        """Forget `handle` and free all it holds (M26). One in use by a request leaves the
        registry now and is unloaded when that request releases it (M31)."""
        with self._cond:
            if handle in self.handles:
                self.handles.remove(handle)
            if handle.in_use:
                log.info("%s is in use: it unloads when its phase ends", self.key(handle))
                self._unload_pending.append(handle)
                return
            handle.unload()

    def key(self, handle: ModelHandle) -> str:
        return handle.key

    def request(self, *, generator: torch.Generator | None = None,
                cancel_check: Callable[[], None] | None = None,
                on_progress: Callable[[int, int], None] | None = None) -> RequestContext:
        """A new request: its phases place this manager's components (`phases.py`)."""
        return RequestContext(self, generator=generator, cancel_check=cancel_check, on_progress=on_progress)

    @contextlib.contextmanager
    def exclusive(self, device: torch.device, *, who: str = "a training job",
                  cancel_check: Callable[[], None] | None = None,
                  timeout_s: float | None = None) -> Iterator[int]:
        """M60 (`JobSpec.exclusive`): take every slot of `device` for the block — waiting for the
        requests holding it to end, cancellably, within the wait bound (M8) — then move every
        idle component off it (M34); the block gets the bytes freed. Requests wait until the
        block ends. The placement log shows the hold: ``("exclusive", who, 0)`` before the
        yields it caused, ``("exclusive_end", who, 0)`` when it ends."""
        timeout = self.wait_timeout_s if timeout_s is None else timeout_s
        with self.slots(device).exclusive(who, cancel_check, timeout):
            self.events.append(("exclusive", who, 0))
            try:
                freed = self.offload_idle(device=device)
                if freed:
                    self.devices.empty_cache(device)
                log.info("%s holds %s exclusively (%.1f MB of idle components moved off)", who, device,
                         freed / 2**20)
                yield freed
            finally:
                self.events.append(("exclusive_end", who, 0))

    # ---- placement -----------------------------------------------------------------------
    def acquire(self, handles: Sequence[ModelHandle], memory: int = 0, *, phase: str = "",
                cancel_check: Callable[[], None] | None = None,
                noted: set[ModelHandle] | None = None) -> list[Placement]:
        """Hold a slot of the device (M8), place `handles` for a phase and mark them in use (M2,
        M31) until `release`. `noted`: see `ModelHandle.load`."""
        slots = self.phase_slots(handles)
        if slots is not None:
            slots.take(cancel_check, self.wait_timeout_s)
        try:
            with self._cond:
                placements = self.load(handles, memory, phase=phase, cancel_check=cancel_check, noted=noted)
                for h in handles:
                    h.in_use += 1
                    h.last_used = time.monotonic()
                    self._held.counts[h] += 1
        except BaseException:
            if slots is not None:
                slots.give()
            raise
        return placements

    def release(self, handles: Sequence[ModelHandle]) -> None:
        """The phase ended: the calling thread leaves the handles' units (`end_call`); a handle
        no request uses any more drops its streamer copies (or unloads, if unregistered)."""
        try:
            for h in dict.fromkeys(handles):
                h.end_call()
            with self._cond:
                for h in handles:
                    h.in_use = max(0, h.in_use - 1)
                    h.last_used = time.monotonic()
                    self._held.counts[h] -= 1
                self._held.counts = +self._held.counts  # forget what this thread no longer holds
                for h in dict.fromkeys(handles):
                    if not h.in_use:
                        self._idle(h)
                self._ask("on_released", None, handles)
                self._cond.notify_all()
        finally:
            slots = self.phase_slots(handles)
            if slots is not None:
                slots.give()

    def _idle(self, handle: ModelHandle) -> None:
        if handle in self._unload_pending:
            self._unload_pending.remove(handle)
            handle.unload()
        elif not handle.unloaded:
            handle.streamer.drop(handle)  # no copy outlives the phases that used it

    def phase_slots(self, handles: Sequence[ModelHandle]) -> DeviceSlots | None:
        """The slots a phase holds: its device's, where weights move (none on plain CPU, M5)."""
        if not handles or not self.devices.moves(handles[0].device):
            return None
        return self.slots(handles[0].device)

    def load(self, handles: Sequence[ModelHandle], memory: int = 0, *, phase: str = "",
             cancel_check: Callable[[], None] | None = None,
             noted: set[ModelHandle] | None = None) -> list[Placement]:
        """M6: place `handles` with room for `memory` bytes of working memory. `noted`: the
        handles whose placement below their minimum working set the request has said already
        (`ModelHandle.load`)."""
        handles = list(dict.fromkeys(handles))
        if not handles:
            return []
        device = handles[0].device
        if not self.devices.moves(device):
            # M5: nothing moves and nothing is counted; the report says the weights are all where
            # the model runs (host RAM is the device).
            return [Placement(self.key(h), phase, h.size_bytes, h.size_bytes) for h in handles]
        _check_device_size(self.devices.total_bytes(device), handles)
        with self._cond:
            working = int(memory * self._factor(handles, phase))
            reserve = self.reserve_bytes(device)
            # M6.1, counted against what the handles already hold (see `_available`).
            self._make_room(device, working + reserve, handles, cancel_check)
            # In use by another request (maybe since `_make_room` waited): its placement stays (M31).
            movable = [h for h in handles if not h.in_use]
            held = sum(_footprint(h) for h in handles if h.in_use)
            available = self._available(device, handles)
            budgets, reasons = self._budgets(movable, available - held - working - reserve)
            placements = []
            for h in handles:
                placed = 0
                if h in movable:
                    placed = h.load(budgets[h], stream_all=self.policy.vram_mode == "none", noted=noted)
                    self.events.append(("place", self.key(h), placed))
                    h.partial_reason = self._reason(h, reasons.get(h))
                    h.gave_up_for = []
                placements.append(Placement(
                    self.key(h), phase, h.loaded_bytes, h.size_bytes, h.partial_reason, self.policy.vram_mode,
                    available, working, reserve, copied_bytes=placed,
                ))
            if self.external is not None:
                self.external.on_placed(handles)
            return placements

    def planned_budgets(self, handles: Sequence[ModelHandle], memory: int, free: int,
                        phase: str = "") -> dict[ModelHandle, int | None]:
        """The weight budget `load` gives each of `handles` (None: whole) when the device has
        `free` bytes besides what the handles hold, none of them in use and no idle component
        left to yield: M6's room after working memory × calibration and the reserve, split by
        the mode (M9, M33). Places nothing (issue 35: the fit table's prediction)."""
        handles = list(dict.fromkeys(handles))
        if not handles:
            return {}
        working = int(memory * self._factor(handles, phase))
        return self._budgets(handles, free - working - self.reserve_bytes(handles[0].device))[0]

    def _weights_needed(self, handles: Sequence[ModelHandle]) -> int:
        """The most the mode puts on the device for the handles that may be placed (`_ceiling`),
        and what the others hold (in use by another request: their placement stays, M31)."""
        return sum(_footprint(h) if h.in_use else self._ceiling(h) for h in handles)

    def reserve_bytes(self, device: torch.device) -> int:
        """M6.1's reserve: `compute.vram_reserve_mb` when set; else, inside another manager's
        accounting, that manager's own (ComfyUI's `--reserve-vram`); else the default."""
        if self.policy.vram_reserve_mb is None:
            theirs = self._ask("reserve_bytes", None, device)
            if theirs is not None:
                return int(theirs)
        return self.policy.reserve_bytes(self.devices.is_simulated(device))

    def _ceiling(self, handle: ModelHandle) -> int:
        """The most the mode will put on the device for `handle` (issue 17, item 5): `none`
        places the minimum working set (every unit streams: for a component of no more units than
        copies a few bytes over its size, `UnitPlan.min_working_set`), `low` its small resident
        share, a capped handle at most its cap (never below the minimum, M7); otherwise the whole
        component."""
        mode = self.policy.vram_mode
        if mode == "none":
            ceiling = handle.min_working_set
        elif mode == "low":
            ceiling = self._low_share(handle)
        else:
            ceiling = handle.size_bytes
        if handle.cap_bytes is not None:
            ceiling = min(ceiling, max(handle.cap_bytes, handle.min_working_set))
        return ceiling if mode == "none" else min(ceiling, handle.size_bytes)

    @staticmethod
    def _low_share(handle: ModelHandle) -> int:
        return handle.min_working_set + int(LOW_MODE_RESIDENT_SHARE * (handle.size_bytes - handle.min_working_set))

    def is_oom(self, exc: BaseException) -> bool:
        """Whether `exc` is an out-of-memory error (M40): torch's, or whatever the external
        accounting counts as one (ComfyUI's `is_oom` accepts `torch.AcceleratorError` OOMs)."""
        return isinstance(exc, torch.OutOfMemoryError) or bool(self._ask("is_oom", False, exc))

    def _ask(self, hook: str, default: Any, *args: Any) -> Any:
        """Call the external accounting's optional `hook` (see `ExternalAccounting`), else `default`."""
        method = getattr(self.external, hook, None) if self.external is not None else None
        return default if method is None else method(*args)

    def _factor(self, handles: Sequence[ModelHandle], phase: str) -> float:
        return self.calibration.factor(self.phase_key(handles, phase))

    def phase_key(self, handles: Sequence[ModelHandle], phase: str) -> str:
        """M47's key: engine and component (`qwen3tts:codec_encoder`), not the phase's name — two
        components may run in phases of one name (Qwen3-TTS's two "voice prompt" encoders)."""
        return "+".join(sorted({self.key(h) for h in handles})) or phase

    def calibrate(self, handles: Sequence[ModelHandle], phase: str, estimate: int, measured: int) -> None:
        """M47: remember how far a phase's working memory went above its estimate."""
        self.calibration.observe(self.phase_key(handles, phase), estimate, measured)

    def available(self, handles: Sequence[ModelHandle]) -> int:
        """Free bytes for `handles`' weights on their device now (what `load` weighs, M6.2,
        before any idle component yields): free memory, what an external accounting would give
        up, and what the handles already hold."""
        return self._available(handles[0].device, handles)

    def _available(self, device: torch.device, handles: Sequence[ModelHandle]) -> int:
        """Free bytes for `handles`' weights: free memory plus what they already hold."""
        free = self.devices.free_bytes(device) + int(self._ask("reclaimable_bytes", 0, device))
        limit = self.policy.limit_bytes()
        if limit is not None:
            free = min(free, limit - self.devices.process_bytes(device))
        return max(0, free) + sum(h.device_bytes for h in handles)

    def _make_room(self, device: torch.device, extra: int, handles: Sequence[ModelHandle],
                   cancel_check: Callable[[], None] | None) -> None:
        """M6.3 and M8: idle components yield room for the handles' weights plus `extra` (working
        memory and reserve); with gpu_jobs > 1, wait for other requests to release theirs."""
        self._yield(device, self._deficit(device, handles, extra), handles)
        deadline = time.monotonic() + self.wait_timeout_s
        while self._must_wait(device, handles, extra):
            if cancel_check is not None:
                cancel_check()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("waited %.1f s for another request to release the device; trying anyway",
                            self.wait_timeout_s)
                break
            self._cond.wait(timeout=min(remaining, 0.5))
            self._yield(device, self._deficit(device, handles, extra), handles)

    def _deficit(self, device: torch.device, handles: Sequence[ModelHandle], extra: int) -> int:
        return self._weights_needed(handles) + extra - self._available(device, handles)

    def _must_wait(self, device: torch.device, handles: Sequence[ModelHandle], extra: int) -> bool:
        """M8: the minimum working set (high mode: the whole model) does not fit while another
        request holds components on this device (one of `handles` too, if it is in use). What
        this thread's own phases hold is never waited for: a phase nested in another on the same
        thread would wait for itself."""
        if self.policy.gpu_jobs <= 1:
            return False
        mine = self._held.counts
        if not any(h.in_use > mine[h] and h.device == device for h in self.handles):
            return False
        high = self.policy.vram_mode == "high"
        floor = sum(_footprint(h) if h.in_use else h.size_bytes if high else h.min_working_set for h in handles)
        return self._available(device, handles) < floor + extra

    def _yield(self, device: torch.device, deficit: int, keep: Sequence[ModelHandle]) -> int:
        """M30–M32: idle components give back `deficit` bytes; returns the bytes freed."""
        if deficit <= 0:
            return 0
        for_ = [self.key(h) for h in keep]
        if self.external is not None:
            deficit -= self.external.free_for(device, deficit, keep)
        freed_total = 0
        for h in self._yield_order(device, keep):
            if freed_total >= deficit:
                break
            whole = self.policy.vram_mode in ("high", "shared")
            freed_total += self.record_yield(h, h.offload() if whole else h.partially_unload(deficit - freed_total),
                                             for_)
        if freed_total:
            self.devices.empty_cache(device)  # M32: only after yielding
        return freed_total

    def record_yield(self, handle: ModelHandle, freed: int, for_: Sequence[str]) -> int:
        """The one place a yield is recorded, whoever asked for it (our manager, an OOM, ComfyUI):
        the placement log, M50's reason and `gave_up_for`, and the log line. Returns `freed`."""
        if freed:
            handle.partial_reason = REASON_YIELDED if handle.loaded_bytes else None
            handle.gave_up_for = sorted(set(handle.gave_up_for) | set(for_))
            self.events.append(("yield", self.key(handle), freed))
            log.info("%s yielded %.1f MB of VRAM%s", self.key(handle), freed / 2**20,
                     f" for {', '.join(for_)}" if for_ else "")
        return freed

    def _yield_order(self, device: torch.device, keep: Sequence[ModelHandle]) -> list[ModelHandle]:
        """M30: partially loaded first, unpinned before pinned, least recently used first; never
        a component in use (M31)."""
        idle = [h for h in self.handles
                if h.device == device and h not in keep and not h.in_use and h.device_bytes > 0]
        return sorted(idle, key=lambda h: (not h.is_partial, self.policy.is_pinned(h.engine, h.name), h.last_used))

    def _budgets(self, handles: Sequence[ModelHandle],
                 room: int) -> tuple[dict[ModelHandle, int | None], dict[ModelHandle, str]]:
        """M9 and M33: each handle's weight budget (None = whole) and why it is partial."""
        mode = self.policy.vram_mode
        if mode == "high":
            return {h: None for h in handles}, {}
        if mode == "none":  # every unit streams (`load(stream_all=True)`)
            return {h: 0 for h in handles}, {h: REASON_MODE.format(mode=mode) for h in handles}
        budgets, reasons = self._split(handles, room)
        if mode == "low":
            for h in handles:
                low = self._low_share(h)
                if budgets[h] is None or low < budgets[h]:  # type: ignore[operator]
                    budgets[h], reasons[h] = low, REASON_MODE.format(mode=mode)
        return budgets, reasons

    def _split(self, handles: Sequence[ModelHandle],
               room: int) -> tuple[dict[ModelHandle, int | None], dict[ModelHandle, str]]:
        """M33: smaller components load whole first, each leaving at least the others' minimum
        working sets; the largest gets the rest and streams what does not fit."""
        order = sorted(handles, key=lambda h: h.size_bytes)
        budgets: dict[ModelHandle, int | None] = {}
        reasons: dict[ModelHandle, str] = {}
        for i, h in enumerate(order):
            others = sum(o.min_working_set for o in order[i + 1:])
            share = room - others
            if share >= h.size_bytes:
                budgets[h] = None
                room -= h.size_bytes
            else:
                budgets[h] = max(share, 0)
                reasons[h] = REASON_BUDGET
                room -= max(min(share, h.size_bytes), h.min_working_set)
        return budgets, reasons

    def _reason(self, handle: ModelHandle, planned: str | None) -> str | None:
        if handle.is_whole:
            return None
        if handle.cap_bytes is not None:
            return REASON_CAPPED
        return planned or REASON_BUDGET

    # ---- OOM (M40) -----------------------------------------------------------------------
    def after_oom(self, handles: Sequence[ModelHandle]) -> None:
        """M40.2: idle components off the device, streamer copies dropped, the phase's
        components capped at half of what they had on the device."""
        with self._cond:
            for h in handles:
                # Half of what it had on the device; a placement that failed before holding
                # anything is capped at half of its size.
                h.cap_bytes = (h.device_bytes or h.size_bytes) // 2
            for s in self._streamers.values():
                s.drop()
            self.offload_idle(keep=handles)
            for d in {h.device for h in handles}:
                self.devices.empty_cache(d)

    def offload_idle(self, keep: Sequence[ModelHandle] = (), device: torch.device | None = None) -> int:
        """Move every idle component (not in use, not in `keep`) off `device`, or off every
        device when None (M34, M40). Returns the bytes freed."""
        freed = 0
        for_ = [self.key(h) for h in keep]
        with self._cond:
            for h in self.handles:
                if (device is None or h.device == device) and h not in keep and not h.in_use and h.device_bytes:
                    freed += self.record_yield(h, h.offload(), for_)
        return freed


def _footprint(handle: ModelHandle) -> int:
    """The most a placed handle holds on the device: its placement, plus room for its streamer
    copies when units stream (M16)."""
    copies = handle.min_working_set - handle.plan.fixed_bytes if handle.streamed_units else 0
    return handle.loaded_bytes + copies
