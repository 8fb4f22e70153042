"""The streaming hooks against everything around them (issue 10, items 1-3; issue 13, item 1;
issue 9, item 6; M12, M14, M17-M19, M26, M28, M56), on the simulated strict device.

After any call — finished, raising, or interrupted by a `BaseException` — no unit is entered,
no weight is swapped in and no copy is held; a phase ends holding only its placement.
"""
from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from mizuoto_runtime import (
    CancelledError,
    DeviceService,
    MizuotoError,
    ModelHandle,
    OomInjector,
    StrictDeviceError,
    plan_units,
)
from mizuoto_runtime.memory.pinning import PinnedBudget, Pinner, RecordingRegistrar
from mizuoto_runtime.memory.streamer import StreamCharge, Streamer, charging
from mizuoto_runtime.memory.transfer import BufferedCopyEngine, SimulatedStreams

from conftest import make_manager
from support.models import BufferModel, LegacyWeightNormVocoder, TinyDiT, TinyLM, UnmarkedGPT2, WeightNormVocoder

MB = 1 << 20
CPU = torch.device("cpu")
X = torch.randn(1, 3, 256, generator=torch.Generator().manual_seed(1))


def streamed_lm(layers: int = 4) -> ModelHandle:
    h = ModelHandle(TinyLM(layers=layers), devices=DeviceService(simulate={"cpu": 64 * MB}, strict=True),
                    kind="sequence", name="lm")
    h.load(0)
    assert len(h.streamed_units) == layers
    return h


def assert_at_rest(h: ModelHandle) -> None:
    """Nothing entered, nothing swapped in, no copy: only the placement is on the device."""
    copies = h.streamer._handles[id(h)].copies
    assert not copies, (f"live copies of units {[c.unit.name for c in copies.values()]} "
                        f"(refs {[c.refs for c in copies.values()]})")
    for unit in h.streamed_units:
        for slot in unit.slots:
            with pytest.raises(StrictDeviceError):
                slot.owners[0][0]._parameters[slot.owners[0][1]].sum()  # the stand-in, not a copy
            assert slot.param is not None and slot.host is not None
            assert slot.param.data.data_ptr() == slot.host.data_ptr(), f"{slot.name} points at a copy"


# ---- issue 10, item 1: hooks that survive what runs around them ----------------------------
def test_a_user_pre_hook_that_raises_before_ours_leaves_nothing_to_undo() -> None:
    h = streamed_lm()
    layer = h.module.layers[1]
    with torch.no_grad():
        expected = layer(X, [])
    h.streamer.drop(h)

    def refuse(module: nn.Module, args: object) -> None:
        raise ValueError("a user's pre-hook refused the call")

    hook = layer.qkv.register_forward_pre_hook(refuse, prepend=True)  # runs before ours
    for _ in range(3):
        with pytest.raises(ValueError, match="refused"):
            with torch.no_grad():
                layer(X, [])
    hook.remove()
    h.streamer.drop(h)
    assert_at_rest(h)
    with torch.no_grad():
        assert torch.equal(layer(X, []), expected)  # and the unit still streams exactly
    assert h.streamer.live_copies(h) <= h.copies


def test_our_pre_hook_runs_first_and_our_post_hook_last() -> None:
    """A user's hooks on a streamed leaf see the streamed weights, before and after forward —
    also hooks added after ours (moved behind ours when the placement is set again)."""
    h = streamed_lm()
    leaf = h.module.layers[2].up
    seen: list[float] = []
    leaf.register_forward_pre_hook(lambda m, a: seen.append(float(m.weight.sum())), prepend=True)
    leaf.register_forward_hook(lambda m, a, out: seen.append(float(m.weight.sum())))
    h.load(0)
    with torch.no_grad():
        leaf(torch.randn(1, 256))
    assert len(seen) == 2 and seen[0] == seen[1]
    h.streamer.drop(h)  # outside a phase, a first pass keeps the copy it may reuse
    assert_at_rest(h)


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_a_base_exception_inside_a_unit_leaves_nothing_entered_swapped_or_held(interrupt: type) -> None:
    """PyTorch runs `always_call` post-hooks only for `Exception`: the phase's end leaves the
    units the thread entered."""
    m = make_manager(64, vram_mode="none")
    h = m.register(TinyLM(layers=4), engine="a", name="lm", kind="sequence")

    def stop(module: nn.Module, args: object) -> None:
        raise interrupt()

    hook = h.module.layers[2].down.register_forward_pre_hook(stop)  # after ours: layer 2 is entered
    with pytest.raises(interrupt):
        with m.request().use([h], 0, "talker"), torch.no_grad():
            h.module.step(torch.tensor([[1, 2]]), [[] for _ in range(4)])
    hook.remove()
    assert_at_rest(h)
    assert m.devices.counted_bytes(CPU) == h.loaded_bytes
    with m.request().use([h], 0, "talker"), torch.no_grad():  # and the next request runs
        h.module.step(torch.tensor([[1, 2]]), [[] for _ in range(4)])


