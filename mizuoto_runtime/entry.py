"""The command line's entry point (``mizuoto``, ``python -m mizuoto_runtime``).

It writes ``compute.cuda_allocator``'s environment before anything imports torch (which reads
it once, as its CUDA library loads: `cuda_allocator`), then runs `cli.main`. Nothing here
imports torch; neither does importing the package (its names load on first use).
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

from .memory.cuda_allocator import apply_before_torch, from_arguments


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    apply_before_torch(from_arguments(args))
    from .app.cli import main as run  # imports torch

    return run(args)
