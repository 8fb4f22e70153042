"""What fits on a card (issue 35): each published model's phases placed on a card of a given
size, beside what else is resident there, with the runtime's own numbers.

A phase is placed as `ModelManager.load` places it on a device holding nothing else of ours
(idle components yield first, M30): the room left after the card's other occupant, the
reserve and the phase's working-memory estimate is split by the manager's own rule
(`ModelManager.planned_budgets`, M33) and each component keeps the units its handle would
choose (`ModelHandle.planned_units`, M15). A model is

* ``whole`` when every phase's components are placed whole;
* ``partial`` when some units stream: the table gives the resident share and the bytes
  streamed per token or step (each forward of a streamed unit copies it once, and a phase
  says how many forwards a step makes: `PhaseEstimate.forwards_per_step`) of the phase
  that streams the most, and the link-bound lower limit on its time per token or step at
  PCIe 4.0 x16 (25 GB/s) and 5.0 (55 GB/s);
* ``refused`` when a phase's minimum working set (M16) and its working memory do not fit in
  what the card has free.

`table_markdown` writes the README's table (``tools/fit_table.py``); ``mizuoto doctor --fit``
prints `fit_report`.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ..engines import ENGINES, Engine
from ..engines.published import PublishedModel, build, find, published_models
from ..errors import MizuotoError
from ..memory.devices import DeviceService
from ..memory.handle import ModelHandle
from ..memory.manager import ModelManager
from ..memory.policy import GB, MB, VramPolicy

log = logging.getLogger(__name__)

CARDS_GB = (6, 8, 12, 16, 24)
#: What shares the card: (label, resident bytes).
BESIDE = (("nothing", 0), ("SDXL UNet (5 GB)", 5 * GB), ("Flux fp8 (12 GB)", 12 * GB))
#: Host-to-device link bandwidths, bytes per second: PCIe 4.0 x16 and 5.0 x16.
LINKS = (("PCIe 4.0", 25e9), ("PCIe 5.0", 55e9))
TABLE_SECONDS = 20.0  # the fit table's request: a 20 s line


@dataclasses.dataclass(frozen=True)
class HandleFit:
    """One component of a phase, placed: resident bytes (fixed part + resident units) and the
    bytes its streamed units copy per forward."""

    name: str
    size_bytes: int
    resident_bytes: int
    streamed_bytes: int
    min_working_set: int


@dataclasses.dataclass(frozen=True)
class PhaseFit:
    name: str
    memory: int
    handles: tuple[HandleFit, ...]
    refused: bool
    forwards_per_step: int = 1

    @property
    def streamed_bytes(self) -> int:
        """Bytes copied per token or step: every streamed unit, once per forward."""
        return self.forwards_per_step * sum(h.streamed_bytes for h in self.handles)

    @property
    def size_bytes(self) -> int:
        return sum(h.size_bytes for h in self.handles)

    @property
    def resident_bytes(self) -> int:
        return sum(h.resident_bytes for h in self.handles)


@dataclasses.dataclass(frozen=True)
class ModelFit:
    """A published model (or a loaded engine) on one card beside one occupant."""

    model: str
    card_bytes: int
    beside_bytes: int
    phases: tuple[PhaseFit, ...]

    @property
    def status(self) -> str:
        if any(p.refused for p in self.phases):
            return "refused"
        return "partial" if any(p.streamed_bytes for p in self.phases) else "whole"

    @property
    def streaming_phase(self) -> PhaseFit | None:
        """The phase that streams the most per token or step (None: nothing streams)."""
        streaming = [p for p in self.phases if p.streamed_bytes and not p.refused]
        return max(streaming, key=lambda p: p.streamed_bytes) if streaming else None

    def cell(self) -> str:
        """The table's cell: whole, refused, or partial with resident share, streamed bytes per
        token or step and the link-bound time per token or step at PCIe 4.0 / 5.0."""
        phase = self.streaming_phase
        if self.status != "partial" or phase is None:
            return self.status
        share = phase.resident_bytes / phase.size_bytes
        return f"partial {share:.0%}, {_size(phase.streamed_bytes)}/step, ≥{_link_ms(phase.streamed_bytes)} ms"

    def as_dict(self) -> dict[str, Any]:
        phase = self.streaming_phase
        out: dict[str, Any] = {"model": self.model, "card_mb": round(self.card_bytes / MB),
                               "beside_mb": round(self.beside_bytes / MB), "status": self.status}
        if phase is not None:
            out.update(phase=phase.name, resident_share=round(phase.resident_bytes / phase.size_bytes, 3),
                       streamed_mb_per_step=round(phase.streamed_bytes / MB, 1),
                       link_bound_ms={name: round(phase.streamed_bytes / rate * 1e3, 1) for name, rate in LINKS})
        out["phases"] = [{"phase": p.name, "working_mb": round(p.memory / MB, 1), "refused": p.refused,
                          "components": [dataclasses.asdict(h) for h in p.handles]} for p in self.phases]
        return out


def _size(nbytes: float) -> str:
    return f"{nbytes / GB:.3g} GB" if nbytes >= GB else f"{nbytes / MB:.0f} MB"


def _link_ms(nbytes: int) -> str:
    """The link-bound lower limit on the time to copy `nbytes`, at each of `LINKS`: "48/22"."""
    times = [nbytes / rate * 1e3 for _, rate in LINKS]
    return "/".join(f"{t:.0f}" if t >= 10 else f"{t:.1f}" for t in times)


def place_phase(manager: ModelManager, name: str, handles: Sequence[ModelHandle], memory: int,
                free: int, forwards_per_step: int = 1) -> PhaseFit:
    """A phase's placement on a device with `free` bytes for it (weights, working memory and
    reserve), predicted with the manager's and the handles' own rules (places nothing)."""
    need = sum(h.min_working_set for h in handles) + memory + manager.reserve_bytes(handles[0].device)
    refused = need > free
    budgets = manager.planned_budgets(handles, memory, free, name)
    fits = []
    for h in dict.fromkeys(handles):
        resident = h.planned_units(budgets[h])
        streamed = sum(u.nbytes for u in h.units if u not in resident)
        fits.append(HandleFit(h.name, h.size_bytes, h.plan.fixed_bytes + sum(u.nbytes for u in resident), streamed,
                              h.min_working_set))
    return PhaseFit(name, memory, tuple(fits), refused, forwards_per_step)


def engine_fit(engine: Engine, model: str, card: int, beside: int, seconds: float = TABLE_SECONDS) -> ModelFit:
    """`engine`'s typical request of `seconds` placed on a card of `card` bytes beside `beside`
    bytes of another model."""
    phases = tuple(place_phase(engine.manager, p.name, p.handles, p.memory, card - beside, p.forwards_per_step)
                   for p in engine.typical_phases(seconds))
    return ModelFit(model, card, beside, phases)


def engine_plan(engine: Engine, seconds: float = TABLE_SECONDS) -> dict[str, Any]:
    """Before the first run: what each phase of a typical request of `seconds` will keep
    resident and what will stream, with the memory free on the engine's device now (the Load
    TTS Engine node's memory output). ``lines`` says it in words."""
    manager = engine.manager
    if not manager.devices.moves(engine.device):
        return {"device": str(engine.device), "phases": [],
                "lines": [f"runs on {engine.device}: its weights stay where they are, nothing streams"]}
    try:
        phases = engine.typical_phases(seconds)
    except MizuotoError as exc:
        return {"device": str(engine.device), "phases": [], "lines": [str(exc)]}
    lines, out = [], []
    for p in phases:
        free = manager.available(p.handles)
        placed = place_phase(manager, p.name, p.handles, p.memory, free, p.forwards_per_step)
        out.append({"phase": p.name, "free_mb": round(free / MB, 1), "working_mb": round(p.memory / MB, 1),
                    "refused": placed.refused, "components": [dataclasses.asdict(h) for h in placed.handles]})
        lines.append(_phase_line(placed, free))
    return {"device": str(engine.device), "seconds": seconds, "phases": out, "lines": lines}


