"""The intra-op thread count on threads other than the one that set it (M8; issue 31).

`torch.set_num_threads(n)` applies `n` to OpenMP and to Intel MKL in the *calling* thread only
(`omp_set_num_threads`, `mkl_set_num_threads_local`) and stores it for the process. Another
thread applies the stored count lazily, on its first ATen parallel region or
`torch.get_num_threads()` (`at::internal::lazy_init_num_threads`). A thread whose first work is
a matrix product never gets there first: MKL's GEMM runs with MKL's own default, the core count.
On MKL's Intel code path a product with a long inner dimension is then split across threads
along that dimension and its sums round differently (by an ulp or so) from the thread that set
the count. A request on a new thread — two at once with `compute.gpu_jobs` 2 — would change
the numbers. Everything here makes a thread compute with the count its creator had.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch


def adopt_intra_op_threads() -> int:
    """Make the calling thread compute with the process's intra-op thread count (the last
    `torch.set_num_threads`, else torch's default) before its first product; returns the count.

    Reading the count is what runs ATen's per-thread initialisation, which applies the stored
    count to OpenMP and MKL in this thread; on a thread already initialised it changes nothing."""
    return torch.get_num_threads()


def computing_thread(target: Callable[..., object], *args: Any, name: str | None = None,
                     daemon: bool | None = None) -> threading.Thread:
    """A thread (not started) that runs `target(*args)` with the intra-op thread count of the
    thread creating it, set first thing, so what it computes rounds as its creator's would."""
    threads = torch.get_num_threads()

    def run() -> None:
        torch.set_num_threads(threads)
        target(*args)

    return threading.Thread(target=run, name=name, daemon=daemon)


@contextlib.contextmanager
def intra_op_threads(threads: int) -> Iterator[None]:
    """`threads` intra-op threads in the calling thread for the block, then its count before."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
