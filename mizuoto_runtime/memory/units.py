"""Units: which weights move together, which stay fixed, and the minimum working set.

M11: a unit is a group of weights that moves together (a decoder layer, a DiT block).
M12: `memory_units()` names them, on the component or on any submodule (that subtree's units
then come from it); else every child >= 1 MB of the outermost `nn.ModuleList` /
`nn.Sequential` is a unit (outermost list wins, units are not split).
M13: only weights of Linear, Conv1d/2d, ConvTranspose1d/2d and `STREAMABLE = True` classes
stream — also when weight norm holds them: `parametrizations.weight.original0/1` (read by
the parametrized layer) or the legacy `weight_g`/`weight_v` (whose derived `weight` the
handle drops when the unit exits). M14: everything else is the fixed part, and the plan says
why each fixed weight is fixed (`UnitPlan.why_fixed`). M16: minimum working set.
"""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable
from typing import cast

import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.weight_norm import WeightNorm

from ..errors import MizuotoError
from .devices import DeviceService, absent_like, device_anchors
from .small_weights import compute_dtype, is_stored_small

UNIT_MIN_CHILD_BYTES = 1 << 20  # M12: a list child of at least 1 MB is a unit
UNIT_MIN_STREAM_BYTES = 64 << 10  # M14: units smaller than 64 KB stay fixed
ALIGN = 512  # the caching allocator's block alignment: a streamed copy's tensors start on it (transfer.py)

STREAMABLE_TYPES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.ConvTranspose1d, nn.ConvTranspose2d,
)

# Why a weight is in the fixed part (M14), as `UnitPlan.why_fixed` reports it.
WHY_BUFFER = "buffers"
WHY_OUTSIDE = "outside every unit (no nn.ModuleList / nn.Sequential child of at least 1 MB, no memory_units())"
WHY_ANCHOR = "the first parameter of a model (code finds the model's device and dtype from it)"
WHY_MARKED = "marked fixed"
WHY_SHARED = "shared with modules outside its unit (e.g. a tied embedding and head)"
WHY_SMALL = "in units under 64 KB"
WHY_LAYER = "read by {cls} layers (only Linear and Conv layers stream; embeddings and norms stay)"
WHY_CUSTOM_LAYER = ("read by {cls} layers, which do not declare STREAMABLE = True (a layer that reads its "
                    "weights only inside its own forward may declare it, as GPT-2's Conv1D can)")


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
    why_fixed: str = ""  # M14: set when the slot is in the fixed part
    standin: torch.Tensor | None = None  # M56: the strict stand-in, made once and reused

    @property
    def is_buffer(self) -> bool:
        return self.param is None

    def current(self) -> torch.Tensor:
        """What the module holds now (a buffer may have been rebound by the model's code)."""
        module, attr = self.owners[0]
        if self.param is not None:
            return self.param.data
        buffer = module._buffers[attr]
        if buffer is None:
            raise MizuotoError(f"buffer {self.name!r} was set to None by the model's code; a placed buffer "
                               "must stay a tensor")
        return buffer

    def hold(self, tensor: torch.Tensor) -> None:
        """Make every owner hold `tensor` (a device copy or the host tensor)."""
        if self.param is not None:
            self.param.data = tensor
            for module, attr in self.owners:
                module._parameters[attr] = self.param
            return
        for module, attr in self.owners:
            module._buffers[attr] = tensor

    def hold_absent(self, backing: torch.Tensor | None, label: str) -> None:
        """M56: every owner holds the strict stand-in (named `label`); the parameter object itself
        points at `backing` (the host tensor, or an empty one), so no device copy outlives its use."""
        # A buffer may come back with another shape (model code rebinds it); a parameter cannot.
        stale = self.standin is None or (self.param is None and backing is not None and (
            self.standin.shape != backing.shape or self.standin.dtype != backing.dtype))
        if stale:
            like = backing if backing is not None else self.current()
            self.standin = absent_like(like, label, self.param is not None)
        if self.param is not None:
            self.param.data = backing if backing is not None else _empty(self.param.dtype)
        table = "_parameters" if self.param is not None else "_buffers"
        for module, attr in self.owners:
            getattr(module, table)[attr] = self.standin


