"""What each request placed, streamed and gave up, and why: `meta.memory` (M50), the request
report people read and programs parse, and the `/mizuoto/runtime` payload (M51).

The manager records a `Placement` per component per phase; the request folds them into
``ctx.meta["memory"]``. The same facts go to the log when a partial placement happens.

``meta.memory`` (M50; every output's, and the `memory` string output of the nodes as JSON)
keeps its fields: ``streamed_mb`` (bytes copied from host RAM for this request only),
``loaded_mb`` / ``size_mb`` (sums over its components), ``components`` {name: {phase,
loaded_mb, size_mb}}, ``partial`` {name: {reason, mode, free_mb, working_mb, reserve_mb,
loaded_mb, size_mb, gave_up_for}} and ``phases`` (an engine's breakdown of a phase's working
memory). Added beside them: ``request`` — the request report below, the same dict the route
lists.

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
         "streamed_bytes": ...,        # CHANGED: bytes streamed for it in the LAST request that
                                       # used it (0 if none yet), no longer a running total
         "streamed_bytes_total": ...,  # NEW: every byte streamed for it since it loaded
         "fixed_bytes": ...,           # NEW: bytes that always stay on the device when placed
                                       # (not in a unit: embeddings, norms, ...)
         "why": "budget too small" | "gave its VRAM to comfyui" | null,  # NEW: why not whole now
         "line": "demo:acoustic 11.7 MB: 4.2 MB on the GPU (0 of 4 layers, 4.2 MB that always "
                 "stays), 7.5 MB in RAM"}  # NEW: the current state in plain words
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
     "streamed_mb": 30.1,          # copied from RAM for this request only (= meta.memory.streamed_mb)
     "oom_retries": 0, "fallbacks": [],   # = meta.applied
     "components": [               # every component the request used, exactly once
       {"name": "demo:acoustic",   # the manager's key, engine:component
        "phases": ["acoustic"],    # the phases it ran in, in order, each once
        "total_mb": 11.7,          # its weights
        "on_device_mb": 4.2,       # on the device during its (last) phase
        "from_ram_mb": 7.5,        # = total_mb - on_device_mb: the part streamed in per use
        "streamed_mb": 30.1,       # bytes copied for it in this request (every pass counts)
        "held_mb": 0.0,            # what it holds on the device at the end of the request
        "why": "budget too small", # why on_device_mb < total_mb (null when whole)
        "held_why": "gave its VRAM to demo:vocoder",  # why held_mb < on_device_mb (null if equal)
        "line": "acoustic 11.7 MB: 4.2 MB on the GPU, 7.5 MB streamed from RAM (budget too "
                "small); 30.1 MB copied; holds 0.0 MB now (gave its VRAM to demo:vocoder)"}
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
        "retries": [{"at_s": 0.4, "attempt": 1, "error": "out of memory"}],  # exact OOM retries
        "fallbacks": [{"what": "tiled decode", "at_s": 0.7}]}
     ]}

The node text is one `line` per component (plus retries and fallbacks); `mizuoto say
--timeline out.svg` draws the request's `timeline` (`timeline.write_svg`).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

log = logging.getLogger(__name__)

MB = 1024 * 1024

REASON_BUDGET = "budget too small"
REASON_MODE = "vram_mode {mode}"
REASON_CAPPED = "capped after OOM"
REASON_YIELDED = "yielded for another component"


def mb(nbytes: int | float) -> float:
    return round(nbytes / MB, 2)


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

    @property
    def partial(self) -> bool:
        return self.reason is not None or self.held_after is not None

    def as_partial(self) -> dict[str, Any]:
        """A component partial in its phase keeps that phase's figures; one that ran whole and
        then yielded shows what it holds now."""
        loaded = self.loaded_bytes if self.reason is not None or self.held_after is None else self.held_after
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


class MemoryReport:
    """Accumulates a request's placements into ``meta["memory"]``."""

    def __init__(self) -> None:
        self.streamed_bytes = 0
        self.components: dict[str, Placement] = {}
        self.phases: dict[str, dict[str, float | int]] = {}

    def add_phase(self, phase: str, **figures: float | int) -> None:
        """What a phase reserved, as its engine breaks the working memory down (e.g. the KV
        positions and bytes a generate phase sized from its request)."""
        self.phases[phase] = dict(figures)

    def add(self, placement: Placement) -> None:
        placement.log()
        self.components[placement.component] = placement

    def as_meta(self) -> dict[str, Any]:
        comps = self.components.values()
        return {
            "streamed_mb": mb(self.streamed_bytes),
            "loaded_mb": mb(sum(p.loaded_bytes for p in comps)),
            "size_mb": mb(sum(p.size_bytes for p in comps)),
            "components": {
                p.component: {"phase": p.phase, "loaded_mb": mb(p.loaded_bytes), "size_mb": mb(p.size_bytes)}
                for p in comps
            },
            "partial": {p.component: p.as_partial() for p in comps if p.partial},
            "phases": {name: dict(figures) for name, figures in self.phases.items()},
        }
