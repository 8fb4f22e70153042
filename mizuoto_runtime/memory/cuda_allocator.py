"""`compute.cuda_allocator`: the environment that picks torch's CUDA allocator, written where it
can take effect (M54, issue 27). This module never imports torch.

PyTorch reads ``PYTORCH_CUDA_ALLOC_CONF`` when its CUDA library loads, at ``import torch``:
written later, it has no effect in this process, and on torch 2.5–2.7 a backend written between
the import and CUDA's start aborts CUDA's initialization ("Allocator backend parsed at runtime
!= allocator backend parsed at load time"). So it is written only where nothing has loaded
torch yet:

* the command line's entry point (`entry.main`) reads the setting from its arguments and writes
  the variable before anything imports torch (`apply_before_torch`);
* a training job starts its child process with it (`allocator_env`, `training.job`).

Anywhere else (inside ComfyUI, which imported torch long before, or a `Runtime` made in a
process that has) nothing is written: `state` logs once that the choice applies from the next
start, and every request reports it in ``meta.applied.cuda_allocator`` (when the setting is not
``auto``). A value already in the environment wins over the setting.
"""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence

log = logging.getLogger(__name__)

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
SETTING = "compute.cuda_allocator"
_ALLOC_CONFS = {"auto": "", "native": "", "async": "backend:cudaMallocAsync", "expandable": "expandable_segments:True"}
_PENDING_LOGGED: set[str] = set()


def allocator_env(cuda_allocator: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that selects `cuda_allocator` (for this process before torch loads, or
    a child process); a value already in the environment wins."""
    env = os.environ if environ is None else environ
    if ALLOC_CONF in env:
        return {ALLOC_CONF: env[ALLOC_CONF]}
    conf = _ALLOC_CONFS.get(cuda_allocator, "")  # an unknown value is named by the policy, later
    return {ALLOC_CONF: conf} if conf else {}


def from_arguments(argv: Sequence[str]) -> str | None:
    """The last ``--setting compute.cuda_allocator=VALUE`` among command-line arguments (either
    ``--setting X`` or ``--setting=X``), unchecked: the policy validates every setting later."""
    value = None
    pairs = [b for a, b in zip(argv, argv[1:]) if a == "--setting"]
    pairs += [a.partition("=")[2] for a in argv if a.startswith("--setting=")]
    for pair in pairs:
        key, sep, rest = pair.partition("=")
        if sep and key.strip() == SETTING:
            value = rest.strip()
    return value


def apply_before_torch(cuda_allocator: str | None) -> bool:
    """Write the variable for `cuda_allocator` if torch is not imported yet; whether it could."""
    if "torch" in sys.modules:
        return False
    if cuda_allocator:
        os.environ.update(allocator_env(cuda_allocator))
    return True


def state(cuda_allocator: str, environ: Mapping[str, str] | None = None) -> str:
    """What ``meta.applied.cuda_allocator`` says: the setting and the variable in force, or that
    the setting applies from the next start (logged once per value)."""
    env = os.environ if environ is None else environ
    wanted = allocator_env(cuda_allocator, env).get(ALLOC_CONF, "")
    current = env.get(ALLOC_CONF, "")
    if wanted == current:
        return f"{cuda_allocator} ({ALLOC_CONF}={current})" if current else cuda_allocator
    if cuda_allocator not in _PENDING_LOGGED:
        _PENDING_LOGGED.add(cuda_allocator)
        log.warning("compute.cuda_allocator=%s applies from the next start: torch was loaded before the "
                    "setting was read (start the process with %s=%s)", cuda_allocator, ALLOC_CONF, wanted)
    return f"{cuda_allocator}: applies from the next start (set {ALLOC_CONF}={wanted} before starting)"
