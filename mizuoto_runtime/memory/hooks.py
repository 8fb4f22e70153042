"""The streamed units' forward hooks: per-unit enter and exit, and the swap of their weights (M17, M24, M56).

A handle (`handle.py`) decides where each unit lives; the units it leaves in host RAM get
forward pre/post hooks, owned by its `UnitHooks` — on the unit and on each leaf holding its
weights — that swap the weights (`param.data`, a buffer) to a streamer copy for the call and
back after (M17). Where the copy runs beside compute, each leaf swaps in its own weights when
it runs, once their copy is ready; until then they are the stand-in (strict) or the host
tensor, never a copy still being written. A handle placed whole has no hooks at all.

The hooks' state is per call: each thread counts its own entries (`Calls`), so a post-hook
runs our exit only where our pre-hook ran (a user pre-hook that raised first leaves nothing to
undo); threads inside the same unit share its copy, kept until the last one leaves (see
`streamer.py`). Our pre-hooks run before any other pre-hook on the module (legacy
`nn.utils.weight_norm` computes the weight from `weight_g`/`weight_v` in one), our post-hooks
after every other post-hook. A `BaseException` (KeyboardInterrupt) inside a unit skips
PyTorch's post-hooks: `end_call`, run when the thread's phase ends and before any placement
change, leaves every unit the thread entered — nothing stays entered, swapped or held.

While a thread captures a CUDA Graph (M24) its hooks call the capture's per-leaf copies
(`graphs.LeafCopies`) instead of the streamer. What a weight holds off the device — its host
tensor, or on the strict simulated device a stand-in naming it (M56) — is `Standins`', which
placement uses too when a resident unit leaves the device.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .devices import DeviceService, absent_like
from .streamer import Streamer
from .units import LeafNeed, Slot, Unit


class Capture(Protocol):
    """M24: what the hooks call instead of streaming while their thread captures a CUDA Graph
    (`graphs.LeafCopies`)."""

    def enter(self, module: nn.Module) -> None: ...
    def exit(self, module: nn.Module) -> None: ...


class Calls(threading.local):
    """The calling thread's entries into a handle's streamed units: per module, how many of our
    pre-hooks ran and await their post-hook; per unit, how deep the thread is inside it, and
    whether its entry swapped all the unit's weights in (else each leaf swaps in its own)."""

    def __init__(self) -> None:
        self.modules: dict[int, int] = {}
        self.units: dict[int, int] = {}
        self.whole: dict[int, bool] = {}  # per unit entered: whether all its weights were swapped in
        self.capture: Capture | None = None  # M24: set while this thread captures a CUDA Graph


class Standins:
    """What a handle's weights hold while they are not on the device (M25, M56)."""

    def __init__(self, devices: DeviceService, name: str, root: nn.Module) -> None:
        self.devices = devices
        self.name = name
        self.root = root  # the handle's module (to name a layer in a stand-in)
        self._derived: dict[tuple[int, str], torch.Tensor] = {}  # legacy weight norm's stand-ins

    def reset(self, root: nn.Module) -> None:
        """The handle holds a new module (`replace`, a new mark): nothing of the old is reused."""
        self.root = root
        self._derived.clear()

    def label(self, slot: Slot) -> str:
        return f"{self.name}.{slot.name}"

    def hold_rest(self, slot: Slot) -> None:
        """What a slot holds off the device: the host tensor, or a strict stand-in (M56)."""
        if self.devices.strict:
            slot.hold_absent(slot.host, self.label(slot))
        else:
            slot.hold(slot.host)  # type: ignore[arg-type]

    def drop_derived(self, derived: Sequence[tuple[nn.Module, str]]) -> None:
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
        return next((n for n, m in self.root.named_modules() if m is module), type(module).__name__)


