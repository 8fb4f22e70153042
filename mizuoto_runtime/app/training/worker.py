"""The training process (M60): ``python -m mizuoto_runtime.app.training.worker``.

It reads one JSON line from stdin — the job: method, parameters, memory plan, device, the
host's `compute.*` settings, the CPU allocator — and writes events, one JSON object a line, to
its stdout: ``phase`` (with ``memory/peak_mb``), ``step`` (loss, seconds), ``warning``, then
``done`` (the result, with what the process ran with: its allocator environment and whether
it could get huge pages) or ``error`` (``kind`` mizuoto, oom or crash, and the message). Anything
else written to stdout (a package's print) goes to stderr, where logs go. The host keeps stdin
open while it waits: at end-of-file (the host died) the process exits.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
import traceback
from typing import IO, Any

import torch

from ...errors import MizuotoError
from ...memory.cuda_allocator import ALLOC_CONF
from .cpu_allocator import THP_ENV, apply_in_process, huge_pages_enabled
from .memory import MemoryPlan
from .methods import method_module

log = logging.getLogger("mizuoto.training")

EXIT_ERROR = 2
EXIT_HOST_GONE = 3


def _event_stream() -> IO[str]:
    """The original stdout for events; fd 1 then points at stderr."""
    events = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    return events


def _watch_host() -> None:
    """Exit when the host closes stdin (it ended or died): no orphaned training."""
    sys.stdin.read()
    os._exit(EXIT_HOST_GONE)


def main() -> int:
    events = _event_stream()
    lock = threading.Lock()

    def emit(**event: Any) -> None:
        with lock:
            events.write(json.dumps(event) + "\n")

    job = json.loads(sys.stdin.readline())
    threading.Thread(target=_watch_host, daemon=True, name="mizuoto-host-watch").start()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    apply_in_process(job["cpu_allocator"], os.environ)
    try:
        method = method_module(job["method"])
        torch.set_num_threads(job["threads"])  # the host's: MKL's sums may round by it (issue 31)
        result = method.run(job["params"], MemoryPlan(**job["memory"]), torch.device(job["device"]),
                            job["settings"], emit)
    except MizuotoError as exc:
        emit(event="error", kind="mizuoto", message=str(exc))
        return EXIT_ERROR
    except torch.OutOfMemoryError as exc:
        emit(event="error", kind="oom", message=str(exc))
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - any crash goes to the host, which shows it; traceback to the log
        traceback.print_exc()
        emit(event="error", kind="crash", message=f"{type(exc).__name__}: {exc}")
        return EXIT_ERROR
    emit(event="done", result={**result, "process": _process_report()})
    return 0


def _process_report() -> dict[str, Any]:
    """What the training process ran with (M54, M62): its CUDA allocator configuration and
    whether the kernel could give it huge pages."""
    return {ALLOC_CONF: os.environ.get(ALLOC_CONF, ""), THP_ENV: os.environ.get(THP_ENV, ""),
            "huge_pages": huge_pages_enabled()}


if __name__ == "__main__":
    sys.exit(main())
