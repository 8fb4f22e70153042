"""A training job (M60): its own process, owning its device while it runs.

`TrainingJob(runtime, method, params, memory=…, device=…).run()` on the host:

1. checks the method's parameters (`check`) and picks the memory plan (`training.memory`, M61);
2. on a device that moves weights (a GPU, or the simulated one), owns it (`own_device`): the
   manager's exclusive hold on every request slot of `gpu:<dev>` (`ModelManager.exclusive`,
   `JobSpec.exclusive`; running phases there end first, new ones wait, and every idle model
   moves off), then asks the host's other accounting (ComfyUI, M35) to free the device too, and
   empties torch's cache so the memory is free for the other process;
3. warns when the estimated peak (`MethodInfo.memory_mb`, M63) exceeds the free memory, naming
   a preset or batch size that fits;
4. starts the training process (`worker.py`) with the allocator settings in its environment
   (`allocator_env`, M54, and `compute.cpu_allocator`, M62), relays its events (progress,
   loss, `memory/peak_mb`) to `on_event`, and checks `cancel_check` while it waits;
5. cancelled (ComfyUI's interrupt, Ctrl-C) or failed, the process is ended and the slots freed.

On the plain CPU (M5) nothing moves, so no slot is taken and nothing is released. The placement
log shows the hold: ``("exclusive", "training:<method>", 0)``, the yields it caused, then
``("exclusive_end", "training:<method>", 0)``.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ...errors import MizuotoError
from ...memory.cuda_allocator import allocator_env
from ...memory.manager import ModelManager
from ...memory.policy import MB
from ..runtime import Runtime
from . import cpu_allocator
from .estimate import fit_advice
from .memory import MemoryPlan, memory_plan
from .methods import method_module

log = logging.getLogger(__name__)

EventSink = Callable[[dict[str, Any]], None]
POLL_S = 0.2
STOP_GRACE_S = 5.0
PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the folder holding `mizuoto_runtime`


class TrainingFailed(MizuotoError):
    """The training process reported an error (its message), or ended without a result."""


class TrainingJob:
    """One training run of `method` on `device` (see the module docstring)."""

    def __init__(self, runtime: Runtime, method: str, params: Mapping[str, Any], *, memory: str = "default",
                 device: str | torch.device | None = "auto", on_event: EventSink | None = None,
                 cancel_check: Callable[[], None] | None = None) -> None:
        self.runtime = runtime
        self.method_id = method
        self.method: ModuleType = method_module(method)
        self.params = self.method.check(params)
        self.plan: MemoryPlan = memory_plan(memory, self.params)
        self.device = runtime.device(device)
        self.on_event = on_event
        self.cancel_check = cancel_check
        self.warnings: list[str] = []
        self.released_bytes = 0

    # ---- the host's side ---------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        with self._own_device():
            result = self._run_process()
        return {**result, "method": self.method_id, "warnings": self.warnings, "released_mb": self.released_bytes / MB}

    @contextlib.contextmanager
    def _own_device(self) -> Iterator[None]:
        """M60: the device is the job's for the block (GPU phases only), then M63's check."""
        with own_device(self.runtime.manager, self.device, f"training:{self.method_id}", self.cancel_check) as freed:
            self.released_bytes = freed
            if self.runtime.devices.moves(self.device):
                self._check_estimate()
            yield

    def _check_estimate(self) -> None:
        """M63: warn when the estimated peak does not fit the free memory."""
        free_mb = self.runtime.devices.free_bytes(self.device) / MB
        advice = fit_advice(self.method.INFO, self.plan.preset, self.method.model_params(self.params),
                            int(self.params.get("batch_size", 1)), free_mb, self.device.type)
        if advice is not None:
            log.warning("%s", advice)
            self._warn(advice)

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        self._emit({"event": "warning", "message": message})

    def _emit(self, event: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(event)

    # ---- the training process ------------------------------------------------------------------
    def child_device(self) -> str:
        """Where the process trains: the device itself (the simulated GPU is the CPU)."""
        return "cpu" if self.runtime.devices.is_simulated(self.device) else str(self.device)

    def child_env(self) -> dict[str, str]:
        """The host's environment plus the allocator choices (M54, M62) and the package path."""
        policy = self.runtime.policy
        allocator = cpu_allocator.effective(policy.cpu_allocator, self.plan.cpu_allocator)
        env = {**os.environ, **allocator_env(policy.cuda_allocator), **cpu_allocator.cpu_allocator_env(allocator)}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")) if p)
        return env

    def child_job(self) -> dict[str, Any]:
        settings = {k: v for k, v in self.runtime.policy.as_dict().items() if k != "compute.simulate_vram_mb"}
        return {
            "method": self.method_id, "params": self.params, "memory": self.plan.describe(),
            "device": self.child_device(), "settings": settings, "threads": torch.get_num_threads(),
            "cpu_allocator": cpu_allocator.effective(self.runtime.policy.cpu_allocator, self.plan.cpu_allocator),
        }

    def _run_process(self) -> dict[str, Any]:
        proc = subprocess.Popen([sys.executable, "-m", "mizuoto_runtime.app.training.worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=self.child_env(), text=True, encoding="utf-8")
        events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        reader = threading.Thread(target=_read_events, args=(proc, events), daemon=True, name="mizuoto-training-events")
        reader.start()
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(self.child_job()) + "\n")
            proc.stdin.flush()
            return self._follow(events)
        finally:
            _stop(proc)  # cancelled, failed or done: the process is gone before the slots free
            reader.join(STOP_GRACE_S)

    def _follow(self, events: queue.Queue[dict[str, Any] | None]) -> dict[str, Any]:
        while True:
            if self.cancel_check is not None:
                self.cancel_check()
            try:
                event = events.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if event is None:
                raise TrainingFailed(f"the training process for {self.method_id} ended without a result "
                                     "(see the log above)")
            kind = event.get("event")
            if kind == "done":
                return dict(event["result"])
            if kind == "error":
                raise TrainingFailed(self._failure(event))
            if kind == "warning":
                self.warnings.append(str(event.get("message")))
            self._emit(event)

    def _failure(self, event: Mapping[str, Any]) -> str:
        message = f"training {self.method_id} failed: {event.get('message')}"
        if event.get("kind") == "oom" and self.plan.preset != "lowest":
            message += f" (out of device memory under training.memory={self.plan.preset}; try lowest)"
        return message


@contextlib.contextmanager
def own_device(manager: ModelManager, device: torch.device, who: str,
               cancel_check: Callable[[], None] | None = None) -> Iterator[int]:
    """M60: `device` is `who`'s for the block. On a device that moves weights: the manager's
    exclusive hold (running phases there end first, new ones wait — checking their own
    cancellation — and every idle component moves off), then the host's other accounting
    (ComfyUI, M35) frees the whole device and torch's cache is emptied, so the memory is free for
    another process. The block gets the bytes freed. On the plain CPU (M5) nothing is held."""
    if not manager.devices.moves(device):
        yield 0
        return
    with manager.exclusive(device, who=who, cancel_check=cancel_check) as freed:
        if manager.external is not None:
            freed += manager.external.free_for(device, manager.devices.total_bytes(device), keep=())
        manager.devices.empty_cache(device)
        log.info("%s: released %.1f MB on %s", who, freed / MB, device)
        yield freed


def _read_events(proc: subprocess.Popen[str], events: queue.Queue[dict[str, Any] | None]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.strip()
        if not line:
            continue
        try:
            events.put(json.loads(line))
        except json.JSONDecodeError:
            log.info("training process: %s", line)
    events.put(None)  # end of output: the process ended


def _stop(proc: subprocess.Popen[str]) -> None:
    """End the training process: closing stdin tells it the host is gone; then terminate, kill."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
