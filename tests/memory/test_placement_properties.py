"""Placement and streaming invariants as properties (M7, M9, M15–M20, M55–M57; issue 21).

Random module trees — uneven units (one up to 60 % of the model), a weight shared by two units,
buffers, fixed parts, `oneshot` and `sequence` handles, one to three components per phase, a
sampler loop with CFG as two calls or one batched call, units entered whole or leaf by leaf
(VoxCPM's `forward_step`), `compute.gpu_jobs` 1 or 2 — run on the strict simulated device at
random sizes from below the phase's minimum working set to twice the model. For every case
(the invariants `streamer.py` and `manager.py` state):

* the device holds the phase's minimum working set: the request runs and its output is
  `torch.equal` to the plain run (between the minimum and the minimum plus the working-memory
  estimate it is tried at the minimum, M7: an estimate never refuses);
* below it: the one-line "needs at least" error before any work (nothing placed or copied);
* the device's counted bytes never exceed its size, nor what the placements accounted for (each
  handle's placement plus, where units stream, its copies' room);
* resident bytes never decrease and streamed bytes never increase as the device grows;
* no mode (`normal`, `low`) streams more than `none` on the same device;
* after the request nothing is entered, no copy is left, and the device counts what the
  handles hold.

The default suite runs `EXAMPLES` cases (a fixed seed: the same cases every run); `-m soak`
runs `SOAK_EXAMPLES` random ones. Failures hypothesis found and shrank stay as `@example`s.
"""
from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Sequence

import pytest
import torch
from torch import nn

from mizuoto_runtime import DeviceService
from mizuoto_runtime.errors import DeviceTooSmallError
from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.memory.intra_op import computing_thread
from mizuoto_runtime.memory.manager import ModelManager, _footprint
from mizuoto_runtime.memory.policy import VramPolicy
from mizuoto_runtime.memory.units import plan_units

hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402

MB = 1 << 20
WIDTH = 64  # the models' feature width: a unit of `hidden` columns holds about 2 * WIDTH * hidden * 4 bytes
EXAMPLES = 250
SOAK_EXAMPLES = 3000
CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---- random module trees -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Tree:
    """One component: its units' hidden widths, which unit shares its first layer with another,
    whether a stem (fixed: outside every unit) and buffers are there, and its handle's kind."""

    hidden: tuple[int, ...]
    shared: tuple[int, int] | None  # (i, j): unit j's first layer is unit i's (a weight two units read)
    stem: bool
    buffers: bool
    kind: str


@dataclasses.dataclass(frozen=True)
class Case:
    trees: tuple[Tree, ...]
    batched: bool  # CFG as one batched call (else two calls per step)
    per_leaf: bool  # units entered leaf by leaf, as VoxCPM's forward_step does
    gpu_jobs: int
    working_mb: float  # the phase's working-memory estimate


class Block(nn.Module):
    def __init__(self, hidden: int, buffers: bool) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, hidden)
        self.down = nn.Linear(hidden, WIDTH)
        if buffers:
            self.register_buffer("scale", torch.linspace(0.5, 1.5, WIDTH))
        else:
            self.scale = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.step(x, self.up, self.down)

    def step(self, x: torch.Tensor, up: nn.Module, down: nn.Module) -> torch.Tensor:
        y = down(torch.nn.functional.gelu(up(x)))
        return x + (y * self.scale if self.scale is not None else y)


class Model(nn.Module):
    def __init__(self, tree: Tree, per_leaf: bool) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH)) if tree.stem else None
        self.blocks = nn.ModuleList(Block(h, tree.buffers) for h in tree.hidden)
        if tree.shared is not None:
            i, j = tree.shared
            self.blocks[j].up = self.blocks[i].up
        self.per_leaf = per_leaf

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stem is not None:
            x = self.stem(x)
        for block in self.blocks:
            # Leaf by leaf: the block's layers are called from here, the block itself never is.
            x = block.step(x, block.up, block.down) if self.per_leaf else block(x)
        return x


def build(case: Case) -> list[nn.Module]:
    torch.manual_seed(7)
    return [Model(tree, case.per_leaf).eval() for tree in case.trees]


@st.composite
def trees(draw: st.DrawFn) -> Tree:
    n = draw(st.integers(1, 5))
    # Units of 1 MB (M12: a list child of at least 1 MB is a unit) up to a few MB...
    hidden = [draw(st.integers(1024, 4096)) for _ in range(n)]
    if n > 1 and draw(st.booleans()):  # ...and one up to 60 % of the model
        share = draw(st.floats(0.3, 0.6))
        big = int(share / (1 - share) * sum(hidden[1:]))
        hidden[0] = max(1024, big)
        hidden = draw(st.permutations(hidden))
    shared = None
    if n > 1 and draw(st.booleans()):
        i, j = sorted(draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True)))
        hidden[j] = hidden[i]
        shared = (i, j)
    return Tree(tuple(hidden), shared, draw(st.booleans()), draw(st.booleans()),
                draw(st.sampled_from(["oneshot", "sequence"])))


