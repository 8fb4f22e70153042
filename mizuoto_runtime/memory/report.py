"""What each request placed, streamed and gave up, and why: `meta.memory` (M50), the request
report people read and programs parse, and the `/mizuoto/runtime` payload (M51).

The manager records a `Placement` per component per phase; the request folds them into
``ctx.meta["memory"]``. The same facts go to the log when a partial placement happens.

``meta.memory`` (M50; every output's, and the `memory` string output of the nodes as JSON)
keeps its fields: ``streamed_mb`` (bytes copied from host RAM for this request only),
``loaded_mb`` / ``size_mb`` (sums over its components), ``components`` {name: {phase,
loaded_mb (on the device during its phase), held_mb (NEW: what it holds now), size_mb}},
``partial`` {name: {reason, mode, free_mb, working_mb, reserve_mb, loaded_mb, size_mb,
gave_up_for}} (for reason "yielded for another component" loaded_mb is what it holds now, i.e.
its held_mb) and ``phases`` (an engine's breakdown of a phase's working memory). Added beside
them: ``request`` — the request report below, the same dict the route lists.

The `/mizuoto/runtime` payload (GET, no input; also `mizuoto runtime [--url]`)
-------------------------------------------------------------------------------
All sizes in MB are MiB (2**20 bytes), rounded to 2 decimals; bytes are ints; times in seconds.

    {
      "device": {"device": "cpu", "simulated": true, "strict": true, "total_mb": 16.0,
                 "free_mb": 11.8,
                 "name": "simulated GPU, 16 MB"},   # NEW: the device in plain words
      "policy": {...},                              # unchanged (VramPolicy.describe)
      "models": [                                   # current state, one per loaded component
        {"engine": "demo", "name": "acoustic", "kind": "oneshot",
         "size_bytes": ..., "loaded_bytes": ..., "host_bytes": ..., "units": 4,
         "resident_units": 0, "min_working_set": ..., "fixed": [...],
         "weights": "as published" | "fp8_e4m3fn" | ...,  # NEW (issue 36): how its Linear and
                                       # Conv weights are stored; every byte count is stored bytes
         "streamed_bytes": ...,        # CHANGED: bytes streamed for it in the LAST request that
                                       # used it (0 if none yet), no longer a running total
         "streamed_bytes_total": ...,  # NEW: every byte streamed for it since it loaded
         "fixed_bytes": ...,           # NEW: bytes that always stay on the device when placed
                                       # (not in a unit: embeddings, norms, ...)
         "why": "budget too small" | "gave its VRAM to ComfyUI's models" | null,  # NEW: why it
                                       # is not whole on the device now (an M50 reason, or yielded)
         "line": "demo:acoustic 11.7 MB: 4.2 MB on the GPU (0.5 MB that always stays + 1 of 4 "
                 "layers), 7.5 MB in RAM, streamed when used (not enough free VRAM)"}
                                       # NEW: the current state in plain words; with weights
                                       # stored small, "demo:acoustic 3.0 MB (weights stored as
                                       # fp8_e4m3fn): ..."
      ],
      "requests": [ <request report>, ... ]   # NEW: the last REQUESTS_KEPT requests, newest last
    }

A request report (also ``meta.memory.request``; one per request: a Text to Speech run, or one
step-by-step node's run):

    {"id": 7,                      # increasing within the process
     "started_at": 1764590000.25,  # Unix time
     "duration_s": 1.42,           # so far, while "running"
     "running": false,             # true while one of its phases is still running
     "device": "simulated GPU, 16 MB",
     "device_mb": 16.0,            # the device's size; null where host RAM is the device (CPU)
     "streamed_mb": 30.1,          # copied from RAM for this request only (= meta.memory.streamed_mb)
     "oom_retries": 0, "fallbacks": [],   # = meta.applied
     "components": [               # every component the request used, exactly once
       {"name": "demo:acoustic",   # the manager's key, engine:component
        "phases": ["acoustic"],    # the phases it ran in, in order, each once
        "total_mb": 11.7,          # its weights
        "on_device_mb": 4.2,       # on the device during its (last) phase
        "from_ram_mb": 7.5,        # = total_mb - on_device_mb: the part streamed in per use
        "streamed_mb": 30.1,       # bytes copied for it in this request (every pass counts)
        "streamed_bytes": 31562138,  # the same in bytes (the panel's bars)
        "held_mb": 0.0,            # what it holds on the device at the end of the request
        "why": "budget too small", # why on_device_mb < total_mb (null when whole)
        "held_why": "gave its VRAM to vocoder",  # why held_mb differs from on_device_mb (null if not)
        "weights": "as published",  # how its Linear and Conv weights are stored (issue 36); when
                                    # not as published the line says it after the total
        "line": "acoustic 11.7 MB: 4.2 MB on the GPU, 7.5 MB streamed from RAM (not enough "
                "free VRAM), 30.1 MB copied in all; now holds 0.0 MB (gave its VRAM to vocoder)"}
     ],
     "timeline": [                 # one entry per phase run, in order; lane = phase name
       {"name": "acoustic",
        "lane": 0,                 # index of the phase's name among the request's distinct names
        "start_s": 0.0, "end_s": 0.8,     # from the request's start (retries included)
        "working_mb": 2.0,         # the phase's working memory (estimate x calibration)
        "reserve_mb": 1.0,         # kept free on the device for others
        "components": [{"name": "demo:acoustic", "loaded_mb": 4.2, "streamed_mb": 30.1,
                        "working_mb": 2.0}],   # working_mb: the phase's, on each of its components
        "yields": [{"component": "demo:vocoder", "for_whom": ["demo:acoustic"], "mb": 3.0,
                    "at_s": 0.01}],    # idle components that gave up VRAM for this phase
        "retries": [{"at_s": 0.4, "attempt": 1,                 # exact OOM retries
                     "error": "OutOfMemoryError: out of memory"}],
        "fallbacks": [{"what": "tiled_1d", "at_s": 0.7, "error": "OutOfMemoryError: out of memory"}]}
     ]}

The node text is one `line` per component (plus retries and fallbacks); `mizuoto say
--timeline out.svg` draws the request's `timeline` (`timeline.write_svg`).
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .small_weights import PUBLISHED

if TYPE_CHECKING:
    from .devices import DeviceService
    from .handle import ModelHandle

log = logging.getLogger(__name__)

MB = 1024 * 1024
#: How many requests the route lists (a server runs for weeks: the oldest go).
REQUESTS_KEPT = 8

REASON_BUDGET = "budget too small"
REASON_MODE = "vram_mode {mode}"
REASON_CAPPED = "capped after OOM"
REASON_YIELDED = "yielded for another component"
#: What a `gave_up_for` entry names when ComfyUI took the VRAM (comfy_bridge.COMFYUI).
COMFYUI = "comfyui"

# The reasons above as a node's line says them.
PLAIN_REASONS = {
    REASON_BUDGET: "not enough free VRAM",
    REASON_MODE.format(mode="low"): "low VRAM mode",
    REASON_MODE.format(mode="none"): "VRAM mode none: every layer streams",
    REASON_CAPPED: "limited after running out of memory",
}


def mb(nbytes: int | float) -> float:
    return round(nbytes / MB, 2)


def _mb_text(value: float) -> str:
    return f"{value:.1f} MB"


@dataclasses.dataclass
class Placement:
    """One component's placement by one phase, with the figures weighed at the time (M50)."""

    component: str
    phase: str
    loaded_bytes: int
    size_bytes: int
    reason: str | None = None
    mode: str = "normal"
    free_bytes: int = 0
    working_bytes: int = 0
    reserve_bytes: int = 0
    gave_up_for: list[str] = dataclasses.field(default_factory=list)
    held_after: int | None = None  # what it still held after yielding VRAM to later phases
    held_now: int | None = None  # what it holds when the report is made (None: not looked at yet)
    copied_bytes: int = 0  # what this placement copied onto the device (0: it was there already)

    @property
    def partial(self) -> bool:
        return self.reason is not None or self.held_after is not None

    @property
    def held_bytes(self) -> int:
        """What it holds now: as last looked at, else what is left after it yielded, else its
        placement."""
        if self.held_now is not None:
            return self.held_now
        return self.loaded_bytes if self.held_after is None else self.held_after

    def as_partial(self) -> dict[str, Any]:
        """A component partial in its phase keeps that phase's figures; one that ran whole and
        then yielded shows what it holds now (its `components` entry has both)."""
        loaded = self.loaded_bytes if self.reason is not None else self.held_bytes
        return {
            "reason": self.reason or REASON_YIELDED,
            "mode": self.mode,
            "free_mb": mb(self.free_bytes),
            "working_mb": mb(self.working_bytes),
            "reserve_mb": mb(self.reserve_bytes),
            "loaded_mb": mb(loaded),
            "size_mb": mb(self.size_bytes),
            "gave_up_for": list(self.gave_up_for),
        }

    def log(self) -> None:
        if self.partial:
            log.info(
                "%s partially loaded for phase %r: %s (mode %s; free %.1f MB, working %.1f MB, "
                "reserve %.1f MB; loaded %.1f of %.1f MB%s)",
                self.component, self.phase, self.reason, self.mode, mb(self.free_bytes),
                mb(self.working_bytes), mb(self.reserve_bytes), mb(self.loaded_bytes), mb(self.size_bytes),
                f"; gave up VRAM for {', '.join(self.gave_up_for)}" if self.gave_up_for else "",
            )