def test_a_copy_that_fails_leaves_the_unit_unentered() -> None:
    h = streamed_lm()
    h.devices.fault_hook = OomInjector(at=1)
    with pytest.raises(torch.OutOfMemoryError), torch.no_grad():
        h.module.layers[0](X, [])
    h.devices.fault_hook = None
    assert_at_rest(h)
    with torch.no_grad():
        h.module.layers[0](X, [])


def test_a_cancelled_prefetch_leaves_the_running_unit_unentered() -> None:
    """The copy made ahead checks for cancellation too; the unit entered before it is left."""
    m, h = pinned_manager()
    x, t = torch.randn(2, 8, 192), torch.randn(2, 192)
    with m.request().use([h], 0, "warm"), torch.no_grad():  # type: ignore[attr-defined]
        for block in h.module.blocks:
            block(x, t)  # learns the order: entering a block now copies the next one ahead
    calls = [0]

    def check() -> None:
        calls[0] += 1
        if calls[0] == 2:  # the first block's copy passes, the copy ahead is cancelled
            raise CancelledError("interrupted")

    with pytest.raises(CancelledError), charging(StreamCharge(check)), torch.no_grad():
        h.module.blocks[0](x, t)
    assert all(h.streamer.users(h, u) == 0 for u in h.units)
    h.load(h.min_working_set)  # nothing runs: the placement may change


# ---- issue 13, item 1: streamer hygiene -----------------------------------------------------
@pytest.mark.parametrize("kind", ["sequence", "oneshot"])
def test_no_copy_outlives_its_unit(kind: str) -> None:
    """After a phase: no live copy, every streamed parameter points back at its host tensor
    and holds the stand-in, and the device holds the placement only."""
    m = make_manager(64, vram_mode="none")
    h = m.register(TinyLM(layers=4), engine="a", name="lm", kind=kind)
    ctx = m.request()
    ctx.run("talker", [h], lambda: h.module.generate(torch.tensor([[1, 2]]), 4, torch.Generator().manual_seed(0)))
    assert ctx.meta["memory"]["streamed_mb"] > 0
    assert_at_rest(h)
    assert h.streamer.cached_bytes(h) == 0 and m.devices.counted_bytes(CPU) == h.loaded_bytes


def test_inside_a_phase_a_unit_that_exited_holds_no_copy() -> None:
    """Within a phase too: once a (sequence) unit exits and does not run again at once, its
    parameters point at the host tensor; only the copy buffer stays for the next unit."""
    m = make_manager(64, vram_mode="none")
    h = m.register(TinyLM(layers=4), engine="a", name="lm", kind="sequence")
    with m.request().use([h], 0, "talker"), torch.no_grad():
        for _ in range(2):  # the second pass knows the order: each copy goes at its unit's exit
            h.module.step(torch.tensor([[1, 2]]), [[] for _ in range(4)])
        for unit in h.streamed_units[:-1]:
            assert all(s.param.data.data_ptr() == s.host.data_ptr() for s in unit.slots)  # type: ignore[union-attr]
        assert h.streamer.cached_bytes(h) == h.units[0].nbytes  # one static buffer, reused


def pinned_manager(mb: int = 64) -> tuple[object, ModelHandle]:
    """A manager whose streamer prefetches (pinned host copies), as on CUDA."""
    m = make_manager(mb, vram_mode="none")
    pinner = Pinner("register", RecordingRegistrar(), PinnedBudget(1 << 30))
    m._streamers[str(CPU)] = Streamer(m.devices, CPU, BufferedCopyEngine(m.devices, CPU, SimulatedStreams(), pinner))
    voc = m.register(TinyDiT(), engine="a", name="dit", kind="oneshot")
    return m, voc


