"""Training peak estimates (M63): from measured peaks of the nearest-sized base model.

Every training method carries a table of measured peaks (`PeakRow`: base model, its size,
preset, batch size, peak, where and how it was measured). `MethodInfo.memory_mb` estimates a
run's peak for each preset: the row of the nearest-sized measured model (sizes compared as
ratios) and, of its rows, the one of the nearest batch size, scaled by size, +10 %, and +512 MB
for the CUDA context on CUDA; methods whose peak depends on the batch (`batch_scales`) scale by
the run's batch size over the measured one (proportional: an overestimate when a part of the
peak, the weights, does not grow with the batch).
Rows measured on the run's kind of device are preferred; until a GPU row exists, CPU rows
(peak RSS of the training phase) stand in.

When the estimate exceeds the free VRAM, `fit_advice` names the fastest preset that fits, or
else the largest batch that fits; the job logs it as a warning and runs anyway (an estimate
never refuses, M7).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import MizuotoError
from .memory import PRESET_NAMES

MARGIN = 1.10  # +10 %
CUDA_CONTEXT_MB = 512.0


@dataclasses.dataclass(frozen=True)
class PeakRow:
    """One measured peak of a training method."""

    base_model: str  # what was trained, e.g. "qwen3tts tiny Base"
    params: int  # parameters of the base model's main weights
    preset: str
    batch_size: int
    peak_mb: float
    device: str  # "cpu", or the GPU's name ("cuda: NVIDIA GeForce RTX 3090")
    source: str  # how and when it was measured

    @property
    def device_type(self) -> str:
        return self.device.split(":", 1)[0]


@dataclasses.dataclass(frozen=True)
class MethodInfo:
    """A training method: what it trains, its defaults, and its measured peaks."""

    id: str
    title: str
    engine: str
    defaults: Mapping[str, Any]
    peaks: tuple[PeakRow, ...]
    batch_scales: bool = False  # whether the peak grows with batch_size

    def memory_mb(self, params: int, batch_size: int = 1, device_type: str = "cuda") -> dict[str, float]:
        """M63: the estimated peak of each preset for a base model of `params` parameters."""
        return {preset: estimate_mb(self.peaks, preset, params, batch_size, self.batch_scales, device_type)
                for preset in PRESET_NAMES}


def nearest_row(rows: Sequence[PeakRow], preset: str, params: int, batch_size: int, device_type: str) -> PeakRow:
    """The measured row of `preset` whose model size is nearest (as a ratio) to `params`, among
    rows of the device's kind when there are any; of that model's rows, the nearest batch size."""
    if params <= 0:
        raise MizuotoError(f"a model size must be positive, got {params} parameters")
    of_preset = [r for r in rows if r.preset == preset]
    if not of_preset:
        raise MizuotoError(f"no measured peak for preset {preset!r}")
    same_kind = [r for r in of_preset if r.device_type == device_type] or of_preset
    return min(same_kind, key=lambda r: (round(abs(math.log(r.params / params)), 9),
                                         abs(math.log(r.batch_size / batch_size)), r.batch_size))


def estimate_mb(rows: Sequence[PeakRow], preset: str, params: int, batch_size: int, batch_scales: bool,
                device_type: str) -> float:
    """Nearest row's peak × size ratio (× batch ratio when it scales) × 1.1, + the CUDA context."""
    if batch_size < 1:
        raise MizuotoError(f"batch_size must be at least 1, got {batch_size}")
    row = nearest_row(rows, preset, params, batch_size, device_type)
    peak = row.peak_mb * params / row.params
    if batch_scales:
        peak *= batch_size / row.batch_size
    return peak * MARGIN + (CUDA_CONTEXT_MB if device_type == "cuda" else 0.0)


def fit_advice(info: MethodInfo, preset: str, params: int, batch_size: int, free_mb: float,
               device_type: str = "cuda") -> str | None:
    """None when the run's estimate fits in `free_mb`; else a warning that names the fastest
    preset that fits, or the largest batch that fits (M63)."""
    estimates = info.memory_mb(params, batch_size, device_type)
    if estimates[preset] <= free_mb:
        return None
    head = (f"{info.title}: training.memory={preset} needs about {estimates[preset]:.0f} MB of device memory, "
            f"{free_mb:.0f} MB are free")
    fitting = [p for p in PRESET_NAMES if estimates[p] <= free_mb]
    if fitting:
        return f"{head}; training.memory={fitting[0]} fits (about {estimates[fitting[0]]:.0f} MB)"
    if info.batch_scales:
        for batch in range(batch_size - 1, 0, -1):
            smaller = info.memory_mb(params, batch, device_type)
            fits = [p for p in PRESET_NAMES if smaller[p] <= free_mb]
            if fits:
                return (f"{head}; no preset fits at batch_size={batch_size}: the largest batch that fits is "
                        f"batch_size={batch} with training.memory={fits[0]} (about {smaller[fits[0]]:.0f} MB)")
    return f"{head}; no preset fits (training.memory=lowest needs about {estimates['lowest']:.0f} MB)"
