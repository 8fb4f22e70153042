"""Calibration of working-memory estimates (M47).

On CUDA or XPU, after each phase the manager measures its working memory: the peak above the
placed weights, minus the streamer copies' share, minus memory the phase leaves behind (CUDA
Graph pools, buffers kept with the model). If that is above the estimate, the ratio × 1.1
(at most 16) is remembered per phase key (`qwen3tts:talker`) and the next estimate is scaled
by it. Ratios persist in `<cache>/memory/calibration.json` (format version 2; other versions
are ignored).
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
MARGIN = 1.1
MAX_RATIO = 16.0


def default_path() -> Path:
    cache = os.environ.get("MIZUOTO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "mizuoto")
    return Path(cache) / "memory" / "calibration.json"


class Calibration:
    """Per-phase factors on working-memory estimates, kept on disk (M47)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.ratios: dict[str, float] = {}
        self._lock = threading.Lock()
        if path is not None:
            self._read(path)

    def _read(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, json.JSONDecodeError) as exc:
            log.warning("ignoring calibration file %s: %s", path, exc)
            return
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            log.info("ignoring calibration file %s: not format version %d", path, FORMAT_VERSION)
            return
        ratios = data.get("ratios", {})
        self.ratios = {str(k): float(v) for k, v in ratios.items() if isinstance(v, (int, float)) and v >= 1}

    def factor(self, key: str) -> float:
        return self.ratios.get(key, 1.0)

    def observe(self, key: str, estimate: int, measured: int) -> float | None:
        """Remember measured / estimate × 1.1 (max 16) when a phase used more than estimated."""
        if estimate <= 0 or measured <= estimate * self.factor(key):
            return None
        ratio = min(MAX_RATIO, measured / estimate * MARGIN)
        with self._lock:
            self.ratios[key] = ratio
            self._write()
        log.info("phase %s used %.1f MB of working memory for an estimate of %.1f MB: reserving %.2fx from now on",
                 key, measured / 2**20, estimate / 2**20, ratio)
        return ratio

    def _write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": FORMAT_VERSION, "ratios": self.ratios}, indent=1, sort_keys=True))
        tmp.replace(self.path)


class PhaseMeter:
    """Measures one phase's working memory on a CUDA or XPU device (M47)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._api = torch.cuda if device.type == "cuda" else torch.xpu
        self.placed = 0

    @staticmethod
    def for_device(device: torch.device, simulated: bool) -> PhaseMeter | None:
        if simulated or device.type not in ("cuda", "xpu"):
            return None  # CPU activations are not device memory: nothing to calibrate
        return PhaseMeter(device)

    def placed_now(self) -> None:
        """Call once the phase's weights are placed: the peak is measured above this."""
        self._api.synchronize(self.device)
        self.placed = self._api.memory_allocated(self.device)
        self._api.reset_peak_memory_stats(self.device)

    def working_bytes(self, copies_bytes: int) -> int:
        """Peak above the placed weights, minus streamer copies and what the phase left behind."""
        self._api.synchronize(self.device)
        peak = self._api.max_memory_allocated(self.device)
        left = max(0, self._api.memory_allocated(self.device) - self.placed)
        return max(0, peak - self.placed - copies_bytes - left)
