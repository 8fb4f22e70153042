"""Units, the fixed part and the minimum working set (M11–M14, M16)."""
from __future__ import annotations

import torch
from torch import nn

from mizuoto_runtime import DeviceService, plan_units
from mizuoto_runtime.memory.units import UNIT_MIN_STREAM_BYTES

from support.models import Conv1D, TinyGPT2, TinyLM


def names(plan_slots: list) -> set[str]:
    return {s.name for s in plan_slots}


def test_outermost_list_children_are_units_and_norms_embeddings_are_fixed() -> None:
    plan = plan_units(TinyLM(layers=3))
    assert [u.name for u in plan.units] == ["layers.0", "layers.1", "layers.2"]
    fixed = names(plan.fixed)
    assert "embed.weight" in fixed  # embedding, tied with the head (M14)
    assert "layers.0.norm1.weight" in fixed  # norms stay fixed (M14)
    streamed = {s.name for u in plan.units for s in u.slots}
    assert "layers.0.qkv.weight" in streamed and "layers.0.qkv.bias" in streamed


def test_tied_head_is_fixed_and_counted_once() -> None:
    lm = TinyLM(layers=2)
    plan = plan_units(lm)
    tied = [s for s in plan.fixed if s.param is lm.embed.weight]
    assert len(tied) == 1 and len(tied[0].owners) == 2
    total = sum(p.numel() * p.element_size() for p in lm.parameters()) + sum(
        b.numel() * b.element_size() for b in lm.buffers())
    assert plan.size_bytes == total


def test_first_parameter_stays_fixed() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(512, 512) for _ in range(3))

    net = Net()
    plan = plan_units(net)
    assert any(s.param is net.blocks[0].weight for s in plan.fixed)  # code finds the device from it (M14)
    # block 0 keeps only its 2 KB bias streamable: below 64 KB, so it is not a unit
    assert [u.name for u in plan.units] == ["blocks.1", "blocks.2"]


def test_unit_below_64kb_is_fixed() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 8)
            # each child is >= 1 MB through a buffer, but its streamable weights are tiny
            self.blocks = nn.ModuleList(_Small() for _ in range(2))

    plan = plan_units(Net())
    assert plan.units == []
    assert UNIT_MIN_STREAM_BYTES == 64 * 1024


class _Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.register_buffer("table", torch.zeros(300_000))


def test_children_below_1mb_are_not_units() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(256, 256) for _ in range(4))  # 257 KB each

    assert plan_units(Net()).units == []


def test_memory_units_override() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))
            self.a = nn.Linear(600, 600)
            self.b = nn.Linear(600, 600)
            self.c = nn.LayerNorm(600)

        def memory_units(self) -> list[nn.Module]:
            return [self.b, self.a]

    plan = plan_units(Net())
    assert [u.name for u in plan.units] == ["b", "a"]


def test_streamable_declared_class_streams_and_unknown_layers_stay_fixed() -> None:
    plan = plan_units(TinyGPT2(layers=2))
    streamed = [s for u in plan.units for s in u.slots]
    assert streamed and all(isinstance(o[0], Conv1D) for s in streamed for o in s.owners)

    class Custom(nn.Module):  # reads a weight but does not declare STREAMABLE
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(600, 600))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Parameter(torch.zeros(1))
            self.blocks = nn.ModuleList(Custom() for _ in range(2))

    assert plan_units(Net()).units == []


def test_parameters_shared_across_units_are_fixed() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Parameter(torch.zeros(1))
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512)) for _ in range(3))
            shared = self.blocks[0][0].weight
            for block in self.blocks:
                block[0].weight = shared  # one weight used by every block

    net = Net()
    plan = plan_units(net)
    assert any(s.param is net.blocks[0][0].weight for s in plan.fixed)
    assert all(net.blocks[0][0].weight is not s.param for u in plan.units for s in u.slots)


def test_pin_to_cpu_subtree_is_neither_streamed_nor_fixed() -> None:
    lm = TinyLM(layers=3)
    DeviceService.pin_to_cpu(lm.layers[1])
    plan = plan_units(lm)
    assert [u.name for u in plan.units] == ["layers.0", "layers.2"]
    pinned = names(plan.pinned)
    assert "layers.1.qkv.weight" in pinned and "layers.1.norm1.weight" in pinned
    assert not pinned & names(plan.fixed)


def test_parameterless_module() -> None:
    plan = plan_units(nn.Sequential(nn.ReLU(), nn.Tanh()))
    assert plan.units == [] and plan.fixed == [] and plan.size_bytes == 0
    assert plan.min_working_set(2) == 0


def test_min_working_set_is_fixed_plus_largest_copies() -> None:
    plan = plan_units(TinyLM(layers=4))
    unit = plan.units[0].nbytes
    assert plan.min_working_set(1) == plan.fixed_bytes + unit
    assert plan.min_working_set(2) == plan.fixed_bytes + 2 * unit


def test_first_parameter_of_submodels_that_find_their_device_from_it() -> None:
    class SubModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(512, 512) for _ in range(2))

        @property
        def device(self) -> torch.device:  # as Hugging Face models do
            return next(self.parameters()).device

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))
            self.sub = SubModel()

    net = Net()
    plan = plan_units(net)
    assert any(s.param is net.sub.layers[0].weight for s in plan.fixed)
    assert all(s.param is not net.sub.layers[0].weight for u in plan.units for s in u.slots)


class _SharedInUnit(nn.Module):
    """One list child whose two leaves share a weight, and a third leaf of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(1024, 1024, bias=False)  # 4 MB: a copy group of its own
        self.b = nn.Linear(1024, 1024, bias=False)
        self.b.weight = self.a.weight  # shared inside the unit: it streams with it
        self.c = nn.Linear(1024, 4096, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.b(self.a(x)))


def test_copy_groups_follow_the_leaves_and_a_shared_weight_is_waited_for_by_both() -> None:
    """M17: a unit's copy is made in groups in leaf order, each of at least 4 MB (but the last,
    which joins the one before when smaller); a leaf waits for the group of the last weight it
    reads, and a weight two leaves read is waited for by both."""
    model = nn.Module()
    model.embed = nn.Embedding(8, 1024)  # the first parameter: fixed (M14)
    model.layers = nn.ModuleList([_SharedInUnit()])
    unit = plan_units(model).units[0]
    layer = model.layers[0]
    assert unit.leaves == [layer.a, layer.b, layer.c]
    slot_names = [s.name for s in unit.slots]
    assert [[slot_names[i] for i in g] for g in unit.groups] == [["layers.0.a.weight"], ["layers.0.c.weight"]]
    assert unit.needs[id(layer.a)].group == unit.needs[id(layer.b)].group == 0
    assert unit.needs[id(layer.b)].slots == unit.needs[id(layer.a)].slots
    assert unit.needs[id(layer.c)].group == 1
    assert id(layer) not in unit.needs  # the unit's own module reads no weight of its own


def test_small_leaves_share_a_copy_group() -> None:
    """Leaves join one group until it has 4 MB (a smaller group costs more to wait for than it
    lets run early), and a small tail joins the group before it."""
    unit = plan_units(TinyLM(dim=512, layers=2)).units[0]  # qkv 3 MB, out 1, up 4, down 4
    names = [s.name.split(".")[2] for s in unit.slots]
    assert [[names[i] for i in g] for g in unit.groups] == [["qkv", "qkv", "out", "out"], ["up", "up"],
                                                           ["down", "down"]]
    tiny = plan_units(TinyLM(dim=256, layers=2)).units[0]  # 3 MB in all
    assert len(tiny.groups) == 1 and all(need.group == 0 for need in tiny.needs.values())