class RequestClock:
    """A request's times: when it started (Unix time), and seconds since then (monotonic)."""

    def __init__(self) -> None:
        self.started_at = time.time()
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0


@dataclasses.dataclass
class PhaseRun:
    """One phase of a request as the timeline draws it: when it ran (seconds from the request's
    start), what its components had on the device, streamed and worked with, who yielded VRAM
    for it, and its exact retries and fallbacks (M40, M42). A retried phase is one run."""

    name: str
    start_s: float
    end_s: float | None = None
    placements: list[Placement] = dataclasses.field(default_factory=list)
    streamed: dict[str, int] = dataclasses.field(default_factory=dict)  # component -> bytes in this run
    yields: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    retries: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    fallbacks: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def add_yield(self, component: str, for_whom: Sequence[str], nbytes: int, at_s: float) -> None:
        self.yields.append({"component": component, "for_whom": list(for_whom), "mb": mb(nbytes),
                            "at_s": round(at_s, 4)})

    def as_dict(self, lane: int, now_s: float) -> dict[str, Any]:
        working = self.placements[-1].working_bytes if self.placements else 0
        reserve = self.placements[-1].reserve_bytes if self.placements else 0
        last = {p.component: p for p in self.placements}  # a retry's placement replaces the first
        return {
            "name": self.name,
            "lane": lane,
            "start_s": round(self.start_s, 4),
            "end_s": round(now_s if self.end_s is None else self.end_s, 4),
            "working_mb": mb(working),
            "reserve_mb": mb(reserve),
            "components": [{"name": key, "loaded_mb": mb(p.loaded_bytes), "streamed_mb": mb(self.streamed.get(key, 0)),
                            "working_mb": mb(working)} for key, p in last.items()],
            "yields": [dict(y) for y in self.yields],
            "retries": [dict(r) for r in self.retries],
            "fallbacks": [dict(f) for f in self.fallbacks],
        }