def _empty(dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(0, dtype=dtype)


def copy_bytes(slots: Iterable[Slot]) -> int:
    """The device bytes of a unit's streamed copy: its tensors one after another in one buffer,
    each starting at an `ALIGN` offset (`transfer.py` lays copies out so). What a copy costs,
    not its weights' sum, is what the minimum working set must hold (M16)."""
    end = 0
    for slot in slots:
        end = -(-end // ALIGN) * ALIGN + slot.nbytes
    return max(end, 1)


@dataclasses.dataclass(frozen=True)
class LeafNeed:
    """What one leaf of a unit needs before its forward: the copy group to wait for, and the
    unit's slots (indices) it reads."""

    group: int
    slots: tuple[int, ...]


GROUP_MIN_BYTES = 4 << 20  # a smaller copy group costs more to wait for than it lets run early


def leaf_groups(slots: list[Slot], leaves: list[nn.Module],
                reader: Callable[[nn.Module], nn.Module]) -> tuple[list[tuple[int, ...]], dict[int, LeafNeed]]:
    """Split a unit's slots into copy groups in leaf order — each leaf's weights (those it is
    the first to read) join the open group, which closes at `GROUP_MIN_BYTES` — and say what
    each leaf waits for, so a leaf can run while the unit's later weights are still being
    copied (M17, M20). A unit under twice that size is one group."""
    position = {id(leaf): i for i, leaf in enumerate(leaves)}
    read_by = [sorted({position[id(reader(m))] for m, _ in slot.owners}) for slot in slots]
    groups: list[list[int]] = [[]]
    size = 0
    for leaf_pos in range(len(leaves)):
        own = [i for i, readers in enumerate(read_by) if readers[0] == leaf_pos]
        if size >= GROUP_MIN_BYTES and own:
            groups.append([])
            size = 0
        groups[-1] += own
        size += sum(slots[i].nbytes for i in own)
    if len(groups) > 1 and size < GROUP_MIN_BYTES:
        tail = groups.pop()
        groups[-1] += tail  # a small tail waits with the group before it
    group_of = {i: g for g, members in enumerate(groups) for i in members}
    needs = {}
    for leaf_pos, leaf in enumerate(leaves):
        mine = tuple(i for i, readers in enumerate(read_by) if leaf_pos in readers)
        needs[id(leaf)] = LeafNeed(max(group_of[i] for i in mine), mine)
    return [tuple(sorted(g)) for g in groups], needs


@dataclasses.dataclass(eq=False)
class Unit:
    """Weights that move together (M11): the streamable slots of one list child."""

    index: int  # position in run order (discovery order)
    name: str
    module: nn.Module
    slots: list[Slot]
    leaves: list[nn.Module]  # the layers that read the unit's slots (hooked, M17)
    nbytes: int
    derived: list[tuple[nn.Module, str]] = dataclasses.field(default_factory=list)  # legacy weight norm
    # The copy's groups (slot indices), in leaf order, each of at least GROUP_MIN_BYTES but the
    # one of a small unit (`leaf_groups`). A leaf's weights are ready once the group of the last
    # of them is: groups are copied in order.
    groups: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    needs: dict[int, LeafNeed] = dataclasses.field(default_factory=dict)  # id(leaf) -> what it waits for
    copy_nbytes: int = 0  # its streamed copy's device bytes (`copy_bytes`): nbytes and alignment

    def hooked(self) -> list[nn.Module]:
        """The modules that get streaming hooks: the unit and each layer reading its weights (M17)."""
        return [self.module, *(m for m in self.leaves if m is not self.module)]


@dataclasses.dataclass
class UnitPlan:
    """A component split into units, the fixed part, and what is pinned to the CPU."""

    units: list[Unit]
    fixed: list[Slot]
    pinned: list[Slot]
    derived: list[tuple[nn.Module, str]] = dataclasses.field(default_factory=list)  # legacy weight norm, fixed part

    @property
    def fixed_bytes(self) -> int:
        return sum(s.nbytes for s in self.fixed)

    @property
    def size_bytes(self) -> int:
        return self.fixed_bytes + sum(u.nbytes for u in self.units)

    def min_working_set(self, copies: int) -> int:
        """M16: fixed part + the streamer's simultaneous copies of the largest units, each as its
        copy buffer holds it (`Unit.copy_nbytes`: with alignment). For a component of no more
        units than copies that is a few hundred bytes over its size: placed whole within it
        (`ModelHandle`), streamed (`vram_mode = none`) within it too."""
        largest = sorted((u.copy_nbytes for u in self.units), reverse=True)[:copies]
        return self.fixed_bytes + sum(largest)

    def why_fixed(self) -> list[tuple[str, int]]:
        """M14: why the fixed part is fixed — (reason, bytes), largest first."""
        totals: collections.Counter[str] = collections.Counter()
        for slot in self.fixed:
            totals[slot.why_fixed or WHY_OUTSIDE] += slot.nbytes
        return sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))

    def describe_fixed(self, limit: int = 3) -> str:
        """One line for logs: the fixed part's size and its largest reasons."""
        parts = [f"{nbytes / 2**20:.1f} MB {why}" for why, nbytes in self.why_fixed()[:limit]]
        return f"fixed part {self.fixed_bytes / 2**20:.1f} MB" + (f": {'; '.join(parts)}" if parts else "")


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
                    param=tensor if is_param else None,
                    host=tensor.data if is_param else tensor,
                    nbytes=tensor_bytes(tensor),
                )
    return slots


