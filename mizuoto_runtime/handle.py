"""ModelHandle: one component's placement on its device (M15, M17, M25–M28).

A handle owns a module's weights as *slots* (see `units.py`). `load(budget)` places the
fixed part, then `hot` units, then the rest by kind (M15: `sequence` in run order, `oneshot`
largest first). Units that do not fit stay in host RAM and get forward pre/post hooks — on
the unit and on each leaf holding its weights — that swap the weights to a streamer copy for
the call and back after (M17). A handle placed whole has no hooks at all.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Literal

import psutil
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .devices import DeviceService, absent_like
from .errors import MizuotoError
from .policy import VramPolicy
from .streamer import Streamer
from .units import Slot, Unit, UnitPlan, iter_unit_modules, plan_units

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
        self.graph_capture: Any = None  # M24: a `graphs.LeafCopies` while a CUDA Graph is captured
        self.in_use = 0  # requests using it now (M31)
        self.last_used = 0.0
        self.partial_reason: str | None = None  # M50: why it is partial now
        self.gave_up_for: list[str] = []  # M50: components it yielded VRAM for
        self.unloaded = False
        self._hot: list[nn.Module] = []
        self._fixed: list[nn.Module] = []
        self._hooks: dict[int, list[RemovableHandle]] = {}
        self._depth: dict[int, int] = {}
        self._set_module(module)

    # ---- structure -----------------------------------------------------------------------
    def _set_module(self, module: nn.Module) -> None:
        self.module = module
        self.plan: UnitPlan = plan_units(module, self._fixed)
        self._fixed_placed = False
        self._resident: list[Unit] = []  # in placement order (M32 yields in reverse)
        self._device_slots: dict[int, torch.Tensor] = {}  # id(slot) -> its device tensor
        self.streamer.configure(self, self.copies, self.prefetch_depth)
        if self.devices.strict:
            for slot in self._all_slots():
                slot.hold(absent_like(slot.current(), f"{self.name}.{slot.name}", slot.param is not None))

    def _all_slots(self) -> list[Slot]:
        return self.plan.fixed + [s for u in self.plan.units for s in u.slots]

    @property
    def units(self) -> list[Unit]:
        return self.plan.units

    @property
    def copies(self) -> int:
        """Live streamer copies: one for `sequence` (M20), `async_offload` + 1 for `oneshot` (M18)."""
        return 1 if self.kind == "sequence" else self.policy.copies_in_flight()

    @property
    def prefetch_depth(self) -> int:
        return 0 if self.kind == "sequence" else self.policy.async_offload

    def mark(self, module: nn.Module, mark: Mark) -> None:
        """M15: `hot` units are resident first; `fixed` modules join the fixed part."""
        if mark == "hot":
            self._hot.append(module)
        elif mark == "fixed":
            if self.loaded_bytes:
                raise MizuotoError(f"handle {self.name!r}: mark 'fixed' before the component is placed")
            self._restore_rest_state()
            self._fixed.append(module)
            self._set_module(self.module)
        else:
            raise ValueError(f"handle {self.name!r}: mark must be 'hot' or 'fixed', got {mark!r}")

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
    def load(self, budget: int | None = None) -> int:
        """Place the component within `budget` bytes (None: whole). Returns bytes placed now.

        Below the minimum working set the load is still tried at the minimum (M7).
        """
        self._check_alive()
        if not self.devices.moves(self.device):
            return 0  # M5: on plain CPU nothing moves
        target = self._target_units(budget)
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
        self._sync_hooks()
        self.last_used = time.monotonic()
        return max(0, self.loaded_bytes - before)

    def _target_units(self, budget: int | None) -> list[Unit]:
        """Which units are resident for this budget, in placement order (M15, M16)."""
        if self.cap_bytes is not None:
            budget = self.cap_bytes if budget is None else min(budget, self.cap_bytes)
        if budget is None or budget >= self.size_bytes:
            return list(self.plan.units)
        if budget < self.min_working_set:
            log.warning(
                "%s: budget %.1f MB is below the minimum working set %.1f MB; trying at the minimum",
                self.name, budget / 2**20, self.min_working_set / 2**20,
            )
            budget = self.min_working_set
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
        return any(id(unit.module) in {id(m) for m in h.modules()} or id(h) in inside for h in self._hot)

    def partially_unload(self, nbytes: int) -> int:
        """Give back at least `nbytes`, unit by unit in reverse placement order (M32).

        Cached streamer copies go first; when the units are not enough, the whole component
        leaves the device. Returns the bytes really freed.
        """
        freed = self.streamer.drop(self)
        while freed < nbytes and self._resident:
            freed += self._unplace_unit(self._resident[-1])
        if freed < nbytes and self._fixed_placed:
            freed += self._unplace_fixed()
        self._sync_hooks()
        return freed

    def offload(self) -> int:
        """Move the whole component off the device (host copies make this free, M25)."""
        return self.partially_unload(self.device_bytes + 1)

    def drop_host_copies(self) -> int:
        """M29: a whole-loaded component gives up the host copies of its placed parameters (VRAM
        then holds the only copy; moving it off copies back). Partial components keep theirs:
        their streamed units live there (M25). Returns the host bytes released."""
        if not self.is_whole or self.in_use:
            return 0
        released = 0
        for slot in self._all_slots():
            if id(slot) in self._device_slots and slot.host is not None and not slot.is_buffer:
                slot.host = None
                released += slot.nbytes
        self._sync_hooks()  # the copy engine unpins what it pinned for them (M22)
        return released

    def unload(self) -> int:
        """M26: free everything, device and host, without copying back. The handle is spent."""
        freed = self.streamer.forget(self)
        for slot in self._all_slots():
            if self._device_slots.pop(id(slot), None) is not None:
                self.devices.release(self.device, slot.nbytes)
                freed += slot.nbytes
            slot.hold(absent_like(slot.current(), f"{self.name}.{slot.name}", slot.param is not None))
            slot.host = None
        self._remove_hooks()
        self._fixed_placed = False
        self._resident.clear()
        self.cap_bytes = None
        self.unloaded = True
        return freed

    def replace(self, module: nn.Module) -> None:
        """M28: swap in changed weights through the handle so host copies never go stale."""
        self._check_alive()
        if self.in_use:
            raise MizuotoError(f"handle {self.name!r} is in use; replace it between requests")
        self.offload()
        self._remove_hooks()
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
        self._hold_rest(slot)
        self.devices.release(self.device, slot.nbytes)
        return slot.nbytes

    def _hold_rest(self, slot: Slot) -> None:
        """What a slot holds off the device: the host tensor, or a strict stand-in (M56)."""
        if self.devices.strict:
            slot.hold(absent_like(slot.host, f"{self.name}.{slot.name}", slot.param is not None))  # type: ignore[arg-type]
        else:
            slot.hold(slot.host)  # type: ignore[arg-type]

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
        return freed

    # ---- hooks (M17) ---------------------------------------------------------------------
    def _sync_hooks(self) -> None:
        """Streamed units get hooks; resident units and a whole or absent handle have none."""
        streamed = {id(u) for u in self.streamed_units}
        for unit in self.plan.units:
            hooked = id(unit) in self._hooks
            if id(unit) in streamed and not hooked:
                self._add_hooks(unit)
            elif id(unit) not in streamed and hooked:
                for h in self._hooks.pop(id(unit)):
                    h.remove()
        # M21–M23: pin host copies, size copy buffers, run compiled parents eagerly.
        self.streamer.placed(self, self.module, self.streamed_units, self._kept_host_slots(),
                             self.policy.pinned_budget_bytes())

    def _kept_host_slots(self) -> list[Slot]:
        """Placed slots that keep their host tensor (M25; pinned under M22's budget)."""
        return [s for s in self._all_slots() if id(s) in self._device_slots and s.host is not None]

    def _add_hooks(self, unit: Unit) -> None:
        hooks: list[RemovableHandle] = []
        for _, module in [(u, m) for u, m in iter_unit_modules(self.plan) if u is unit]:
            hooks.append(module.register_forward_pre_hook(self._pre_hook(unit), with_kwargs=True))
            hooks.append(module.register_forward_hook(self._post_hook(unit), with_kwargs=True, always_call=True))
        self._hooks[id(unit)] = hooks

    def _remove_hooks(self) -> None:
        for hooks in self._hooks.values():
            for h in hooks:
                h.remove()
        self._hooks.clear()

    def has_hooks(self) -> bool:
        return bool(self._hooks)

    def _pre_hook(self, unit: Unit) -> Any:
        def pre(module: nn.Module, args: Any, kwargs: Any) -> None:
            if self.graph_capture is not None:
                self.graph_capture.enter(module)  # M24: per-leaf copies into the graph's memory
            else:
                self.enter_unit(unit)

        return pre

    def _post_hook(self, unit: Unit) -> Any:
        def post(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if self.graph_capture is not None:
                self.graph_capture.exit(module)
            else:
                self.exit_unit(unit)

        return post

    def enter_unit(self, unit: Unit) -> None:
        """Swap the unit's weights to its device copy (nested entries reuse the first, M17)."""
        depth = self._depth.get(id(unit), 0)
        self._depth[id(unit)] = depth + 1
        if depth:
            return
        try:
            tensors = self.streamer.acquire(self, unit)
        except BaseException:
            self._depth[id(unit)] = 0
            raise
        for slot, tensor in zip(unit.slots, tensors):
            slot.hold(tensor)

    def exit_unit(self, unit: Unit) -> None:
        depth = self._depth.get(id(unit), 0) - 1
        self._depth[id(unit)] = max(depth, 0)
        if depth > 0:
            return
        for slot in unit.slots:
            self._hold_rest(slot)
        self.streamer.release(self, unit)

    # ---- misc ----------------------------------------------------------------------------
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
        }

    def __repr__(self) -> str:
        return (f"ModelHandle({self.engine}:{self.name}, {self.kind}, {self.loaded_bytes}/{self.size_bytes} B, "
                f"{len(self._resident)}/{len(self.plan.units)} units)")

