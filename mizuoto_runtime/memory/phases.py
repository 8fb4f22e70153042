"""The request context: phases, exact OOM retry and fallback (M1–M4, M40–M44).

``ctx.use(handles, memory)`` places the handles for a block and keeps them from yielding
until it ends (M2). ``ctx.run(name, handles, fn, memory, generators=(), fallback=None)`` does
the same for a pure function and adds the exact retry of M40: the failed attempt's frame is
left, the manager makes room (`after_oom`), every random state the run can read is restored,
and the function runs again — same random numbers, same result, slower. Phases under `use`
are not retried (M41).

What a request is charged lives in the request, never in a per-device streamer shared with
other requests: its cancel check (run before every streamed copy and while waiting for the
device, M8, M23), the bytes streamed for it (`meta.memory.streamed_mb`, M50) and its exact
retries, which add up over its phases (`meta.applied.oom_retries`, M40).

It also keeps its timeline (M50, issue 15): when each phase began and ended, who yielded VRAM
for it, its retries and fallbacks; and it publishes its request report (`report.py`) to the
manager's `requests` log whenever a phase begins or ends and when its meta is read. In a
PyTorch profiler trace each phase is a ``mizuoto::phase (name)`` range (`profiling.py`).

An engine that replays a step as a CUDA Graph asks the context for it (`graph_capture`, M24):
the context knows the request's device slots, which a capture needs alone.

The context reaches the manager only through `Manager`, what a request asks of it: the
manager makes contexts (`ModelManager.request`), so this module imports nothing of it.
"""
from __future__ import annotations

import contextlib
import logging
import math
import numbers
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch

from ..errors import ArgumentError, DeviceTooSmallError
from . import graphs
from .calibration import PhaseMeter
from .intra_op import adopt_intra_op_threads
from .profiling import label
from .report import Held, MemoryReport, PhaseRun, Placement, RequestClock, RequestLog, Where, mb, where
from .rng import GLOBAL_RNG
from .small_weights import PUBLISHED
from .streamer import StreamCharge, charging

if TYPE_CHECKING:
    from .devices import DeviceService
    from .handle import ModelHandle
    from .policy import VramPolicy
    from .slots import DeviceSlots

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_OOM_RETRIES = 2  # M40


class _RngState:
    """Every random state a phase may read: torch's global CPU (and CUDA) RNG, the request's
    generator and the engine's named generators (M40.3)."""

    def __init__(self, generators: Sequence[torch.Generator]) -> None:
        self.generators = list(generators)
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.states = [g.get_state() for g in self.generators]

    def restore(self) -> None:
        with GLOBAL_RNG:
            torch.set_rng_state(self.cpu)
            if self.cuda is not None:
                torch.cuda.set_rng_state_all(self.cuda)
        for g, s in zip(self.generators, self.states):
            g.set_state(s)


class Manager(Protocol):
    """What a request asks of the manager (`manager.ModelManager`): to place and release its
    phases' components, to make room after an OOM, and to publish its report."""

    @property
    def devices(self) -> DeviceService: ...
    @property
    def policy(self) -> VramPolicy: ...
    @property
    def requests(self) -> RequestLog: ...
    @property
    def handles(self) -> list[ModelHandle]: ...
    def key(self, handle: ModelHandle) -> str: ...
    def acquire(self, handles: Sequence[ModelHandle], memory: int = 0, *, phase: str = "",
                cancel_check: Callable[[], None] | None = None,
                noted: set[ModelHandle] | None = None) -> list[Placement]: ...
    def release(self, handles: Sequence[ModelHandle]) -> None: ...
    def phase_slots(self, handles: Sequence[ModelHandle]) -> DeviceSlots | None: ...
    def calibrate(self, handles: Sequence[ModelHandle], phase: str, estimate: int, measured: int) -> None: ...
    def after_oom(self, handles: Sequence[ModelHandle]) -> None: ...
    def is_oom(self, exc: BaseException) -> bool: ...


def _check_memory(memory: object, phase: str) -> None:
    """A working-memory estimate is a finite number of bytes >= 0 (M10: bad input is named)."""
    if isinstance(memory, bool) or not isinstance(memory, numbers.Real) or not math.isfinite(memory) or memory < 0:
        raise ArgumentError(f"phase {phase!r}: memory must be a finite number of bytes >= 0, got {memory!r}")