def _phase_line(phase: PhaseFit, free: int) -> str:
    names = "+".join(h.name for h in phase.handles)
    if phase.refused:
        need = sum(h.min_working_set for h in phase.handles) + phase.memory
        return f"{phase.name} ({names}): needs at least {_size(need)} free, {_size(free)} is"
    if not phase.streamed_bytes:
        return f"{phase.name} ({names}) {_size(phase.size_bytes)}: all resident"
    return (f"{phase.name} ({names}) {_size(phase.size_bytes)}: {_size(phase.resident_bytes)} resident, "
            f"{_size(phase.streamed_bytes)} streams per token or step (at least {_link_ms(phase.streamed_bytes)} ms "
            "at PCIe 4.0/5.0)")


def fit_manager(size: int = 1 << 40) -> ModelManager:
    """The manager a published model is built with for the table: a real card's reserve
    (`compute.vram_reserve_mb` unset on a GPU: the default) on a simulated device of `size`
    bytes (for the table it does not matter: each card's free bytes are passed)."""
    reserve_mb = VramPolicy().reserve_bytes(simulated=False) // MB
    return ModelManager(DeviceService(simulate={"cpu": size}), VramPolicy({"compute.vram_reserve_mb": reserve_mb}))


def published_fits(models: Iterable[PublishedModel], cards: Sequence[int], besides: Sequence[int],
                   failed: dict[str, str] | None = None) -> list[dict[tuple[int, int], ModelFit]]:
    """For each model, built once on meta: its fit on every (card, occupant) pair. A model
    whose engine cannot build here (its package is not installed) goes into `failed` (model
    name -> why) when given; else its error is raised."""
    rows = []
    for model in models:
        try:
            engine = build(model, fit_manager())
        except (ImportError, MizuotoError) as exc:
            if failed is None:
                raise
            failed[model.name] = str(exc)
            continue
        rows.append({(c, b): engine_fit(engine, model.name, c, b) for c in cards for b in besides})
    return rows


