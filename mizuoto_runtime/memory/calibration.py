"""Calibration of working-memory estimates (M47).

On CUDA or XPU, after each phase the manager measures its working memory: the peak above the
placed weights, minus the streamer copies' peak, minus memory the phase leaves behind (CUDA
Graph pools, buffers kept with the model) — only where no other request held the device during
the phase (`compute.gpu_jobs` > 1: the allocator's peak is the device's, not the request's). If
that is above the estimate, the ratio × 1.1 (at most 16) is remembered per engine and component
(`qwen3tts:talker`) and the next estimate is scaled by it. Ratios persist in
`<cache>/memory/calibration.json` (format version 2; other versions are ignored). The file only
makes estimates better: one that cannot be read or holds nonsense is ignored with one log line,
and one that cannot be written never fails a phase that succeeded.
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
from pathlib import Path
from typing import Any, Protocol

import torch

from ..errors import json_kind

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
MARGIN = 1.1
MAX_RATIO = 16.0
MAX_FILE_BYTES = 1 << 20  # a few hundred ratios take a few kB; anything far larger is not ours


def default_path() -> Path:
    cache = os.environ.get("MIZUOTO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "mizuoto")
    return Path(cache) / "memory" / "calibration.json"


def _ratio(value: Any) -> float | None:
    """A stored ratio if it is one the runtime could have written: a finite number in [1, 16]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 1.0 <= value <= MAX_RATIO else None


class Calibration:
    """Per-component factors on working-memory estimates, kept on disk (M47)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.ratios: dict[str, float] = {}
        self._lock = threading.Lock()
        self._write_failed = False  # warn once per process, not once per phase
        if path is not None:
            self.ratios = self._read(path)

    @staticmethod
    def _read(path: Path) -> dict[str, float]:
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
            data = json.loads(path.read_bytes().decode("utf-8"))
        except (FileNotFoundError, NotADirectoryError):
            return {}  # nothing learned yet (a folder that cannot hold it is reported on writing)
        except (OSError, ValueError, RecursionError) as exc:  # ValueError: JSON and UTF-8 faults
            log.warning("ignoring calibration file %s: %s", path, exc)
            return {}
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            log.info("ignoring calibration file %s: not format version %d", path, FORMAT_VERSION)
            return {}
        stored = data.get("ratios")
        if not isinstance(stored, dict):
            log.warning("ignoring calibration file %s: 'ratios' is %s, not an object", path, json_kind(stored))
            return {}
        ratios = {key: r for key, value in stored.items() if (r := _ratio(value)) is not None}
        bad = sorted(set(stored) - set(ratios))
        if bad:
            log.warning("ignoring calibration ratios in %s that are not numbers from 1 to %g: %s",
                        path, MAX_RATIO, ", ".join(bad))
        return ratios

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
        log.info("%s used %.1f MB of working memory for an estimate of %.1f MB: reserving %.2fx from now on",
                 key, measured / 2**20, estimate / 2**20, ratio)
        return ratio

    def _write(self) -> None:
        """Persist the ratios; a failure (folder is a file, disk full, no permission) is logged,
        never raised: the phase that taught the ratio succeeded, and the ratio stays in memory."""
        if self.path is None:
            return
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")  # one per process: no clash
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"version": FORMAT_VERSION, "ratios": self.ratios}, indent=1, sort_keys=True))
            tmp.replace(self.path)
        except OSError as exc:
            _remove_quietly(tmp)
            level = logging.DEBUG if self._write_failed else logging.WARNING
            self._write_failed = True
            log.log(level, "could not save calibration to %s (%s); it applies until this process ends",
                    self.path, exc)


def _remove_quietly(path: Path) -> None:
    """Remove a half-written temporary file, if there is one."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass  # the folder itself is unusable; nothing was left there


class AllocatorStats(Protocol):
    """What `PhaseMeter` reads of a device's caching allocator. `torch.cuda` and `torch.xpu`
    have these functions; tests pass a stand-in with known peaks (there is no GPU in CI)."""

    def synchronize(self, device: torch.device) -> None: ...
    def memory_allocated(self, device: torch.device) -> int: ...
    def max_memory_allocated(self, device: torch.device) -> int: ...
    def reset_peak_memory_stats(self, device: torch.device) -> None: ...


class PhaseMeter:
    """Measures one phase's working memory on a CUDA or XPU device (M47).

    The streamer's copies are one term: their peak is subtracted once, and copies it still holds
    at the end (buffers kept for the next phase) are copies, not memory the phase left behind.
    """

    def __init__(self, device: torch.device, api: AllocatorStats | None = None) -> None:
        self.device = device
        self._api: AllocatorStats = api or (torch.cuda if device.type == "cuda" else torch.xpu)
        self.placed = 0  # allocated once the weights are placed, without the streamer's copies
        self._held_at_start = 0

    @staticmethod
    def for_device(device: torch.device, simulated: bool) -> PhaseMeter | None:
        if simulated or device.type not in ("cuda", "xpu"):
            return None  # CPU activations are not device memory: nothing to calibrate
        return PhaseMeter(device)

    def placed_now(self, copies_held: int = 0) -> None:
        """Call once the phase's weights are placed (`copies_held`: the streamer's copies of the
        phase's components already on the device): the peak is measured above this."""
        self._api.synchronize(self.device)
        self.placed = self._api.memory_allocated(self.device) - copies_held
        self._held_at_start = copies_held
        self._api.reset_peak_memory_stats(self.device)

    def working_bytes(self, copies_peak: int, copies_held: int = 0) -> int:
        """Peak above the placed weights, minus the streamer copies' peak (`copies_peak`, at least
        what was ever held), minus what the phase left behind beyond the copies still held."""
        self._api.synchronize(self.device)
        peak = self._api.max_memory_allocated(self.device)
        copies = max(copies_peak, copies_held, self._held_at_start)
        left = max(0, self._api.memory_allocated(self.device) - self.placed - copies_held)
        return max(0, peak - self.placed - copies - left)
