"""Faults for tests of the runtime, kept out of the modules that run requests (issue 32).

`OomInjector`: a `DeviceService.fault_hook` that raises `torch.OutOfMemoryError` at chosen
counted allocations or copies (M40: the exact retry, M42: the fallback). Also
`from mizuoto_runtime import OomInjector`.
"""
from __future__ import annotations

import torch


class OomInjector:
    """A `DeviceService.fault_hook` that raises `torch.OutOfMemoryError` at the Nth counted
    allocation/copy on a non-CPU-offload device (tests of M40: exact retry)."""

    def __init__(self, at: int | list[int]) -> None:
        self.at = set([at] if isinstance(at, int) else at)
        self.count = 0
        self.raised = 0

    def __call__(self, device: torch.device, nbytes: int) -> None:
        self.count += 1
        if self.count in self.at:
            self.raised += 1
            raise torch.OutOfMemoryError(f"injected OOM at allocation #{self.count} ({nbytes} bytes on {device})")
