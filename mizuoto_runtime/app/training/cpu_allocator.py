"""`compute.cpu_allocator` in a training process: torch's huge pages on or off (M62).

Torch's CPU allocator asks the kernel for transparent huge pages (`madvise(MADV_HUGEPAGE)` on
allocations of 2 MB and more) when ``THP_MEM_ALLOC_ENABLE=1`` is in the environment when
torch starts. Then every fresh large buffer — the host-side optimizer's temporaries each step
— waits for the kernel to compact memory into 2 MB pages: the design note measured the
`lowest` preset 2.2x slower with them. So the setting reaches the training child through its
environment (read once, at its first allocation), and ``no_hugepages`` also turns huge pages
off for the whole child process (``prctl(PR_SET_THP_DISABLE)``), which covers a kernel whose
huge pages are ``always`` on rather than on request.

Values: ``auto`` (the environment and the kernel decide), ``hugepages``, ``no_hugepages``.
The `lowest` preset picks ``no_hugepages`` unless `compute.cpu_allocator` says otherwise.
"""
from __future__ import annotations

import ctypes
import logging
import sys
from collections.abc import Mapping

log = logging.getLogger(__name__)

THP_ENV = "THP_MEM_ALLOC_ENABLE"
_PR_SET_THP_DISABLE = 41  # linux/prctl.h
_ENV = {"hugepages": "1", "no_hugepages": "0"}


def effective(setting: str, preset_choice: str) -> str:
    """The child's allocator: `compute.cpu_allocator` when set, else the preset's choice."""
    return setting if setting != "auto" else preset_choice


def cpu_allocator_env(value: str) -> dict[str, str]:
    """The environment a training child starts with for this `compute.cpu_allocator` value."""
    return {THP_ENV: _ENV[value]} if value in _ENV else {}


def apply_in_process(value: str, environ: Mapping[str, str]) -> bool:
    """In the training child, before its large allocations: with ``no_hugepages`` turn the
    kernel's huge pages off for this process. True if the process now runs without them."""
    if value != "no_hugepages":
        return False
    if environ.get(THP_ENV) not in (None, "0"):
        log.warning("%s=%s in the environment: torch still asks for huge pages", THP_ENV, environ[THP_ENV])
    if not sys.platform.startswith("linux"):
        return True  # torch's huge pages exist only on Linux; the environment turned them off
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        log.warning("could not turn huge pages off for the training process (errno %d)", ctypes.get_errno())
        return False
    return True


def huge_pages_enabled() -> bool | None:
    """Whether the kernel may give this process huge pages (Linux: `THP_enabled` in
    /proc/self/status); None where that cannot be read."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("THP_enabled:"):
                    return line.split()[1] == "1"
    except OSError:
        return None
    return None
