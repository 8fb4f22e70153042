"""What fits on a card (issue 35): each published model's phases placed on a card of a given
size, beside what else is resident there, with the runtime's own numbers.

A phase is placed as `ModelManager.load` places it on a device holding nothing else of ours
(idle components yield first, M30): the room left after the card's other occupant, the
reserve and the phase's working-memory estimate is split by the manager's own rule
(`ModelManager.planned_budgets`, M33) and each component keeps the units its handle would
choose (`ModelHandle.planned_units`, M15). A model is

* ``whole`` when every phase's components are placed whole;
* ``partial`` when some units stream: the table gives the resident share and the bytes
  streamed per token or step (each forward of a streamed unit copies it once) of the phase
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
from ..engines.published import PublishedModel, build, published_models
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

    @property
    def streamed_bytes(self) -> int:
        return sum(h.streamed_bytes for h in self.handles)

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
        ms = "/".join(f"{phase.streamed_bytes / rate * 1e3:.0f}" for _, rate in LINKS)
        return f"partial {share:.0%}, {_size(phase.streamed_bytes)}/step, ≥{ms} ms"

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
    return f"{nbytes / GB:.2f} GB" if nbytes >= GB else f"{nbytes / MB:.0f} MB"


def place_phase(manager: ModelManager, name: str, handles: Sequence[ModelHandle], memory: int,
                free: int) -> PhaseFit:
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
    return PhaseFit(name, memory, tuple(fits), refused)


def engine_fit(engine: Engine, model: str, card: int, beside: int, seconds: float = TABLE_SECONDS) -> ModelFit:
    """`engine`'s typical request of `seconds` placed on a card of `card` bytes beside `beside`
    bytes of another model."""
    phases = tuple(place_phase(engine.manager, p.name, p.handles, p.memory, card - beside)
                   for p in engine.typical_phases(seconds))
    return ModelFit(model, card, beside, phases)


def fit_manager() -> ModelManager:
    """The manager a published model is built with for the table: a real card's reserve
    (`compute.vram_reserve_mb` unset on a GPU: the default), on a simulated device whose size
    does not matter (the table passes each card's free bytes)."""
    reserve_mb = VramPolicy().reserve_bytes(simulated=False) // MB
    return ModelManager(DeviceService(simulate={"cpu": 1 << 40}), VramPolicy({"compute.vram_reserve_mb": reserve_mb}))


def published_fits(models: Iterable[PublishedModel], cards: Sequence[int],
                   beside: Sequence[int]) -> list[list[ModelFit]]:
    """For each model, built once on meta: its fit on every card × occupant (cards outer)."""
    rows = []
    for model in models:
        engine = build(model, fit_manager())
        rows.append([engine_fit(engine, model.name, c, b) for c in cards for b in beside])
    return rows


def installed_models() -> tuple[list[PublishedModel], dict[str, str]]:
    """Every engine's published models, and the engines whose package is not installed here
    (engine id -> why)."""
    models: list[PublishedModel] = []
    missing: dict[str, str] = {}
    for engine_id in ENGINES:
        try:
            models += published_models(engine_id)
        except MizuotoError as exc:
            missing[engine_id] = str(exc)
    return models, missing


def table_markdown(models: Sequence[PublishedModel]) -> str:
    """The README's fit table: one table per occupant, a row per published model, a column per
    card."""
    cards = [c * GB for c in CARDS_GB]
    fits = published_fits(models, cards, [b for _, b in BESIDE])
    lines = []
    for i, (label, _) in enumerate(BESIDE):
        lines += [f"Beside {label}:" if i else "Alone on the card:", "",
                  "| model | " + " | ".join(f"{c} GB" for c in CARDS_GB) + " |",
                  "|---|" + "---|" * len(CARDS_GB)]
        for row in fits:
            cells = [row[c * len(BESIDE) + i].cell() for c in range(len(CARDS_GB))]
            lines.append(f"| {row[0].model} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def own_device() -> tuple[int, int] | None:
    """(total, in use) bytes of this machine's CUDA device, or None without one."""
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return total, total - free


def fit_report(card: int | None = None, beside: int | None = None) -> dict[str, Any]:
    """``mizuoto doctor --fit``: every installed published model on `card` beside `beside`
    bytes; without `card`, this machine's GPU (its total, beside what is in use now), or with
    no GPU the standard cards beside nothing and the two standard occupants."""
    models, missing = installed_models()
    device = own_device()
    if card is None and device is not None:
        card, used = device
        beside = used if beside is None else beside
    note = None
    if card is None:
        cards, besides = [c * GB for c in CARDS_GB], [b for _, b in BESIDE] if beside is None else [beside]
        note = "no GPU here: the table is for the standard cards"
    else:
        cards, besides = [card], [beside or 0]
    rows = published_fits(models, cards, besides)
    own = None if device is None else {"total_mb": round(device[0] / MB), "in_use_mb": round(device[1] / MB)}
    return {"device": own, "note": note, "not_installed": missing,
            "fits": [fit.as_dict() for row in rows for fit in row]}


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