def _held_copies(handles: Sequence[ModelHandle]) -> int:
    """Device bytes the streamer holds for `handles` (live copies and copy buffers kept for reuse)."""
    return sum(h.streamer.cached_bytes(h) for h in dict.fromkeys(handles))


class RequestContext:
    """One request: its phases, its generator, and its `meta` (memory report, what was applied).

    The thread that makes it, and each thread entering a phase, computes with the process's
    intra-op thread count (`intra_op`): a request on a thread of its own — two at once with
    `compute.gpu_jobs` 2 (M8) — gives the numbers the thread that set the count would, also in
    what an engine computes before its first phase (issue 31)."""

    def __init__(self, manager: Manager, *, generator: torch.Generator | None = None,
                 cancel_check: Callable[[], None] | None = None,
                 on_progress: Callable[[int, int], None] | None = None) -> None:
        adopt_intra_op_threads()
        self.manager = manager
        self.generator = generator
        self.cancel_check = cancel_check
        self.on_progress = on_progress  # (done, total) per token or step; a host's progress bar
        self.report = MemoryReport()
        self.applied: dict[str, Any] = {"oom_retries": 0, "fallbacks": []}
        self._weights: dict[str, set[str]] = {}  # engine phase -> what its components' weights are stored as
        self.charge = StreamCharge(cancel_check)  # its streamed bytes and cancel check (M23, M50)
        self._handles: dict[str, ModelHandle] = {}
        self._noted: set[ModelHandle] = set()  # placed below their minimum, said once (ModelHandle.load)
        self.id = manager.requests.new_id()
        self.clock = RequestClock()
        self._running = 0  # phases begun and not ended
        self._where: Where | None = None

    @property
    def meta(self) -> dict[str, Any]:
        """`meta.memory` (M50, with the request report as `request`) and `meta.applied` (M40,
        M42) of this request so far."""
        request = self._publish()
        return {"memory": {**self.report.as_meta(), "request": request}, "applied": self._applied()}

    def _applied(self) -> dict[str, Any]:
        """`meta.applied`; with `weights` (per engine phase) once a phase ran with weights stored
        other than as published (issue 36: a choice that changes numbers is said)."""
        applied = dict(self.applied)
        weights = {phase: " + ".join(sorted(stored)) for phase, stored in self._weights.items()}
        if any(w != PUBLISHED for w in weights.values()):
            applied["weights"] = weights
        return applied

    def _refresh(self) -> None:
        """Fold in what happened after each phase: what each component holds now, who gave VRAM
        up for later phases and what streamed for whom (M50)."""
        self.report.streamed_bytes = self.charge.streamed_bytes
        for key, h in self._handles.items():
            self.report.streamed_by[key] = self.charge.by_owner.get(id(h), 0)
            p = self.report.components.get(key)
            if p is None:
                continue
            p.held_now = h.loaded_bytes if self.manager.devices.moves(h.device) else p.loaded_bytes
            if h.gave_up_for:
                p.gave_up_for, p.held_after = list(h.gave_up_for), h.loaded_bytes

    # ---- the request report and its timeline (report.py) ---------------------------------
    def _now(self) -> float:
        return self.clock.now()

    def report_dict(self) -> dict[str, Any]:
        """This request's report (the route's `requests` entries; format in report.py)."""
        self._refresh()
        place = self._where or where(self.manager.devices, self.manager.devices.compute_device())
        held = {key: Held(self.report.components[key].held_bytes, tuple(h.gave_up_for), h.unloaded, h.weights)
                for key, h in self._handles.items() if key in self.report.components}
        now = self._now()
        return {
            "id": self.id,
            "started_at": round(self.clock.started_at, 3),
            "duration_s": round(now, 4),
            "running": self._running > 0,
            "device": place.name,
            "device_mb": None if place.total_bytes is None else mb(place.total_bytes),
            "streamed_mb": mb(self.charge.streamed_bytes),
            "oom_retries": self.applied["oom_retries"],
            "fallbacks": list(self.applied["fallbacks"]),
            "components": self.report.component_entries(held, place),
            "timeline": self.report.timeline_entries(now),
        }

    def _publish(self) -> dict[str, Any]:
        report = self.report_dict()
        self.manager.requests.publish(report)
        return report

    def _begin(self, name: str) -> PhaseRun:
        run = PhaseRun(name, self._now())
        self.report.timeline.append(run)
        self._running += 1
        return run

    def _end(self, run: PhaseRun) -> None:
        run.end_s = self._now()
        self._running -= 1
        self._publish()

    def _device_bytes(self, handles: Sequence[ModelHandle]) -> dict[ModelHandle, int]:
        """What every other component on the phase's device holds (to see who yields for it)."""
        if not handles:
            return {}
        device = handles[0].device
        return {h: h.loaded_bytes for h in list(self.manager.handles) if h.device == device and h not in handles}

    def _note_yields(self, run: PhaseRun, before: dict[ModelHandle, int], handles: Sequence[ModelHandle]) -> None:
        """Components that gave up VRAM while this phase was placed (or after its OOM), and for
        whom: the phase's components they name, else all of them (ComfyUI asked on its behalf)."""
        keys = [self.manager.key(h) for h in dict.fromkeys(handles)]
        at = self._now()
        for h, nbytes in before.items():
            if h.loaded_bytes < nbytes:
                for_whom = [k for k in keys if k in h.gave_up_for] or keys
                run.add_yield(self.manager.key(h), for_whom, nbytes - h.loaded_bytes, at)

    def _after_oom(self, handles: Sequence[ModelHandle], run: PhaseRun) -> None:
        before = self._device_bytes(handles)
        self.manager.after_oom(handles)
        self._note_yields(run, before, handles)

    def check_cancelled(self) -> None:
        if self.cancel_check is not None:
            self.cancel_check()

    def progress(self, done: int, total: int) -> None:
        """Report progress and check for cancellation (engines call it per token or step)."""
        self.check_cancelled()
        if self.on_progress is not None:
            self.on_progress(done, total)

    @contextlib.contextmanager
    def use(self, handles: Sequence[ModelHandle], memory: int = 0, name: str = "phase") -> Iterator[list[Placement]]:
        """M2: place `handles` with `memory` bytes of working memory; none yields until the block
        ends. The calling thread takes the process's intra-op thread count first (see the class)."""
        adopt_intra_op_threads()
        record = self._begin(name)
        try:
            with label("mizuoto::phase", name), self._attempt(handles, memory, name, record) as placements:
                yield placements
        finally:
            self._end(record)

    @contextlib.contextmanager
    def _attempt(self, handles: Sequence[ModelHandle], memory: int, name: str,
                 record: PhaseRun) -> Iterator[list[Placement]]:
        """One attempt of a phase, recorded in its timeline entry: who yielded VRAM while it was
        placed, its placements, and the bytes streamed for each of its components."""
        before = self._device_bytes(handles)
        owners = {self.manager.key(h): id(h) for h in dict.fromkeys(handles)}
        for h in handles:
            if h.weights_phase is not None:
                self._weights.setdefault(h.weights_phase, set()).add(h.weights)
        start = {key: self.charge.by_owner.get(owner, 0) for key, owner in owners.items()}
        try:
            with self._placed(handles, memory, name) as placements:
                self._note_yields(record, before, handles)
                if handles and self._where is None:
                    self._where = where(self.manager.devices, handles[0].device)
                record.placements.extend(placements)
                self._publish()
                yield placements
        finally:
            for key, owner in owners.items():
                record.streamed[key] = record.streamed.get(key, 0) + self.charge.by_owner.get(owner, 0) - start[key]

    @contextlib.contextmanager
    def _placed(self, handles: Sequence[ModelHandle], memory: int, name: str) -> Iterator[list[Placement]]:
        """`use` without the timeline: place, run the block, calibrate, release."""
        _check_memory(memory, name)
        # A layer whose weights are stored small casts one weight at a time to compute with it.
        memory += max((h.cast_bytes for h in handles), default=0)
        self.check_cancelled()
        placements = self.manager.acquire(handles, memory, phase=name, cancel_check=self.cancel_check,
                                          noted=self._noted)
        try:
            for h, p in zip(dict.fromkeys(handles), placements):
                self._handles[p.component] = h
                self.report.add(p)
            meter = self._meter(handles)
            slots = self.manager.phase_slots(handles)
            alone = slots.alone() if meter is not None and slots is not None else None
            with charging(self.charge):
                yield placements
            # M47 learns only from a phase no other request overlapped: the peak is the device's.
            if meter is not None and alone is not None and slots is not None and slots.alone() == alone:
                copies = sum(h.min_working_set - h.plan.fixed_bytes for h in handles if h.is_partial)
                self.manager.calibrate(handles, name, memory, meter.working_bytes(copies, _held_copies(handles)))
        finally:
            self.manager.release(handles)

    def _meter(self, handles: Sequence[ModelHandle]) -> PhaseMeter | None:
        if not handles:
            return None
        device = handles[0].device
        meter = PhaseMeter.for_device(device, self.manager.devices.is_simulated(device))
        if meter is not None:
            meter.placed_now(_held_copies(handles))
        return meter

    def graph_capture(self, handle: ModelHandle, fn: Callable[[], Any], *, what: str,
                      keep_rng: bool = False) -> tuple[graphs.CapturedGraph | None, str]:
        """M24: `fn()`, which reads static inputs, captured as a CUDA Graph over `handle`'s
        placement, for the engine to `replay()` at each step: (the graph, "captured"), or
        (None, why not), and the engine runs `fn` eagerly, with the same numbers.

        Called inside a phase that lists `handle`. No capture where `graphs.eligible` says no
        (not a CUDA device, partly placed, cudaMallocAsync, a host that forbids it), nor while
        another request holds the device. A capture that fails leaves nothing behind, and
        `what` names it in the log, once per kind of failure. `keep_rng`: the warm-up's random
        draws are undone, so the replays draw what eager runs would.
        """
        ok, reason = graphs.eligible(handle)
        if not ok:
            return None, reason
        try:
            return graphs.capture(handle, fn, keep_rng=keep_rng, slots=self.manager.phase_slots([handle])), "captured"
        except graphs.GraphRefused as exc:  # another request holds the device
            return None, str(exc).rpartition("no CUDA Graph: ")[2]
        except RuntimeError as exc:  # a kernel that cannot be captured: `capture` undid what it did
            return None, graphs.note_failure(what, exc)

    def run(self, name: str, handles: Sequence[ModelHandle], fn: Callable[[], T], memory: int = 0,
            generators: Sequence[torch.Generator] = (), fallback: tuple[str, Callable[[], T]] | None = None,
            allow_fallback: bool | None = None) -> T:
        """M3: run `fn` in a phase; on OOM retry exactly (M40), then fall back if allowed (M42).

        `allow_fallback` is the caller's own switch (M44: a node's toggle); None leaves it to
        `compute.oom_fallback`. The attempts are one entry of the timeline, their retries and
        fallback marked in it.
        """
        record = self._begin(name)
        try:
            with label("mizuoto::phase", name):
                return self._run(record, name, handles, fn, memory, generators, fallback, allow_fallback)
        finally:
            self._end(record)

    def _run(self, record: PhaseRun, name: str, handles: Sequence[ModelHandle], fn: Callable[[], T], memory: int,
             generators: Sequence[torch.Generator], fallback: tuple[str, Callable[[], T]] | None,
             allow_fallback: bool | None) -> T:
        gens = ([self.generator] if self.generator is not None else []) + list(generators)
        rng = _RngState(gens)
        policy = self.manager.policy
        retries = MAX_OOM_RETRIES if policy.oom_retry else 0
        allowed = policy.oom_fallback if allow_fallback is None else allow_fallback
        use_fallback = fallback is not None and allowed
        attempt = 0
        while True:
            try:
                with self._attempt(handles, memory, name, record):
                    return fn()
            except DeviceTooSmallError:
                raise  # no retry makes the device larger (M7)
            except Exception as exc:
                # Whatever the host counts as out of memory (ComfyUI: `AcceleratorError` OOMs too).
                if not self.manager.is_oom(exc):
                    raise
                if attempt >= retries and not use_fallback:
                    raise  # the original error, with its traceback
                error = f"{type(exc).__name__}: out of memory"
                if attempt >= retries:
                    break
            # M40.1: we are out of the except block, so the failed attempt's frames are gone.
            attempt += 1
            self.applied["oom_retries"] += 1  # all phases of the request together
            record.retries.append({"at_s": round(self._now(), 4), "attempt": attempt, "error": error})
            log.warning("phase %r ran out of memory; retrying exactly with less on the device (%d/%d)",
                        name, attempt, retries)
            self._after_oom(handles, record)
            rng.restore()
        assert fallback is not None
        what, fallback_fn = fallback
        self._after_oom(handles, record)
        rng.restore()
        log.warning("phase %r still out of memory after %d retries: using fallback %r (output differs slightly)",
                    name, retries, what)
        self.applied["fallbacks"].append(what)
        record.fallbacks.append({"what": what, "at_s": round(self._now(), 4), "error": error})
        with self._attempt(handles, memory, name, record):
            return fallback_fn()