def _subtree_ids(module: nn.Module) -> set[int]:
    return {id(m) for m in module.modules()}


def _module_bytes(module: nn.Module) -> int:
    """Its weights' bytes, those stored small (`small_weights`) counted at the precision they
    compute in: a weights choice changes what a unit holds, not which blocks are units."""
    widths = {id(m.weight): compute_dtype(m).itemsize for m in module.modules() if is_stored_small(m)}
    seen: set[int] = set()
    total = 0
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * widths.get(id(t), t.element_size())
    return total


def _named_units(module: nn.Module) -> list[nn.Module] | None:
    """What `module.memory_units()` names (M12), or None when it names nothing."""
    named = getattr(module, "memory_units", None)
    if callable(named) and not isinstance(named, nn.Module):
        return list(named())
    return None


def candidate_units(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """M12: `memory_units()` wherever a module names them, else the outermost lists' large children."""
    found: list[tuple[str, nn.Module]] = []
    _find_units(root, "", found)
    return found


def _find_units(module: nn.Module, prefix: str, found: list[tuple[str, nn.Module]]) -> None:
    named = _named_units(module)
    if named is not None:
        names = {id(m): n for n, m in module.named_modules()}
        found.extend((f"{prefix}{names.get(id(m), f'unit{i}')}", m) for i, m in enumerate(named))
        return
    if isinstance(module, (nn.ModuleList, nn.Sequential)) and not isinstance(module, parametrize.ParametrizationList):
        for name, child in module.named_children():
            if _module_bytes(child) >= UNIT_MIN_CHILD_BYTES:
                found.append((f"{prefix}{name}", child))
        return
    for name, child in module.named_children():
        if name == "parametrizations" and parametrize.is_parametrized(module):
            continue  # weight norm's tensors belong to the layer that reads them
        _find_units(child, f"{prefix}{name}.", found)


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


def _readers(root: nn.Module) -> dict[int, nn.Module]:
    """A parametrization's tensors (`X.parametrizations.weight.original0`) are read by X."""
    readers: dict[int, nn.Module] = {}
    for module in root.modules():
        if parametrize.is_parametrized(module):
            # is_parametrized: `parametrizations` is the ModuleDict that torch registered
            for plist in cast(nn.ModuleDict, module.parametrizations).values():
                readers[id(plist)] = module
    return readers


def _legacy_weight_norm(module: nn.Module) -> list[str]:
    """Attributes that legacy `nn.utils.weight_norm` recomputes before each forward."""
    return [h.name for h in module._forward_pre_hooks.values() if isinstance(h, WeightNorm)]


@dataclasses.dataclass
class _Rules:
    """What decides whether a slot streams (M13, M14)."""

    fixed_ids: set[int]
    anchors: set[int]
    readers: dict[int, nn.Module]
    overlapping: set[int]  # modules inside more than one unit (a layer two blocks call)

    def reader(self, module: nn.Module) -> nn.Module:
        return self.readers.get(id(module), module)

    def why_fixed(self, slot: Slot, inside: set[int]) -> str | None:
        """Why `slot`, all of whose readers are inside a unit, does not stream; None if it does."""
        if slot.param is None:
            return WHY_BUFFER
        if id(slot.param) in self.anchors:
            return WHY_ANCHOR
        readers = [self.reader(m) for m, _ in slot.owners]
        if any(id(m) not in inside or id(m) in self.overlapping for m in readers):
            return WHY_SHARED  # streamed, another unit's call would enter this unit inside its own
        if any(id(m) in self.fixed_ids for m in readers):
            return WHY_MARKED
        layer = next((m for m in readers if not is_streamable(m)), None)
        if layer is None:
            return None
        # torch's own layers, and norms and scales (1-D weights) anywhere, stay as they are;
        # another class may be a layer that could declare itself streamable.
        plain = type(layer).__module__.startswith("torch.nn.") or all(p.dim() <= 1 for p in layer.parameters())
        return (WHY_LAYER if plain else WHY_CUSTOM_LAYER).format(cls=type(layer).__name__)


def plan_units(root: nn.Module, fixed_marks: Iterable[nn.Module] = ()) -> UnitPlan:
    """Split `root` into units and the fixed part, saying why each fixed weight is fixed (M11–M14)."""
    slots = collect_slots(root)
    pinned_ids = _pinned_ids(root)
    candidates = candidate_units(root)
    inside_units = collections.Counter(i for _, module in candidates for i in _subtree_ids(module))
    rules = _Rules(_marked_ids(fixed_marks), device_anchors(root), _readers(root),
                   {i for i, n in inside_units.items() if n > 1})
    pinned = [s for s in slots.values() if any(id(m) in pinned_ids for m, _ in s.owners)]
    taken = {id(s) for s in pinned}
    why: dict[int, str] = {}
    units: list[Unit] = []
    for name, module in candidates:
        if id(module) in pinned_ids:
            continue
        inside = _subtree_ids(module)
        touching = [s for s in slots.values() if id(s) not in taken
                    and any(id(rules.reader(m)) in inside for m, _ in s.owners)]
        unit_slots = []
        for slot in touching:
            reason = WHY_MARKED if id(module) in rules.fixed_ids else rules.why_fixed(slot, inside)
            if reason is None:
                unit_slots.append(slot)
            else:
                why.setdefault(id(slot), reason)
        nbytes = sum(s.nbytes for s in unit_slots)
        if nbytes < UNIT_MIN_STREAM_BYTES:
            for slot in unit_slots:
                why.setdefault(id(slot), WHY_SMALL)  # M14: a unit under 64 KB is part of the fixed part
            continue
        leaves = list({id(r): r for s in unit_slots for r in (rules.reader(m) for m, _ in s.owners)}.values())
        derived = [(m, attr) for m in leaves for attr in _legacy_weight_norm(m)]
        groups, needs = leaf_groups(unit_slots, leaves, rules.reader)
        units.append(Unit(len(units), name, module, unit_slots, leaves, nbytes, derived, groups, needs,
                          copy_bytes(unit_slots)))
        taken |= {id(s) for s in unit_slots}
    fixed = [s for s in slots.values() if id(s) not in taken]
    for slot in fixed:
        slot.why_fixed = why.get(id(slot), WHY_BUFFER if slot.is_buffer else WHY_OUTSIDE)
    streamed = {id(m) for u in units for m in u.leaves} | pinned_ids
    derived = [(m, attr) for m in root.modules() if id(m) not in streamed for attr in _legacy_weight_norm(m)]
    return UnitPlan(units, fixed, pinned, derived)