class UnitHooks:
    """The forward hooks of one handle's streamed units, and the swap of their weights (M17).

    `owner` is the handle: the streamer keeps its copies and learned order under it."""

    def __init__(self, owner: object, streamer: Streamer, standins: Standins) -> None:
        self.owner = owner
        self.streamer = streamer
        self.standins = standins
        self.calls = Calls()
        self._hooks: dict[int, list[RemovableHandle]] = {}

    # ---- which units are hooked ----------------------------------------------------------
    def sync(self, units: Sequence[Unit], streamed: Sequence[Unit]) -> None:
        """Streamed units get hooks; resident units and a whole or absent handle have none."""
        ids = {id(u) for u in streamed}
        for unit in units:
            hooked = id(unit) in self._hooks
            if id(unit) in ids and not hooked:
                self._add(unit)
            elif id(unit) not in ids and hooked:
                for h in self._hooks.pop(id(unit)):
                    h.remove()
            elif hooked:
                for pre, post in zip(self._hooks[id(unit)][::2], self._hooks[id(unit)][1::2]):
                    _order(pre, post)

    def _add(self, unit: Unit) -> None:
        hooks: list[RemovableHandle] = []
        for module in unit.hooked():
            post = module.register_forward_hook(self._post_hook(unit), with_kwargs=True, always_call=True)
            # Ours first: another pre-hook (legacy weight norm) may read the weights.
            pre = module.register_forward_pre_hook(self._pre_hook(unit, post.id), with_kwargs=True, prepend=True)
            hooks += [pre, post]
        self._hooks[id(unit)] = hooks

    def remove(self) -> None:
        for hooks in self._hooks.values():
            for h in hooks:
                h.remove()
        self._hooks.clear()

    def installed(self) -> bool:
        return bool(self._hooks)

    # ---- the hooks ---------------------------------------------------------------------------
    def _pre_hook(self, unit: Unit, post_id: int) -> Any:
        calls = self.calls

        def pre(module: nn.Module, args: Any, kwargs: Any) -> None:
            posts = module._forward_hooks
            if next(reversed(posts)) != post_id:  # ours last: a user's post-hook still sees the weights
                posts.move_to_end(post_id)  # type: ignore[attr-defined]
            capture = calls.capture
            if capture is not None:
                capture.enter(module)  # M24: per-leaf copies into the graph's memory
            else:
                self.enter(module, unit)

        return pre

    def _post_hook(self, unit: Unit) -> Any:
        calls = self.calls

        def post(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            capture = calls.capture
            if capture is not None:
                capture.exit(module)
            else:
                self.exit(module, unit)

        return post

    def enter(self, module: nn.Module, unit: Unit) -> None:
        """The calling thread enters `unit` through `module`: on its first entry the unit's
        weights are swapped to their device copy (nested entries reuse it, M17)."""
        calls = self.calls
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
        calls = self.calls
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

    def end_call(self, units: Sequence[Unit]) -> None:
        """The calling thread's phase with the handle ended: leave every one of `units` it is
        still inside (a `BaseException` skipped their post-hooks) and forget its learned position."""
        calls = self.calls
        stale = [u for u in units if calls.units.get(u.index)]
        calls.units.clear()
        calls.modules.clear()
        calls.whole.clear()
        for unit in stale:
            self._swap_out(unit)
        self.streamer.end_call(self.owner)

    # ---- the swap ------------------------------------------------------------------------------
    def _swap_in(self, unit: Unit) -> bool:
        """Take the unit's copy; when all of it is ready, swap every weight in and return True.
        Else each leaf swaps its own weights in as it runs (`_swap_in_leaf`): a weight read
        before its leaf's forward is the strict stand-in, never a copy still being written."""
        with self.streamer.lock:
            tensors = self.streamer.acquire(self.owner, unit)
            if not self.streamer.is_ready(self.owner, unit):
                return False
            # Also when another thread is inside: its leaves may have swapped in only theirs.
            for slot, tensor in zip(unit.slots, tensors):
                slot.hold(tensor)
            return True

    def _swap_in_leaf(self, unit: Unit, need: LeafNeed) -> None:
        """A leaf about to run: wait for its weights' copy, then swap them in (M17)."""
        with self.streamer.lock:
            tensors = self.streamer.ready(self.owner, unit, need.group)
            for i in need.slots:
                unit.slots[i].hold(tensors[i])

    def _swap_out(self, unit: Unit) -> None:
        with self.streamer.lock:
            if self.streamer.users(self.owner, unit) == 1:  # the last thread inside: swap back
                for slot in unit.slots:
                    self.standins.hold_rest(slot)
                self.standins.drop_derived(unit.derived)
            self.streamer.release(self.owner, unit)


def _order(pre: RemovableHandle, post: RemovableHandle) -> None:
    """Our pre-hook first and our post-hook last on their module, whatever was added since."""
    pres, posts = pre.hooks_dict_ref(), post.hooks_dict_ref()
    if pres is not None and pre.id in pres:
        pres.move_to_end(pre.id, last=False)
    if posts is not None and post.id in posts:
        posts.move_to_end(post.id)