@dataclasses.dataclass(frozen=True)
class Held:
    """What a component holds on the device when the report is made, what it gave VRAM to, and
    how its weights are stored."""

    loaded_bytes: int
    gave_up_for: tuple[str, ...] = ()
    unloaded: bool = False
    weights: str = PUBLISHED


@dataclasses.dataclass(frozen=True)
class Where:
    """The device a request ran on, in words: its name, size, and whether weights move to it."""

    name: str
    total_bytes: int | None  # None: host RAM is the device (nothing moves, M5)

    @property
    def moves(self) -> bool:
        return self.total_bytes is not None


def device_name(kind: str, index: int | None, total_bytes: int, simulated: bool, model: str = "") -> str:
    """A device in plain words: "simulated GPU, 16 MB", "GPU 0 (NVIDIA H200), 143771 MB",
    "CPU (no GPU: models run from RAM)"."""
    size = f"{total_bytes / MB:.0f} MB"
    if simulated:
        return f"simulated GPU, {size}"
    if kind == "cpu":
        return "CPU (no GPU: models run from RAM)"
    label = f"{'GPU' if kind == 'cuda' else kind.upper()} {index or 0}"
    return f"{label} ({model}), {size}" if model else f"{label}, {size}"


def where(devices: DeviceService, device: torch.device) -> Where:
    """`device` as a report names it."""
    if not devices.moves(device):
        return Where(device_name(device.type, device.index, 0, False), None)
    total = devices.total_bytes(device)
    simulated = devices.is_simulated(device)
    model = torch.cuda.get_device_name(device) if device.type == "cuda" and not simulated else ""
    return Where(device_name(device.type, device.index, total, simulated, model), total)


