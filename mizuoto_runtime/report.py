"""meta.memory: what each request placed, streamed and gave up, and why (M50).

The manager records a `Placement` per component per phase; the request folds them into
``ctx.meta["memory"]``. The same facts go to the log when a partial placement happens.
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