def test_learned_successors_never_cross_a_phase() -> None:
    """A oneshot component runs once per phase: its last unit has no successor, so the end of
    one phase copies nothing ahead for the next (issue 13: that copy was thrown away)."""
    m, h = pinned_manager()
    x, t = torch.randn(2, 8, 192), torch.randn(2, 192)

    def once() -> None:
        with torch.no_grad():
            for block in h.module.blocks:
                x_ = block(x, t)  # noqa: F841 - only the copies matter
    streamed = []
    for _ in range(3):
        before = h.streamer.streamed_bytes_of(h)
        m.request().run("decode", [h], once)  # type: ignore[attr-defined]
        streamed.append(h.streamer.streamed_bytes_of(h) - before)
    assert streamed == [sum(u.nbytes for u in h.units)] * 3  # each unit once, nothing ahead
    state = h.streamer._handles[id(h)]
    assert h.units[-1].index not in state.successor


def test_a_streamed_step_allocates_nothing_on_the_simulated_device() -> None:
    """Static copy buffers serve every step: after the first, no device allocation at all."""
    h = streamed_lm()
    counter = OomInjector(at=[])
    with torch.no_grad():
        h.module.step(torch.tensor([[1, 2]]), [[] for _ in range(4)])
        h.devices.fault_hook = counter
        for _ in range(3):
            h.module.step(torch.tensor([[1]]), [[] for _ in range(4)])
    h.devices.fault_hook = None
    assert counter.count == 0 and h.streamer.streamed_bytes_of(h) == 4 * sum(u.nbytes for u in h.units)


# ---- issue 10, item 2: weight norm ----------------------------------------------------------
@pytest.mark.parametrize("factory", [WeightNormVocoder, LegacyWeightNormVocoder])
def test_weight_normed_layers_stream_their_original_tensors(factory: type) -> None:
    plan = plan_units(factory())
    assert len(plan.units) == 6  # three transposed convs, three residual blocks
    names = {s.name for u in plan.units for s in u.slots}
    if factory is WeightNormVocoder:
        assert "ups.0.parametrizations.weight.original0" in names and "ups.0.parametrizations.weight.original1" in names
    else:
        assert {"ups.0.weight_g", "ups.0.weight_v"} <= names


def test_legacy_weight_norm_keeps_no_computed_weight_after_the_unit() -> None:
    """Legacy weight norm stores the weight it computes on the layer: after the unit it is a
    stand-in, not a tensor made from the copy."""
    torch.manual_seed(0)
    model = LegacyWeightNormVocoder()
    h = ModelHandle(model, devices=DeviceService(simulate={"cpu": 64 * MB}, strict=True), name="voc")
    h.load(0)
    with torch.no_grad():
        model(torch.randn(1, 80, 8))
    with pytest.raises(StrictDeviceError, match=r"ups\.0\.weight \(computed by weight_norm\)"):
        model.ups[0].weight.sum()
    h.load(None)  # whole: the layers compute their weights from resident tensors
    with torch.no_grad():
        model(torch.randn(1, 80, 8))
    assert not model.pre.weight.is_meta
    h.offload()  # and once those leave, so does what was computed from them
    for layer in (model.pre, model.ups[0]):
        with pytest.raises(StrictDeviceError, match=r"weight \(computed by weight_norm\)"):
            layer.weight.sum()


def test_the_plan_says_why_weights_are_fixed(caplog: pytest.LogCaptureFixture) -> None:
    """GPT-2's Conv1D as transformers ships it does not declare STREAMABLE: the plan and the
    below-minimum warning say so."""
    h = ModelHandle(UnmarkedGPT2(), devices=DeviceService(simulate={"cpu": 64 * MB}, strict=True), name="gpt2")
    reasons = dict(h.plan.why_fixed())
    assert h.units == [] and any("PlainConv1D" in why and "STREAMABLE = True" in why for why in reasons)
    assert any(r["reason"].startswith("read by PlainConv1D") for r in h.describe()["fixed"])
    with caplog.at_level(logging.INFO):
        h.load(1000)
    assert "below the minimum working set" in caplog.text and "STREAMABLE = True" in caplog.text