def _short(key: str) -> str:
    return key.split(":", 1)[1] if ":" in key else key


def _gave_to(gave_up_for: Sequence[str]) -> str:
    names = ["ComfyUI's models" if g == COMFYUI else _short(g) for g in gave_up_for]
    return f"gave its VRAM to {', '.join(names)}"


def held_reason(on_device: int, held: Held) -> str | None:
    """Why a component holds other than it had during its phase (None when the same)."""
    if held.loaded_bytes == on_device:
        return None
    if held.unloaded:
        return "unloaded"
    if held.loaded_bytes > on_device:
        return "placed again by another request"
    if held.gave_up_for:
        return _gave_to(held.gave_up_for)
    return "moved off the device"


def component_line(entry: Mapping[str, Any], moves: bool) -> str:
    """One plain line: "talker 11.7 MB: 4.2 MB on the GPU, 7.5 MB streamed from RAM (not enough
    free VRAM), 331.0 MB copied in all; now holds 0.0 MB (gave its VRAM to decoder)"."""
    stored = entry.get("weights", PUBLISHED)
    head = (f"{_short(entry['name'])} {_mb_text(entry['total_mb'])}"
            + (f" (weights stored as {stored})" if stored != PUBLISHED else "") + ": ")
    if not moves:
        return head + "runs from RAM (no GPU)"
    if entry["from_ram_mb"] <= 0:
        text = head + "all on the GPU"
    else:
        why = PLAIN_REASONS.get(entry["why"], entry["why"]) if entry["why"] else None
        # Rounded so that the two parts the line shows add up to the total it shows.
        on_device = round(entry["on_device_mb"], 1)
        text = (head + f"{_mb_text(on_device)} on the GPU, {_mb_text(round(entry['total_mb'], 1) - on_device)} "
                f"streamed from RAM" + (f" ({why})" if why else ""))
    if entry["streamed_mb"] > 0:
        text += f", {_mb_text(entry['streamed_mb'])} copied in all"
    if entry["held_why"]:
        text += f"; now holds {_mb_text(entry['held_mb'])} ({entry['held_why']})"
    return text


def model_state(key: str, handle: ModelHandle, last_streamed: int, moves: bool) -> dict[str, Any]:
    """A loaded component now, for the route's `models` (M51): its `describe()` and the fields
    the module's docstring adds."""
    described = handle.describe()
    size, loaded = described["size_bytes"], described["loaded_bytes"]
    why = None
    if moves and loaded < size:
        if handle.partial_reason == REASON_YIELDED or (not handle.partial_reason and handle.gave_up_for):
            why = _gave_to(handle.gave_up_for) if handle.gave_up_for else "moved off the device"
        else:
            why = handle.partial_reason or "not placed yet"
    return {
        **described,
        "streamed_bytes": last_streamed,
        "streamed_bytes_total": handle.streamer.streamed_bytes_of(handle),
        "fixed_bytes": handle.plan.fixed_bytes,
        "why": why,
        "line": model_line(key, described, handle.plan.fixed_bytes, why, moves),
    }


def model_line(key: str, described: Mapping[str, Any], fixed_bytes: int, why: str | None, moves: bool) -> str:
    """"demo:talker 11.7 MB: 4.2 MB on the GPU (1.0 MB that always stays + 2 of 8 layers),
    7.5 MB in RAM, streamed when used (not enough free VRAM)"."""
    size, loaded = described["size_bytes"], described["loaded_bytes"]
    stored = described.get("weights", PUBLISHED)
    head = f"{key} {_mb_text(mb(size))}" + (f" (weights stored as {stored})" if stored != PUBLISHED else "") + ": "
    if not moves:
        return head + "in RAM (no GPU)"
    reason = f" ({PLAIN_REASONS.get(why, why)})" if why else ""
    if loaded >= size:
        return head + "all on the GPU"
    if loaded == 0:
        return head + "in RAM, nothing on the GPU" + reason
    layers = f"{described['resident_units']} of {described['units']} layers"
    parts = f"{_mb_text(mb(fixed_bytes))} that always stays + {layers}" if fixed_bytes else layers
    return (head + f"{_mb_text(mb(loaded))} on the GPU ({parts}), {_mb_text(mb(size - loaded))} in RAM, "
            f"streamed when used" + reason)