def render(rows: Sequence[dict[tuple[int, int], ModelFit]], cards: Sequence[int],
           besides: Sequence[tuple[str, int]]) -> str:
    """Markdown: one table per occupant, a row per model, a column per card."""
    lines = []
    for label, beside in besides:
        lines += [f"Beside {label}:" if beside else "Alone on the card:", "",
                  "| model | " + " | ".join(_size(c) for c in cards) + " |", "|---|" + "---|" * len(cards)]
        lines += [f"| {row[(cards[0], beside)].model} | " + " | ".join(row[(c, beside)].cell() for c in cards) + " |"
                  for row in rows]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def table_markdown(models: Sequence[PublishedModel]) -> str:
    """The README's fit table: the standard cards beside each standard occupant."""
    cards = [c * GB for c in CARDS_GB]
    return render(published_fits(models, cards, [b for _, b in BESIDE]), cards, BESIDE)


def installed_models() -> tuple[list[PublishedModel], dict[str, str]]:
    """Every engine's published models, and the engines whose package is not installed here
    (engine id -> why)."""
    models: list[PublishedModel] = []
    missing: dict[str, str] = {}
    for engine_id in ENGINES:
        try:
            models += published_models(engine_id)
        except (MizuotoError, ImportError) as exc:
            missing[engine_id] = str(exc)
    return models, missing


def own_device() -> tuple[int, int] | None:
    """(total, in use) bytes of this machine's CUDA device, or None without one."""
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return total, total - free


def fit_report(card: int | None = None, beside: int | None = None,
               names: Sequence[str] = ()) -> dict[str, Any]:
    """``mizuoto doctor --fit``: every installed published model (or those called `names`) on
    `card` beside `beside` bytes of other models; without `card`, this machine's GPU (its
    total, beside what is in use on it now unless `beside` is given), or with no GPU the
    standard cards beside each standard occupant (or beside `beside`)."""
    models, missing = installed_models()
    if names:
        models = [find(name) for name in names]
    device = own_device()
    note = None
    if card is None and device is not None:
        card = device[0]
        beside = device[1] if beside is None else beside
    if card is None:
        note = "no GPU here: the table is for the standard cards"
        cards = [c * GB for c in CARDS_GB]
        besides = list(BESIDE) if beside is None else [(_size(beside), beside)]
    else:
        cards, besides = [card], [(_size(beside or 0), beside or 0)]
    rows = published_fits(models, cards, [b for _, b in besides], missing)
    own = None if device is None else {"total_mb": round(device[0] / MB), "in_use_mb": round(device[1] / MB)}
    return {"device": own, "note": note, "not_installed": missing,
            "table": render(rows, cards, besides).splitlines(),
            "fits": [fit.as_dict() for row in rows for fit in row.values()]}


def parse_size(text: str) -> int:
    """``12GB`` / ``12 GB`` / ``12`` (GB) / ``512MB`` -> bytes; one clear error otherwise."""
    cleaned = text.strip().upper().replace(" ", "")
    units = (("GIB", GB), ("MIB", MB), ("GB", GB), ("MB", MB), ("G", GB), ("M", MB))
    scale = GB
    for suffix, factor in units:
        if cleaned.endswith(suffix):
            cleaned, scale = cleaned[: -len(suffix)], factor
            break
    try:
        value = float(cleaned)
    except ValueError:
        raise MizuotoError(f"size {text!r}: expected a number of GB or MB, e.g. 12GB or 512MB") from None
    if value < 0:
        raise MizuotoError(f"size {text!r} must not be negative")
    return int(value * scale)
