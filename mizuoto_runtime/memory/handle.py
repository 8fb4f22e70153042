"""ModelHandle: one component's placement on its device (M15, M17, M25–M28).

A handle owns a module's weights as *slots* (see `units.py`). `load(budget)` places the
fixed part, then `hot` units, then the rest by kind (M15: `sequence` in run order, `oneshot`
largest first). Units that do not fit stay in host RAM and stream: their forward hooks, and
the swap of their weights to a streamer copy for the call, are the handle's `UnitHooks`
(`hooks.py`). A handle placed whole has no hooks at all. Placed weights keep their host copy
or give it up by `compute.host_copies` (M25, M29).

Two requests may run one handle at once (`compute.gpu_jobs` > 1, M8). While a request uses
it (`in_use`), its placement is frozen: the manager budgets around it and nothing re-plans,
yields or replaces it (M31); placement calls made while a thread is inside a streamed unit
raise, and each first leaves what the calling thread left entered (`end_call`).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Literal

import psutil
import torch
from torch import nn

from ..errors import MizuotoError
from .devices import AbsentParameter, AbsentTensor, DeviceService
from .hooks import Calls, Capture, Standins, UnitHooks
from .pinning import released_together
from .policy import VramPolicy
from .profiling import label
from .small_weights import largest_cast_bytes, stored_choice
from .streamer import Streamer
from .units import Slot, Unit, UnitPlan, plan_units

log = logging.getLogger(__name__)

Kind = Literal["sequence", "oneshot"]
Mark = Literal["hot", "fixed"]


class ModelHandle:
    """A component (an `nn.Module`) the runtime places, streams and yields (M15–M17, M25–M28)."""

    def __init__(
        self,
        module: nn.Module,
        *,
        devices: DeviceService,
        policy: VramPolicy | None = None,
        streamer: Streamer | None = None,
        device: torch.device | None = None,
        kind: Kind = "oneshot",
        engine: str = "",
        name: str = "",
        graphable: bool = False,
    ) -> None:
        if kind not in ("sequence", "oneshot"):
            raise ValueError(f"handle {name!r}: kind must be 'sequence' or 'oneshot', got {kind!r}")
        self.devices = devices
        self.policy = policy or VramPolicy()
        self.device = device or devices.compute_device()
        self.streamer = streamer or Streamer(devices, self.device)
        self.kind: Kind = kind
        self.engine = engine
        self.name = name or type(module).__name__
        self.graphable = graphable  # M24: a sequence handle whose streamed units stay pinned
        self.cap_bytes: int | None = None  # M40: set after an OOM, kept until the handle leaves the device
        self.replayed = 0  # M24: bytes copied by CUDA Graph replays
        self.in_use = 0  # requests using it now (M31)
        self.last_used = 0.0
        self.partial_reason: str | None = None  # M50: why it is partial now
        self.gave_up_for: list[str] = []  # M50: components it yielded VRAM for
        self.unloaded = False
        self.weights_phase: str | None = None  # the engine phase whose `weights` choice it takes
        self._hot: list[str] = []  # M15 marks, by path: they survive `replace` (M28)
        self._fixed: list[str] = []
        self.standins = Standins(devices, self.name, module)
        self.hooks = UnitHooks(self, self.streamer, self.standins)
        self._set_module(module)

    # ---- structure -----------------------------------------------------------------------
    def _set_module(self, module: nn.Module) -> None:
        self.module = module
        self.plan: UnitPlan = plan_units(module, self._marked(self._fixed))
        self.weights = stored_choice(module)  # what its Linear and Conv weights are stored as
        # Working memory its phases add: the largest stored-small weight, cast for its forward.
        self.cast_bytes = largest_cast_bytes(module)
        self.standins.reset(module)
        absent = [s.name for s in self._all_slots() if isinstance(s.current(), (AbsentParameter, AbsentTensor))]
        if absent:
            raise MizuotoError(f"handle {self.name!r}: {absent[0]} (and {len(absent) - 1} more) hold no weights: the "
                               "module belongs to an unloaded handle; load the model again")
        self._fixed_placed = False
        self._resident: list[Unit] = []  # in placement order (M32 yields in reverse)
        self._device_slots: dict[int, torch.Tensor] = {}  # id(slot) -> its device tensor
        self.streamer.configure(self, self.copies, self.prefetch_depth, self.name)
        if self.devices.strict:
            for slot in self._all_slots():
                self.standins.hold_rest(slot)
            self.standins.drop_derived(self.plan.derived + [d for u in self.plan.units for d in u.derived])
        if self.plan.size_bytes and self.plan.fixed_bytes * 2 > self.plan.size_bytes:
            log.info("%s: %d units stream; %s", self.name, len(self.plan.units), self.plan.describe_fixed())

    def _all_slots(self) -> list[Slot]:
        return self.plan.fixed + [s for u in self.plan.units for s in u.slots]

    @property
    def units(self) -> list[Unit]:
        return self.plan.units

    @staticmethod
    def units_of(module: nn.Module) -> list[Unit]:
        """The units a handle of `module` would stream (M11–M13; no marks), before one is
        made: an engine may check the layout before it registers the module."""
        return plan_units(module).units

    @property
    def copies(self) -> int:
        """Live streamer copies: one for `sequence` (M20), `async_offload` + 1 for `oneshot` (M18)."""
        return 1 if self.kind == "sequence" else self.policy.copies_in_flight()

    @property
    def prefetch_depth(self) -> int:
        return 0 if self.kind == "sequence" else self.policy.async_offload

    def mark(self, module: nn.Module, mark: Mark) -> None:
        """M15: `hot` units are resident first; `fixed` modules join the fixed part. Marks are
        kept by the module's path, so they apply to a replacement module too (M28)."""
        if mark not in ("hot", "fixed"):
            raise ValueError(f"handle {self.name!r}: mark must be 'hot' or 'fixed', got {mark!r}")
        path = next((n for n, m in self.module.named_modules() if m is module), None)
        if path is None:
            raise ValueError(f"handle {self.name!r}: mark {mark!r}: the module is not part of this component")
        if mark == "hot":
            self._hot.append(path)
            return
        if self.loaded_bytes or self.in_use:
            raise MizuotoError(f"handle {self.name!r}: mark 'fixed' before the component is placed")
        self._restore_rest_state()
        self._fixed.append(path)
        self._set_module(self.module)

    def _marked(self, paths: list[str], module: nn.Module | None = None) -> list[nn.Module]:
        root = self.module if module is None else module
        found = []
        for path in paths:
            try:
                found.append(root.get_submodule(path))
            except AttributeError as exc:
                raise MizuotoError(f"handle {self.name!r}: the module has no submodule {path!r}, which is "
                                   "marked hot or fixed") from exc
        return found

    # ---- sizes ---------------------------------------------------------------------------
    @property
    def size_bytes(self) -> int:
        return self.plan.size_bytes

    @property
    def loaded_bytes(self) -> int:
        """Weights resident on the device (fixed part + resident units)."""
        if not self._fixed_placed:
            return 0
        return self.plan.fixed_bytes + sum(u.nbytes for u in self._resident)

    @property
    def device_bytes(self) -> int:
        """Everything this handle holds on the device: resident weights + cached streamer copies."""
        return self.loaded_bytes + self.streamer.cached_bytes(self)

    @property
    def min_working_set(self) -> int:
        """M16: fixed part + the streamer's simultaneous copies of the largest units."""
        return self.plan.min_working_set(self.copies)

    @property
    def is_whole(self) -> bool:
        return self._fixed_placed and len(self._resident) == len(self.plan.units)

    @property
    def is_partial(self) -> bool:
        return self._fixed_placed and not self.is_whole

    @property
    def streamed_units(self) -> list[Unit]:
        resident = {id(u) for u in self._resident}
        return [u for u in self.plan.units if id(u) not in resident] if self._fixed_placed else []

    # ---- placement -----------------------------------------------------------------------
    def load(self, budget: int | None = None, *, stream_all: bool = False,
             noted: set[ModelHandle] | None = None) -> int:
        """Place the component within `budget` bytes (None: whole). Returns bytes placed now.

        Below the minimum working set the load is still tried at the minimum (M7), and an INFO
        line says so: that is the documented behaviour, not a fault to act on. `noted`: the
        handles a request has already said it for (it says so once per handle and request, not
        once per chunk); None, outside a request, says it every time. Not with `stream_all`
        (`vram_mode = none`: every unit streams, as asked)."""
        self._check_alive()
        if not self.devices.moves(self.device):
            return 0  # M5: on plain CPU nothing moves
        with label("mizuoto::load", self.key):
            return self._load(budget, stream_all, noted)

    def _load(self, budget: int | None, stream_all: bool, noted: set[ModelHandle] | None) -> int:
        self._check_between_calls("load")
        target = [] if stream_all else self._target_units(budget, noted)
        before = self.loaded_bytes
        self.streamer.drop(self)  # placement changes: cached copies may now be resident units
        for unit in [u for u in reversed(self._resident) if u not in target]:
            self._unplace_unit(unit)
        # Partially loaded components always keep host copies: their streamed units live there.
        keep = self._keep_host() or len(target) < len(self.plan.units)
        if not self._fixed_placed:
            self._place_fixed(keep)
        for unit in target:
            if unit not in self._resident:
                self._place_unit(unit, keep)
        self._placed()
        self.last_used = time.monotonic()
        return max(0, self.loaded_bytes - before)

    def planned_units(self, budget: int | None) -> list[Unit]:
        """The units `load(budget)` would make resident, without placing anything (issue 35:
        the fit table predicts placements with the handle's own choice)."""
        return self._target_units(budget, noted={self})

    def _target_units(self, budget: int | None, noted: set[ModelHandle] | None = None) -> list[Unit]:
        """Which units are resident for this budget, in placement order (M15, M16)."""
        if self.cap_bytes is not None:
            budget = self.cap_bytes if budget is None else min(budget, self.cap_bytes)
        if budget is None or budget >= self.size_bytes:
            return list(self.plan.units)
        if budget < self.min_working_set:
            if noted is None or self not in noted:
                log.info("%s: budget %.1f MB is below the minimum working set %.1f MB; trying at the minimum; %s",
                         self.name, budget / 2**20, self.min_working_set / 2**20, self.plan.describe_fixed())
                if noted is not None:
                    noted.add(self)
            budget = self.min_working_set
            if budget >= self.size_bytes:
                return list(self.plan.units)  # streaming needs no less (copies' alignment, M16)
        room = budget - self.min_working_set
        target: list[Unit] = []
        for unit in self._placement_order():
            if unit.nbytes <= room:
                target.append(unit)
                room -= unit.nbytes
        return target

    def _placement_order(self) -> list[Unit]:
        hot = [u for u in self.plan.units if self._is_hot(u)]
        rest = [u for u in self.plan.units if u not in hot]
        if self.kind == "oneshot":
            rest.sort(key=lambda u: (-u.nbytes, u.index))
        return hot + rest

    def _is_hot(self, unit: Unit) -> bool:
        """A unit inside a `hot` module, or holding one, is placed first."""
        inside = {id(m) for m in unit.module.modules()}
        return any(id(unit.module) in {id(m) for m in h.modules()} or id(h) in inside
                   for h in self._marked(self._hot))

    def partially_unload(self, nbytes: int) -> int:
        """Give back at least `nbytes`, unit by unit in reverse placement order (M32).

        Cached streamer copies go first; when the units are not enough, the whole component
        leaves the device. Returns the bytes really freed.
        """
        with label("mizuoto::partially_unload", self.key):
            return self._give_back(nbytes)

    def offload(self) -> int:
        """Move the whole component off the device (host copies make this free, M25)."""
        with label("mizuoto::offload", self.key):
            return self._give_back(self.device_bytes + 1)

    def _give_back(self, nbytes: int) -> int:
        self._check_between_calls("yield")
        freed = self.streamer.drop(self)
        while freed < nbytes and self._resident:
            freed += self._unplace_unit(self._resident[-1])
        if freed < nbytes and self._fixed_placed:
            freed += self._unplace_fixed()
        self._placed()
        return freed

    def drop_host_copies(self) -> int:
        """M29: a whole-loaded component gives up the host copies of its placed parameters (VRAM
        then holds the only copy; moving it off copies back). Partial components keep theirs:
        their streamed units live there (M25). Returns the host bytes released."""
        if not self.is_whole or self.in_use:
            return 0
        released = 0
        with released_together(self.streamer.engine.pinner):  # one device sync for all (issue 27)
            for slot in self._all_slots():
                if id(slot) in self._device_slots and slot.host is not None and not slot.is_buffer:
                    slot.host = None
                    released += slot.nbytes
            self._placed()  # the copy engine unpins what it pinned for them (M22)
        return released

    def unload(self) -> int:
        """M26: free everything, device and host, without copying back. The handle is spent.
        Works whatever the slots hold: device tensors, host tensors or strict stand-ins."""
        with label("mizuoto::unload", self.key):
            return self._unload()

    def _unload(self) -> int:
        self.end_call()
        freed = self.streamer.forget(self)
        with released_together(self.streamer.engine.pinner):  # one device sync for all (issue 27)
            for slot in self._all_slots():
                if self._device_slots.pop(id(slot), None) is not None:
                    self.devices.release(self.device, slot.nbytes)
                    freed += slot.nbytes
                slot.hold_absent(None, self.standins.label(slot))
                slot.host = None
        self.standins.drop_derived(self.plan.derived + [d for u in self.plan.units for d in u.derived])
        self.hooks.remove()
        self._fixed_placed = False
        self._resident.clear()
        self.cap_bytes = None
        self.unloaded = True
        return freed

    def replace(self, module: nn.Module) -> None:
        """M28: swap in changed weights through the handle so host copies never go stale. The
        `hot` and `fixed` marks apply to the same paths in the new module."""
        self._check_alive()
        if self.in_use:
            raise MizuotoError(f"handle {self.name!r} is in use; replace it between requests")
        self._marked(self._hot + self._fixed, module)  # every mark must exist in the new module
        self.offload()
        self.hooks.remove()
        self.streamer.forget(self)
        self._set_module(module)

    # ---- slots ---------------------------------------------------------------------------
    def _keep_host(self) -> bool:
        """M25: whether placed parameters keep their host tensor."""
        mode = self.policy.host_copies
        if mode == "on":
            return True
        if mode == "off":
            return False
        return psutil.virtual_memory().available > self.policy.ram_reserve_bytes()

    def _place_slot(self, slot: Slot, keep_host: bool) -> None:
        host = slot.host
        if host is None:
            raise MizuotoError(f"{self.name}.{slot.name}: no host copy to place from")
        # M22: a pinned host copy reloads asynchronously, ordered on the compute stream.
        dev = self.devices.copy_to(host, self.device, non_blocking=self.streamer.is_pinned(host))
        self._device_slots[id(slot)] = dev
        slot.hold(dev)
        if not keep_host and not slot.is_buffer:
            slot.host = None  # M25: host copies off — VRAM holds the only copy

    def _unplace_slot(self, slot: Slot) -> int:
        dev = self._device_slots.pop(id(slot), None)
        if dev is None:
            return 0
        if slot.is_buffer or slot.host is None:
            # Buffers are always copied back (the model may update them in place, M25).
            with torch.inference_mode(False):
                current = slot.current()
                slot.host = current.detach().to(self.devices.offload_device, copy=True)
        self.standins.hold_rest(slot)
        self.devices.release(self.device, slot.nbytes)
        return slot.nbytes

    def _restore_rest_state(self) -> None:
        """Give the module its host tensors back (before re-planning its units)."""
        for slot in self._all_slots():
            if slot.host is not None:
                slot.hold(slot.host)

    def _place_fixed(self, keep: bool) -> None:
        try:
            for slot in self.plan.fixed:
                self._place_slot(slot, keep)
        except BaseException:
            self._unplace_fixed()
            raise
        self._fixed_placed = True

    def _unplace_fixed(self) -> int:
        freed = sum(self._unplace_slot(s) for s in self.plan.fixed)
        freed += sum(self._unplace_unit(u) for u in list(reversed(self._resident)))
        self.standins.drop_derived(self.plan.derived)
        self._fixed_placed = False
        self.cap_bytes = None  # M40: the cap lasts until the component leaves the device
        self.partial_reason = None
        return freed

    def _place_unit(self, unit: Unit, keep: bool) -> None:
        try:
            for slot in unit.slots:
                self._place_slot(slot, keep)
        except BaseException:
            for slot in unit.slots:
                self._unplace_slot(slot)
            raise
        self._resident.append(unit)

    def _unplace_unit(self, unit: Unit) -> int:
        freed = sum(self._unplace_slot(s) for s in unit.slots)
        self._resident.remove(unit)
        self.standins.drop_derived(unit.derived)
        return freed

    # ---- streamed units (hooks.py) ---------------------------------------------------------
    def _placed(self) -> None:
        """After a placement change: streamed units get hooks, resident ones lose theirs; the
        copy engine pins host copies, sizes copy buffers and runs compiled parents eagerly
        (M21–M23)."""
        self.hooks.sync(self.plan.units, self.streamed_units)
        self.streamer.placed(self, self.module, self.streamed_units, self._kept_host_slots(),
                             self.policy.pinned_budget_bytes())

    def _kept_host_slots(self) -> list[Slot]:
        """Placed slots that keep their host tensor (M25; pinned under M22's budget)."""
        return [s for s in self._all_slots() if id(s) in self._device_slots and s.host is not None]

    def has_hooks(self) -> bool:
        return self.hooks.installed()

    @property
    def graph_capture(self) -> Capture | None:
        """M24: this thread's `graphs.LeafCopies` while it captures a CUDA Graph, else None —
        per thread: another request's calls meanwhile stream as usual."""
        return self.hooks.calls.capture

    @graph_capture.setter
    def graph_capture(self, leaves: Capture | None) -> None:
        self.hooks.calls.capture = leaves

    @property
    def _calls(self) -> Calls:
        """The calling thread's entries into the streamed units (none is left after a phase)."""
        return self.hooks.calls

    def end_call(self) -> None:
        """The calling thread's phase with this handle ended: leave every unit it is still
        inside (a `BaseException` skipped their post-hooks) and forget its learned position."""
        self.hooks.end_call(self.plan.units)

    def _check_between_calls(self, what: str) -> None:
        """Placement changes only between calls: never while a thread is inside a streamed unit."""
        self.end_call()  # this thread is not inside a forward: what it left entered is stale
        running = [u.name for u in self.plan.units if self.streamer.users(self, u)]
        if running:
            raise MizuotoError(f"handle {self.name!r}: cannot {what} while a forward runs inside its streamed "
                               f"unit {running[0]}; its placement changes only between calls")

    # ---- misc ----------------------------------------------------------------------------
    @property
    def key(self) -> str:
        """The component's name in logs, reports and profiler labels (`engine:name`)."""
        return f"{self.engine}:{self.name}" if self.engine else self.name

    def _check_alive(self) -> None:
        if self.unloaded:
            raise MizuotoError(f"handle {self.name!r} was unloaded; load the model again")

    def host_tensors(self) -> list[torch.Tensor]:
        """The host copies this handle holds now (weights in RAM: streamed units, kept copies)."""
        return [s.host for s in self._all_slots() if s.host is not None]

    def describe(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "name": self.name,
            "kind": self.kind,
            "size_bytes": self.size_bytes,
            "loaded_bytes": self.loaded_bytes,
            "host_bytes": sum(s.nbytes for s in self._all_slots() if s.host is not None),
            "units": len(self.plan.units),
            "resident_units": len(self._resident),
            "min_working_set": self.min_working_set,
            "weights": self.weights,
            "fixed": [{"reason": why, "bytes": nbytes} for why, nbytes in self.plan.why_fixed()],  # M14
        }

    def __repr__(self) -> str:
        return (f"ModelHandle({self.engine}:{self.name}, {self.kind}, {self.loaded_bytes}/{self.size_bytes} B, "
                f"{len(self._resident)}/{len(self.plan.units)} units)")