class MemoryReport:
    """Accumulates a request's placements into ``meta["memory"]``, and its phases into the
    request report and timeline (see the module's docstring)."""

    def __init__(self) -> None:
        self.streamed_bytes = 0
        self.streamed_by: dict[str, int] = {}  # component -> bytes streamed for it in this request
        self.components: dict[str, Placement] = {}
        self.phases: dict[str, dict[str, float | int]] = {}
        self.timeline: list[PhaseRun] = []
        self.used_in: dict[str, list[str]] = {}  # component -> the phases it ran in, each once
        # component -> (times this request placed it, bytes copied doing so): phase-grouped
        # runs show here as one placement per component, not one per line or chunk.
        self.placed: dict[str, tuple[int, int]] = {}

    def add_phase(self, phase: str, **figures: float | int) -> None:
        """What a phase reserved, as its engine breaks the working memory down (e.g. the KV
        positions and bytes a generate phase sized from its request)."""
        self.phases[phase] = dict(figures)

    def add(self, placement: Placement) -> None:
        placement.log()
        self.components[placement.component] = placement
        times, copied = self.placed.get(placement.component, (0, 0))
        if placement.copied_bytes:
            times, copied = times + 1, copied + placement.copied_bytes
        self.placed[placement.component] = (times, copied)
        phases = self.used_in.setdefault(placement.component, [])
        if placement.phase not in phases:
            phases.append(placement.phase)

    def as_meta(self) -> dict[str, Any]:
        comps = self.components.values()
        return {
            "streamed_mb": mb(self.streamed_bytes),
            "loaded_mb": mb(sum(p.loaded_bytes for p in comps)),
            "size_mb": mb(sum(p.size_bytes for p in comps)),
            "components": {
                p.component: {"phase": p.phase, "loaded_mb": mb(p.loaded_bytes), "held_mb": mb(p.held_bytes),
                              "size_mb": mb(p.size_bytes), "placed": self.placed[p.component][0],
                              "copied_mb": mb(self.placed[p.component][1])}
                for p in comps
            },
            "partial": {p.component: p.as_partial() for p in comps if p.partial},
            "phases": {name: dict(figures) for name, figures in self.phases.items()},
        }

    def component_entries(self, held: Mapping[str, Held], where: Where) -> list[dict[str, Any]]:
        """Every component once: during its (last) phase, streamed in this request, held now."""
        entries = []
        for key, p in self.components.items():
            now = held.get(key, Held(p.held_bytes))
            on_device = p.loaded_bytes
            streamed = self.streamed_by.get(key, 0)
            entry = {
                "name": key,
                "phases": list(self.used_in.get(key, [p.phase])),
                "total_mb": mb(p.size_bytes),
                "on_device_mb": mb(on_device),
                "from_ram_mb": mb(p.size_bytes - on_device),
                "streamed_mb": mb(streamed),
                "streamed_bytes": streamed,
                "held_mb": mb(now.loaded_bytes),
                "why": p.reason if on_device < p.size_bytes else None,
                "held_why": held_reason(on_device, now),
                "weights": now.weights,
            }
            entry["line"] = component_line(entry, where.moves)
            entries.append(entry)
        return entries

    def timeline_entries(self, now_s: float) -> list[dict[str, Any]]:
        lanes: dict[str, int] = {}
        for run in self.timeline:
            lanes.setdefault(run.name, len(lanes))
        return [run.as_dict(lanes[run.name], now_s) for run in self.timeline]


class RequestLog:
    """The last `REQUESTS_KEPT` request reports of one manager, newest last, for the route.
    Reports are plain dicts (no handle is kept alive); a request replaces its own entry each
    time it publishes (a phase began or ended, its meta was read)."""

    def __init__(self, kept: int = REQUESTS_KEPT) -> None:
        self._ids = itertools.count(1)
        self._reports: collections.OrderedDict[int, dict[str, Any]] = collections.OrderedDict()
        self._kept = kept
        self._lock = threading.Lock()

    def new_id(self) -> int:
        with self._lock:
            return next(self._ids)

    def publish(self, report: dict[str, Any]) -> None:
        with self._lock:
            self._reports[report["id"]] = report
            while len(self._reports) > self._kept:
                self._reports.popitem(last=False)

    def reports(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._reports.values())

    def last_streamed(self) -> dict[str, int]:
        """Per component, the bytes streamed for it in the newest request that used it."""
        last: dict[str, int] = {}
        for report in self.reports():
            for entry in report["components"]:
                last[entry["name"]] = entry["streamed_bytes"]
        return last
