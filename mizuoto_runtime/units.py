"""Units: which weights move together, which stay fixed, and the minimum working set.

M11: a unit is a group of weights that moves together (a decoder layer, a DiT block).
M12: `memory_units()` names them; else every child >= 1 MB of the outermost
`nn.ModuleList` / `nn.Sequential` is a unit (outermost list wins, units are not split).
M13: only weights of Linear, Conv1d/2d, ConvTranspose1d/2d and `STREAMABLE = True`
classes stream. M14: everything else is the fixed part. M16: minimum working set.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from .devices import AbsentParameter, AbsentTensor, DeviceService

UNIT_MIN_CHILD_BYTES = 1 << 20  # M12: a list child of at least 1 MB is a unit
UNIT_MIN_STREAM_BYTES = 64 << 10  # M14: units smaller than 64 KB stay fixed

STREAMABLE_TYPES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.ConvTranspose1d, nn.ConvTranspose2d,
)


def is_streamable(module: nn.Module) -> bool:
    """M13: layers that read their weights only inside their own forward."""
    return isinstance(module, STREAMABLE_TYPES) or bool(getattr(type(module), "STREAMABLE", False))


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclasses.dataclass(eq=False)
class Slot:
    """One parameter or buffer of a component, with every (module, attribute) that holds it.

    The handle changes what the owners hold (device copy, host tensor, strict stand-in);
    a parameter keeps its `nn.Parameter` object so optimizers and `named_parameters` see one.
    """

    name: str
    owners: list[tuple[nn.Module, str]]
    param: nn.Parameter | None  # None for a buffer
    host: torch.Tensor | None
    nbytes: int

    @property
    def is_buffer(self) -> bool:
        return self.param is None

    def current(self) -> torch.Tensor:
        """What the module holds now (a buffer may have been rebound by the model's code)."""
        module, attr = self.owners[0]
        if self.param is not None:
            return self.param.data
        return module._buffers[attr]

    def hold(self, tensor: torch.Tensor) -> None:
        """Make every owner hold `tensor` (a device copy, the host tensor, or a strict stand-in)."""
        if self.param is not None:
            if isinstance(tensor, AbsentParameter):
                for module, attr in self.owners:
                    module._parameters[attr] = tensor
                return
            self.param.data = tensor
            for module, attr in self.owners:
                module._parameters[attr] = self.param
            return
        for module, attr in self.owners:
            module._buffers[attr] = tensor

    def is_absent(self) -> bool:
        module, attr = self.owners[0]
        held = module._buffers[attr] if self.param is None else module._parameters[attr]
        return isinstance(held, (AbsentParameter, AbsentTensor))


@dataclasses.dataclass(eq=False)
class Unit:
    """Weights that move together (M11): the streamable slots of one list child."""

    index: int  # position in run order (discovery order)
    name: str
    module: nn.Module
    slots: list[Slot]
    leaves: list[nn.Module]  # modules that own the unit's slots (hooked, M17)
    nbytes: int


@dataclasses.dataclass
class UnitPlan:
    """A component split into units, the fixed part, and what is pinned to the CPU."""

    units: list[Unit]
    fixed: list[Slot]
    pinned: list[Slot]

    @property
    def fixed_bytes(self) -> int:
        return sum(s.nbytes for s in self.fixed)

    @property
    def size_bytes(self) -> int:
        return self.fixed_bytes + sum(u.nbytes for u in self.units)

    def min_working_set(self, copies: int) -> int:
        """M16: fixed part + the streamer's simultaneous copies of the largest units."""
        largest = sorted((u.nbytes for u in self.units), reverse=True)[:copies]
        return self.fixed_bytes + sum(largest)


def collect_slots(root: nn.Module) -> dict[int, Slot]:
    """Every parameter and buffer under `root`, keyed by tensor identity, with all its owners."""
    slots: dict[int, Slot] = {}
    for mod_name, module in root.named_modules(remove_duplicate=False):
        for table, is_param in ((module._parameters, True), (module._buffers, False)):
            for attr, tensor in table.items():
                if tensor is None:
                    continue
                key = id(tensor)
                full = f"{mod_name}.{attr}" if mod_name else attr
                if key in slots:
                    if (module, attr) not in [(m, a) for m, a in slots[key].owners]:
                        slots[key].owners.append((module, attr))
                    continue
                slots[key] = Slot(
                    name=full,
                    owners=[(module, attr)],
                    param=tensor if is_param else None,  # type: ignore[arg-type]
                    host=tensor.data if is_param else tensor,
                    nbytes=tensor_bytes(tensor),
                )
    return slots


def _subtree_ids(module: nn.Module) -> set[int]:
    return {id(m) for m in module.modules()}


def _module_bytes(module: nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += tensor_bytes(t)
    return total


def candidate_units(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """M12: `memory_units()` if the module names them, else the outermost lists' large children."""
    named = getattr(root, "memory_units", None)
    if callable(named):
        names = {id(m): n for n, m in root.named_modules()}
        return [(names.get(id(m), f"unit{i}"), m) for i, m in enumerate(named())]
    found: list[tuple[str, nn.Module]] = []
    _find_lists(root, "", found)
    return found


def _find_lists(module: nn.Module, prefix: str, found: list[tuple[str, nn.Module]]) -> None:
    if isinstance(module, (nn.ModuleList, nn.Sequential)):
        for name, child in module.named_children():
            if _module_bytes(child) >= UNIT_MIN_CHILD_BYTES:
                found.append((f"{prefix}{name}", child))
        return
    for name, child in module.named_children():
        _find_lists(child, f"{prefix}{name}.", found)


def _marked_ids(marks: Iterable[nn.Module]) -> set[int]:
    ids: set[int] = set()
    for m in marks:
        ids |= _subtree_ids(m)
    return ids


def _pinned_ids(root: nn.Module) -> set[int]:
    ids: set[int] = set()
    for m in root.modules():
        if DeviceService.is_pinned_to_cpu(m):
            ids |= _subtree_ids(m)
    return ids


def plan_units(root: nn.Module, fixed_marks: Iterable[nn.Module] = ()) -> UnitPlan:
    """Split `root` into units and the fixed part (M11–M14)."""
    slots = collect_slots(root)
    pinned_ids = _pinned_ids(root)
    fixed_ids = _marked_ids(fixed_marks)
    anchors = _device_anchors(root)
    pinned = [s for s in slots.values() if any(id(m) in pinned_ids for m, _ in s.owners)]
    taken = {id(s) for s in pinned}
    units: list[Unit] = []
    for name, module in candidate_units(root):
        if id(module) in pinned_ids or id(module) in fixed_ids:
            continue
        inside = _subtree_ids(module)
        unit_slots = [
            s for s in slots.values()
            if id(s) not in taken and _streams(s, inside, fixed_ids, anchors)
        ]
        nbytes = sum(s.nbytes for s in unit_slots)
        if nbytes < UNIT_MIN_STREAM_BYTES:
            continue  # M14: a unit under 64 KB is part of the fixed part
        leaves = list({id(m): m for s in unit_slots for m, _ in s.owners}.values())
        units.append(Unit(len(units), name, module, unit_slots, leaves, nbytes))
        taken |= {id(s) for s in unit_slots}
    fixed = [s for s in slots.values() if id(s) not in taken]
    return UnitPlan(units, fixed, pinned)


def _device_anchors(root: nn.Module) -> set[int]:
    """M14: the model's first parameter stays fixed, since code finds the model's device and
    dtype from it. The same holds for every submodule whose class looks them up the same way
    (a `device` or `dtype` property, as Hugging Face models have), e.g. a code predictor
    inside a talker."""
    anchors: set[int] = set()
    for module in root.modules():
        if module is root or any(isinstance(getattr(type(module), a, None), property) for a in ("device", "dtype")):
            first = next(iter(module.parameters()), None)
            if first is not None:
                anchors.add(id(first))
    return anchors


def _streams(slot: Slot, inside: set[int], fixed_ids: set[int], anchors: set[int]) -> bool:
    """M13/M14: a slot streams if it is a weight of a streamable layer wholly inside the unit."""
    if slot.param is None or id(slot.param) in anchors:
        return False
    return all(
        id(m) in inside and id(m) not in fixed_ids and is_streamable(m) for m, _ in slot.owners
    )


def iter_unit_modules(plan: UnitPlan) -> Iterator[tuple[Unit, nn.Module]]:
    """The modules that get streaming hooks: each unit and each leaf holding its weights (M17)."""
    for unit in plan.units:
        yield unit, unit.module
        for leaf in unit.leaves:
            if leaf is not unit.module:
                yield unit, leaf