cases = st.builds(Case, st.lists(trees(), min_size=1, max_size=3).map(tuple), st.booleans(), st.booleans(),
                  st.sampled_from([1, 2]), st.sampled_from([0.0, 0.5, 2.0]))


# ---- the sampler loop ----------------------------------------------------------------------
STEPS = 2


def sample(models: Sequence[nn.Module], batched: bool) -> torch.Tensor:
    """A CFG sampler over the phase's components (each feeds the next)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, WIDTH, generator=gen)
    cond, uncond = torch.randn(1, WIDTH, generator=gen), torch.randn(1, WIDTH, generator=gen)

    def model(h: torch.Tensor) -> torch.Tensor:
        for m in models:
            h = m(h)
        return h

    with torch.no_grad():
        for _ in range(STEPS):
            if batched:
                c, u = model(torch.cat([x + cond, x + uncond])).chunk(2)
            else:
                c, u = model(x + cond), model(x + uncond)
            x = x - 0.1 * (u + 3 * (c - u))
    return x


def copies_of(kind: str) -> int:
    return 1 if kind == "sequence" else VramPolicy().copies_in_flight()


def min_working_set(case: Case, models: Sequence[nn.Module]) -> int:
    return sum(plan_units(m).min_working_set(copies_of(t.kind)) for m, t in zip(models, case.trees))


def model_bytes(models: Sequence[nn.Module]) -> int:
    return sum(plan_units(m).size_bytes for m in models)


@dataclasses.dataclass
class Outcome:
    outputs: list[torch.Tensor]
    resident: int  # bytes of weights resident during the phase
    once: int  # bytes of the streamed units' weights: one copy of each
    streamed: int  # bytes copied for the requests
    peak: int  # the device's peak counted bytes
    accounted: int  # what the placements accounted for: placement + copies' room


def run(case: Case, models: Sequence[nn.Module], device_bytes: int, mode: str = "normal") -> Outcome:
    """The sampler loop as one request (two at once with gpu_jobs 2) on a fresh manager."""
    devices = DeviceService(simulate={"cpu": device_bytes}, strict=True)
    manager = ModelManager(devices, VramPolicy({"compute.vram_mode": mode, "compute.gpu_jobs": case.gpu_jobs}))
    placed = [copy.deepcopy(m) for m in models]
    handles = [manager.register(m, engine="prop", name=f"c{i}", kind=t.kind)  # type: ignore[arg-type]
               for i, (m, t) in enumerate(zip(placed, case.trees))]
    outcome = Outcome([], 0, 0, 0, 0, 0)
    errors: list[BaseException] = []
    lock = threading.Lock()

    def request() -> None:
        ctx = manager.request()
        try:
            with ctx.use(handles, int(case.working_mb * MB), "sample"):
                with lock:
                    outcome.resident = sum(h.loaded_bytes for h in handles)
                    outcome.accounted = sum(_footprint(h) for h in handles)
                    outcome.once = sum(u.nbytes for h in handles for u in h.streamed_units)
                got = sample(placed, case.batched)
            assert_nothing_entered(handles)
            with lock:
                outcome.outputs.append(got)
                outcome.streamed += ctx.charge.streamed_bytes
        except BaseException as exc:  # noqa: BLE001 -- handed to the test's thread
            errors.append(exc)

    if case.gpu_jobs == 1:
        request()
    else:
        # The test's intra-op thread count (`one_torch_thread`), as the plain run's (issue 31).
        threads = [computing_thread(request) for _ in range(case.gpu_jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        if isinstance(errors[0], DeviceTooSmallError):  # refused before any work
            assert devices.counted_bytes(CPU) == 0 and manager.streamed_bytes() == 0 and not outcome.outputs
        raise errors[0]
    outcome.peak = devices.peak_counted_bytes(CPU)
    assert_settled(manager, handles)
    return outcome


def assert_nothing_entered(handles: Sequence[ModelHandle]) -> None:
    """The calling thread is inside no unit once its request ended."""
    for h in handles:
        assert not h._calls.units and not any(h._calls.modules.values()), f"{h.name}: a unit is still entered"


def assert_settled(manager: ModelManager, handles: Sequence[ModelHandle]) -> None:
    """After the request: no copy is used or kept, the device counts what the handles hold."""
    for h in handles:
        assert all(h.streamer.users(h, u) == 0 for u in h.units), f"{h.name}: a copy is still referenced"
        assert h.streamer.live_copies(h) == 0 and h.streamer.cached_bytes(h) == 0, f"{h.name}: copies outlive the phase"
        assert not h.in_use
    assert manager.devices.counted_bytes(CPU) == sum(h.device_bytes for h in handles)


# ---- the properties ------------------------------------------------------------------------
def check_case(case: Case, small: float, large: float, below: float) -> None:
    """`small` <= `large` in [0, 1]: device sizes between the minimum working set and twice the
    model; `below` in [0, 1): a size under the minimum."""
    models = build(case)
    expected = sample(models, case.batched)
    need = min_working_set(case, models)
    top = 2 * model_bytes(models)
    sizes = [need + int(f * (top - need)) for f in (small, large)]
    outcomes = {size: run(case, models, size) for size in sizes}
    for size, out in outcomes.items():
        assert len(out.outputs) == case.gpu_jobs
        for got in out.outputs:
            assert torch.equal(got, expected), f"{size} B: differs from the plain run"
        assert out.peak <= size, f"{size} B: the device counted {out.peak} B"
        assert out.peak <= out.accounted, f"{size} B: peak {out.peak} B over the accounted {out.accounted} B"
    none, low = (run(case, models, sizes[0], mode=mode) for mode in ("none", "low"))
    for out in (none, low):
        assert all(torch.equal(got, expected) for got in out.outputs)
        assert out.peak <= min(sizes[0], out.accounted)
    if case.gpu_jobs == 1:  # two requests at once interleave their copies: no order to compare
        lo, hi = outcomes[sizes[0]], outcomes[sizes[1]]
        assert lo.resident <= hi.resident, f"resident {lo.resident} B at {sizes[0]} B, {hi.resident} B at {sizes[1]} B"
        assert lo.streamed >= hi.streamed, f"streamed {lo.streamed} B at {sizes[0]} B, {hi.streamed} B at {sizes[1]} B"
        assert lo.streamed <= none.streamed, f"streamed {lo.streamed} B, with vram_mode none {none.streamed} B"
        assert low.streamed <= none.streamed, f"vram_mode low streamed {low.streamed} B, none {none.streamed} B"
        # One copy of each streamed unit per call (entered leaf by leaf too), and the next call's
        # first copies made ahead by the last one.
        calls = STEPS * (1 if case.batched else 2)
        for out in (lo, hi, none, low):
            assert out.streamed <= (calls + 1) * out.once, f"streamed {out.streamed} B in {calls} calls"
    check_too_small(case, models, min(max(1, int(below * need)), need - 1))


def check_too_small(case: Case, models: Sequence[nn.Module], size: int) -> None:
    """Below the minimum working set: the one-line error before any work."""
    with pytest.raises(DeviceTooSmallError) as err:
        run(case, models, size)
    message = str(err.value)
    assert "needs at least" in message and "\n" not in message


PROPERTY = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                database=None)


def oneshot(*hidden: int, shared: tuple[int, int] | None = None, kind: str = "oneshot") -> Tree:
    return Tree(hidden, shared, False, False, kind)


# Found by this test (shrunk where hypothesis could):
# - 8eba83a's kept copies: a small unit's copy kept in the largest unit's buffer, then the largest
#   unit's copy made beside it: an OOM at the minimum working set, in both CFG forms;
# - a one-unit component at its minimum working set: its copy's alignment made streaming need
#   more than the whole component, and the placement streamed it;
# - a layer two units call (`blocks[1].up = blocks[0].up`) streamed with the first unit: the
#   second unit entered it from inside its own, one copy over the handle's room.
# Found on CI on a 2-core Intel Xeon (issue 31: Intel MKL on its Intel code path, gpu_jobs=2,
# one_torch_thread): one of the two requests, on a thread that had not taken the one intra-op
# thread, ran its K=1145 products on MKL's default two threads and differed by 1.19e-7.
@example(Case((oneshot(1145),), True, False, 2, 0.0), 0.0, 0.0, 0.0)
@example(Case((oneshot(2740, 2740, 1121, 2707),), True, False, 1, 0.0), 0.0, 0.0, 0.0)
@example(Case((oneshot(2740, 2740, 1121, 2707),), False, False, 1, 0.0), 0.0, 0.0, 0.0)
@example(Case((oneshot(2032),), False, False, 1, 0.5), 0.0, 0.0, 0.0)
@example(Case((oneshot(2032),), False, False, 1, 2.0), 1.0, 1.0, 0.0)
@example(Case((oneshot(1024), oneshot(2032, 2032, shared=(0, 1), kind="sequence")), False, False, 1, 0.5),
         0.2675, 0.8169, 0.7583)
@settings(max_examples=EXAMPLES, derandomize=True, **PROPERTY)
@given(cases, st.floats(0, 1), st.floats(0, 1), st.floats(0, 0.999))
def test_placement_invariants(case: Case, a: float, b: float, below: float) -> None:
    check_case(case, min(a, b), max(a, b), below)


@pytest.mark.soak
@settings(max_examples=SOAK_EXAMPLES, **PROPERTY)
@given(cases, st.floats(0, 1), st.floats(0, 1), st.floats(0, 0.999))
def test_placement_invariants_soak(case: Case, a: float, b: float, below: float) -> None:
    check_case(case, min(a, b), max(a, b), below)
