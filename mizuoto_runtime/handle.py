"""ModelHandle: one component's placement on its device (M15, M17, M25–M28).

A handle owns a module's weights as *slots* (see `units.py`). `load(budget)` places the
fixed part, then `hot` units, then the rest by kind (M15: `sequence` in run order, `oneshot`
largest first). Units that do not fit stay in host RAM and get forward pre/post hooks — on
the unit and on each leaf holding its weights — that swap the weights to a streamer copy for
the call and back after (M17). Where the copy runs beside compute, each leaf swaps in its own
weights when it runs, once their copy is ready; until then they are the stand-in (strict) or
the host tensor, never a copy still being written. A handle placed whole has no hooks at all.

Two requests may run one handle at once (`compute.gpu_jobs` > 1, M8). While a request uses
it (`in_use`), its placement is frozen: the manager budgets around it and nothing re-plans,
yields or replaces it (M31); placement calls made while a thread is inside a streamed unit
raise. The hooks' state is per call: each thread counts its own entries, so a post-hook runs
our exit only where our pre-hook ran (a user pre-hook that raised first leaves nothing to
undo); threads inside the same unit share its copy, kept until the last one leaves (see
`streamer.py`). Our pre-hooks run before any other pre-hook on the module (legacy
`nn.utils.weight_norm` computes the weight from `weight_g`/`weight_v` in one), our post-hooks
after every other post-hook. A `BaseException` (KeyboardInterrupt) inside a unit skips
PyTorch's post-hooks: `end_call`, run when the thread's phase ends and before any placement
change, leaves every unit the thread entered — nothing stays entered, swapped or held.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Literal

import psutil
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .devices import AbsentParameter, AbsentTensor, DeviceService, absent_like
from .errors import MizuotoError
from .pinning import released_together
from .policy import VramPolicy
from .streamer import Streamer
from .units import LeafNeed, Slot, Unit, UnitPlan, plan_units

log = logging.getLogger(__name__)

Kind = Literal["sequence", "oneshot"]
Mark = Literal["hot", "fixed"]


class _Calls(threading.local):
    """The calling thread's entries into a handle's streamed units: per module, how many of our
    pre-hooks ran and await their post-hook; per unit, how deep the thread is inside it, and
    whether its entry swapped all the unit's weights in (else each leaf swaps in its own)."""

    def __init__(self) -> None:
        self.modules: dict[int, int] = {}
        self.units: dict[int, int] = {}
        self.whole: dict[int, bool] = {}  # per unit entered: whether all its weights were swapped in
        self.capture: Any = None  # M24: a `graphs.LeafCopies` while this thread captures a CUDA Graph


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
        self._hot: list[str] = []  # M15 marks, by path: they survive `replace` (M28)
        self._fixed: list[str] = []
        self._hooks: dict[int, list[RemovableHandle]] = {}
        self._calls = _Calls()
        self._derived: dict[tuple[int, str], torch.Tensor] = {}  # legacy weight norm's stand-ins
        self._set_module(module)

    # ---- structure -----------------------------------------------------------------------
    def _set_module(self, module: nn.Module) -> None:
        self.module = module
        self.plan: UnitPlan = plan_units(module, self._marked(self._fixed))
        self._derived.clear()
        absent = [s.name for s in self._all_slots() if isinstance(s.current(), (AbsentParameter, AbsentTensor))]
        if absent:
            raise MizuotoError(f"handle {self.name!r}: {absent[0]} (and {len(absent) - 1} more) hold no weights: the "
                               "module belongs to an unloaded handle; load the model again")
        self._fixed_placed = False
        self._resident: list[Unit] = []  # in placement order (M32 yields in reverse)
        self._device_slots: dict[int, torch.Tensor] = {}  # id(slot) -> its device tensor
        self.streamer.configure(self, self.copies, self.prefetch_depth)
        if self.devices.strict:
            for slot in self._all_slots():
                slot.hold_absent(slot.host, self._label(slot))
            self._drop_derived(self.plan.derived + [d for u in self.plan.units for d in u.derived])
        if self.plan.size_bytes and self.plan.fixed_bytes * 2 > self.plan.size_bytes:
            log.info("%s: %d units stream; %s", self.name, len(self.plan.units), self.plan.describe_fixed())

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
        self._sync_hooks()
        self.last_used = time.monotonic()
        return max(0, self.loaded_bytes - before)

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
        self._check_between_calls("yield")
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
        with released_together(self.streamer.engine.pinner):  # one device sync for all (issue 27)
            for slot in self._all_slots():
                if id(slot) in self._device_slots and slot.host is not None and not slot.is_buffer:
                    slot.host = None
                    released += slot.nbytes
            self._sync_hooks()  # the copy engine unpins what it pinned for them (M22)
        return released

    def unload(self) -> int:
        """M26: free everything, device and host, without copying back. The handle is spent.
        Works whatever the slots hold: device tensors, host tensors or strict stand-ins."""
        self.end_call()
        freed = self.streamer.forget(self)
        with released_together(self.streamer.engine.pinner):  # one device sync for all (issue 27)
            for slot in self._all_slots():
                if self._device_slots.pop(id(slot), None) is not None:
                    self.devices.release(self.device, slot.nbytes)
                    freed += slot.nbytes
                slot.hold_absent(None, self._label(slot))
                slot.host = None
        self._drop_derived(self.plan.derived + [d for u in self.plan.units for d in u.derived])
        self._remove_hooks()
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
        self._remove_hooks()
        self.streamer.forget(self)
        self._set_module(module)

    # ---- slots ---------------------------------------------------------------------------
    def _label(self, slot: Slot) -> str:
        return f"{self.name}.{slot.name}"

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
            slot.hold_absent(slot.host, self._label(slot))
        else:
            slot.hold(slot.host)  # type: ignore[arg-type]

    def _drop_derived(self, derived: list[tuple[nn.Module, str]]) -> None:
        """Legacy weight norm leaves the weight it computed from placed or streamed tensors on the
        layer: once those leave, it becomes a stand-in (strict: one that names it), so no device
        tensor outlives its placement or its unit."""
        for module, attr in derived:
            current = module.__dict__.get(attr)
            if not isinstance(current, torch.Tensor):
                continue
            key = (id(module), attr)
            standin = self._derived.get(key)
            if standin is None or standin.shape != current.shape or standin.dtype != current.dtype:
                label = f"{self.name}.{self._module_path(module)}.{attr} (computed by weight_norm)"
                standin = (absent_like(current, label, False) if self.devices.strict
                           else torch.empty_like(current, device="meta"))
                self._derived[key] = standin
            module.__dict__[attr] = standin

    def _module_path(self, module: nn.Module) -> str:
        return next((n for n, m in self.module.named_modules() if m is module), type(module).__name__)

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
        self._drop_derived(self.plan.derived)
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
        self._drop_derived(unit.derived)
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
            elif hooked:
                for pre, post in zip(self._hooks[id(unit)][::2], self._hooks[id(unit)][1::2]):
                    _order(pre, post)
        # M21–M23: pin host copies, size copy buffers, run compiled parents eagerly.
        self.streamer.placed(self, self.module, self.streamed_units, self._kept_host_slots(),
                             self.policy.pinned_budget_bytes())

    def _kept_host_slots(self) -> list[Slot]:
        """Placed slots that keep their host tensor (M25; pinned under M22's budget)."""
        return [s for s in self._all_slots() if id(s) in self._device_slots and s.host is not None]

    def _add_hooks(self, unit: Unit) -> None:
        hooks: list[RemovableHandle] = []
        for module in unit.hooked():
            post = module.register_forward_hook(self._post_hook(unit), with_kwargs=True, always_call=True)
            # Ours first: another pre-hook (legacy weight norm) may read the weights.
            pre = module.register_forward_pre_hook(self._pre_hook(unit, post.id), with_kwargs=True, prepend=True)
            hooks += [pre, post]
        self._hooks[id(unit)] = hooks

    def _remove_hooks(self) -> None:
        for hooks in self._hooks.values():
            for h in hooks:
                h.remove()
        self._hooks.clear()

    def has_hooks(self) -> bool:
        return bool(self._hooks)

    @property
    def graph_capture(self) -> Any:
        """M24: this thread's `graphs.LeafCopies` while it captures a CUDA Graph, else None —
        per thread, as `_Calls`: another request's calls meanwhile stream as usual."""
        return self._calls.capture

    @graph_capture.setter
    def graph_capture(self, leaves: Any) -> None:
        self._calls.capture = leaves

    def _pre_hook(self, unit: Unit, post_id: int) -> Any:
        def pre(module: nn.Module, args: Any, kwargs: Any) -> None:
            posts = module._forward_hooks
            if next(reversed(posts)) != post_id:
                posts.move_to_end(post_id)  # ours last: a user's post-hook still sees the weights
            if self.graph_capture is not None:
                self.graph_capture.enter(module)  # M24: per-leaf copies into the graph's memory
            else:
                self.enter(module, unit)

        return pre

    def _post_hook(self, unit: Unit) -> Any:
        def post(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if self.graph_capture is not None:
                self.graph_capture.exit(module)
            else:
                self.exit(module, unit)

        return post

    def enter(self, module: nn.Module, unit: Unit) -> None:
        """The calling thread enters `unit` through `module`: on its first entry the unit's
        weights are swapped to their device copy (nested entries reuse it, M17)."""
        calls = self._calls
        calls.modules[id(module)] = calls.modules.get(id(module), 0) + 1
        depth = calls.units.get(unit.index, 0)
        calls.units[unit.index] = depth + 1
        acquired = False
        try:
            if not depth:
                calls.whole[unit.index] = self._swap_in(unit)
                acquired = True
            need = unit.needs.get(id(module))
            if need is not None and not calls.whole[unit.index]:
                self._swap_in_leaf(unit, need)
        except BaseException:
            if acquired:
                self._swap_out(unit)
            if depth:
                calls.units[unit.index] = depth
            else:
                calls.units.pop(unit.index, None)
            calls.modules[id(module)] -= 1
            raise

    def exit(self, module: nn.Module, unit: Unit) -> None:
        """The calling thread leaves `module`; on its last exit from `unit` the copy goes back."""
        calls = self._calls
        entered = calls.modules.get(id(module), 0)
        if not entered:
            return  # our pre-hook did not run for this call (a pre-hook before it raised)
        calls.modules[id(module)] = entered - 1
        depth = calls.units.get(unit.index, 0) - 1
        if depth > 0:
            calls.units[unit.index] = depth
            return
        calls.units.pop(unit.index, None)
        self._swap_out(unit)

    def end_call(self) -> None:
        """The calling thread's phase with this handle ended: leave every unit it is still
        inside (a `BaseException` skipped their post-hooks) and forget its learned position."""
        calls = self._calls
        stale = [u for u in self.plan.units if calls.units.get(u.index)]
        calls.units.clear()
        calls.modules.clear()
        calls.whole.clear()
        for unit in stale:
            self._swap_out(unit)
        self.streamer.end_call(self)

    def _swap_in(self, unit: Unit) -> bool:
        """Take the unit's copy; when all of it is ready, swap every weight in and return True.
        Else each leaf swaps its own weights in as it runs (`_swap_in_leaf`): a weight read
        before its leaf's forward is the strict stand-in, never a copy still being written."""
        with self.streamer.lock:
            tensors = self.streamer.acquire(self, unit)
            if not self.streamer.is_ready(self, unit):
                return False
            # Also when another thread is inside: its leaves may have swapped in only theirs.
            for slot, tensor in zip(unit.slots, tensors):
                slot.hold(tensor)
            return True

    def _swap_in_leaf(self, unit: Unit, need: LeafNeed) -> None:
        """A leaf about to run: wait for its weights' copy, then swap them in (M17)."""
        with self.streamer.lock:
            tensors = self.streamer.ready(self, unit, need.group)
            for i in need.slots:
                unit.slots[i].hold(tensors[i])

    def _swap_out(self, unit: Unit) -> None:
        with self.streamer.lock:
            if self.streamer.users(self, unit) == 1:  # the last thread inside: swap back
                for slot in unit.slots:
                    self._hold_rest(slot)
                self._drop_derived(unit.derived)
            self.streamer.release(self, unit)

    def _check_between_calls(self, what: str) -> None:
        """Placement changes only between calls: never while a thread is inside a streamed unit."""
        self.end_call()  # this thread is not inside a forward: what it left entered is stale
        running = [u.name for u in self.plan.units if self.streamer.users(self, u)]
        if running:
            raise MizuotoError(f"handle {self.name!r}: cannot {what} while a forward runs inside its streamed "
                               f"unit {running[0]}; its placement changes only between calls")

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
            "fixed": [{"reason": why, "bytes": nbytes} for why, nbytes in self.plan.why_fixed()],  # M14
        }

    def __repr__(self) -> str:
        return (f"ModelHandle({self.engine}:{self.name}, {self.kind}, {self.loaded_bytes}/{self.size_bytes} B, "
                f"{len(self._resident)}/{len(self.plan.units)} units)")


def _order(pre: RemovableHandle, post: RemovableHandle) -> None:
    """Our pre-hook first and our post-hook last on their module, whatever was added since."""
    pres, posts = pre.hooks_dict_ref(), post.hooks_dict_ref()
    if pres is not None and pre.id in pres:
        pres.move_to_end(pre.id, last=False)  # type: ignore[attr-defined]
    if posts is not None and post.id in posts:
        posts.move_to_end(post.id)  # type: ignore[attr-defined]
