"""`memory/peak_mb` of a training phase (M63).

On CUDA: the peak of memory torch reserved on the device during the phase (what the device had
to give, fragmentation included; the CUDA context is not in it — estimates add it). On the CPU:
the process's peak resident set during the phase above a baseline the method takes once its
engine package is imported and before any model loads, so model weights, activations and
optimizer state count, as they would on a device. Linux resets the peak per
phase (``/proc/self/clear_refs``); elsewhere the process's lifetime peak is used.
"""
from __future__ import annotations

import sys

import psutil
import torch

MB = 1 << 20


def _rss_peak_bytes() -> int:
    """The peak resident set: VmHWM on Linux (not ru_maxrss, which a child inherits from the
    process that forked it), the peak working set on Windows, ru_maxrss elsewhere."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    info = psutil.Process().memory_info()
    if hasattr(info, "peak_wset"):
        return int(info.peak_wset)
    import resource  # POSIX only

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def _reset_rss_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # reset the peak resident set to the current one
    except OSError:
        pass


class PeakMeter:
    """Measures one phase: ``with meter: ...`` then `peak_mb`."""

    def __init__(self, device: torch.device, baseline_rss: int) -> None:
        self.device = device
        self.baseline_rss = baseline_rss
        self.peak_mb = 0.0

    def __enter__(self) -> PeakMeter:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _reset_rss_peak()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_mb = torch.cuda.max_memory_reserved(self.device) / MB
        else:
            self.peak_mb = max(0, _rss_peak_bytes() - self.baseline_rss) / MB


def current_rss() -> int:
    return psutil.Process().memory_info().rss