def test_every_fixed_reason_is_named() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(512, 512), nn.LayerNorm(512), nn.Linear(512, 512))
                                        for _ in range(3))
            self.blocks[2][2].weight = self.blocks[1][2].weight  # shared by two units
            self.head = nn.Linear(512, 512)

    reasons = dict(plan_units(Net()).why_fixed())
    assert set(reasons) == {
        "the first parameter of a model (code finds the model's device and dtype from it)",
        "shared with modules outside its unit (e.g. a tied embedding and head)",
        "read by LayerNorm layers (only Linear and Conv layers stream; embeddings and norms stay)",
        "outside every unit (no nn.ModuleList / nn.Sequential child of at least 1 MB, no memory_units())",
    }
    assert reasons["shared with modules outside its unit (e.g. a tied embedding and head)"] == 512 * 512 * 4


# ---- issue 10, item 3: registration and unloading -------------------------------------------
@pytest.mark.parametrize("placed", ["never", "offloaded", "partial"])
def test_unregister_works_whatever_the_slots_hold(placed: str) -> None:
    m = make_manager(64)
    h = m.register(BufferModel(), engine="a", name="buffers")
    if placed != "never":
        h.load(None if placed == "offloaded" else h.min_working_set)
        with torch.no_grad():
            h.module(torch.randn(2, 512))
    if placed == "offloaded":
        h.offload()
    m.unregister(h)  # buffers are strict stand-ins here: nothing may read them
    assert h.unloaded and m.handles == [] and m.devices.counted_bytes(CPU) == 0


def test_registering_a_module_twice_is_an_error_naming_the_handle() -> None:
    m = make_manager(64)
    lm = TinyLM(layers=2)
    m.register(lm, engine="a", name="talker", kind="sequence")
    for module in (lm, lm.layers[0]):  # the same module, or one inside it
        with pytest.raises(MizuotoError, match="already registered as a:talker"):
            m.register(module, engine="b", name="again")
    assert len(m.handles) == 1


def test_unregister_while_in_use_unloads_when_the_phase_ends() -> None:
    m = make_manager(64)
    h = m.register(TinyLM(layers=2), engine="a", name="lm", kind="sequence")
    with m.request().use([h], 0, "p"):
        m.unregister(h)
        assert not h.unloaded and h not in m.handles  # the running phase keeps its weights
        with torch.no_grad():
            h.module.step(torch.tensor([[1]]), [[], []])
    assert h.unloaded and m.devices.counted_bytes(CPU) == 0


# ---- issue 9, item 6 ------------------------------------------------------------------------
def test_none_mode_streams_everything_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    m = make_manager(64, vram_mode="none")
    h = m.register(TinyLM(layers=2), engine="a", name="lm", kind="sequence")
    with caplog.at_level(logging.INFO), m.request().use([h], 0, "p"):
        assert len(h.streamed_units) == 2
    assert "below the minimum working set" not in caplog.text


def test_memory_units_are_honoured_on_submodules() -> None:
    """M12: a submodule that names its units decides them for its subtree."""
    class Blocks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(600, 600), nn.Linear(600, 600)
            self.layers = nn.ModuleList(nn.Linear(600, 600) for _ in range(2))  # not its units

        def memory_units(self) -> list[nn.Module]:
            return [self.b, self.a]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))
            self.body = Blocks()
            self.tail = nn.ModuleList(nn.Linear(600, 600) for _ in range(2))

    assert [u.name for u in plan_units(Net()).units] == ["body.b", "body.a", "tail.0", "tail.1"]


def test_hot_and_fixed_marks_survive_replace() -> None:
    """M28 with M15: a replaced module keeps the marks at the same paths."""
    h = ModelHandle(TinyLM(layers=4), devices=DeviceService(simulate={"cpu": 64 * MB}, strict=True),
                    kind="sequence", name="lm")
    h.mark(h.module.layers[3], "hot")
    h.mark(h.module.layers[0], "fixed")
    h.replace(TinyLM(layers=4))
    assert [u.name for u in h.units] == ["layers.1", "layers.2", "layers.3"]  # layers.0 fixed again
    h.load(h.min_working_set + h.units[0].nbytes)
    assert [u.name for u in h.units if u not in h.streamed_units] == ["layers.3"]  # hot again
    with pytest.raises(MizuotoError, match="no submodule 'layers.3'"):
        h.replace(TinyLM(layers=2))
    with pytest.raises(ValueError, match="not part of this component"):
        h.mark(nn.Linear(2, 2), "hot")
