"""Exclusive device slots for training jobs (M60): while a job holds `gpu:<dev>`, no inference
phase is placed on that device.

The interface the training job needs is `ExclusiveSlots.hold(JobSpec(device, exclusive=True))`:
a context manager that returns once every request slot of the device is the job's (running
phases there have ended) and keeps new phases there waiting until it exits. `ManagerGate` is
this package's own implementation over a `ModelManager`, to be replaced by the manager's
per-device request slots (`compute.gpu_jobs`, with their exclusive mode) when those exist:
it wraps the manager's `acquire` so that a phase on a held device waits — checking its
request's cancellation — and it records the job's start and end in the manager's placement
log (``("train", "training:<name>", 0)`` and ``("train_end", ...)``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from ..handle import ModelHandle
from ..manager import ModelManager

log = logging.getLogger(__name__)

POLL_S = 0.1
CancelCheck = Callable[[], None]


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """A job on a device; `exclusive`: it takes every request slot of `gpu:<dev>` (M60)."""

    device: torch.device
    name: str
    exclusive: bool = True


class ExclusiveSlots(Protocol):
    def hold(self, spec: JobSpec, cancel_check: CancelCheck | None = None) -> contextlib.AbstractContextManager[None]:
        """Every slot of `spec.device` for the block; new phases there wait until it ends."""


def slot_name(device: torch.device) -> str:
    return f"gpu:{device}"


class ManagerGate:
    """`ExclusiveSlots` over one `ModelManager` (see the module docstring)."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager
        self._cond = threading.Condition()
        self._held: dict[str, JobSpec] = {}
        self._entering: dict[str, int] = {}
        original = manager.acquire

        def acquire(handles: Sequence[ModelHandle], memory: int = 0, **kwargs: Any) -> Any:
            devices = {str(h.device) for h in handles}
            self._enter(devices, kwargs.get("cancel_check"))
            try:
                return original(handles, memory, **kwargs)
            finally:
                self._leave(devices)

        manager.acquire = acquire  # type: ignore[method-assign]

    def _enter(self, devices: set[str], cancel_check: CancelCheck | None) -> None:
        """A phase waits while a job holds one of its devices (checking for cancellation)."""
        with self._cond:
            told = False
            while held := [self._held[d] for d in devices if d in self._held]:
                if not told:
                    log.info("waiting for training job %s to release %s", held[0].name, slot_name(held[0].device))
                    told = True
                if cancel_check is not None:
                    cancel_check()
                self._cond.wait(POLL_S)
            for d in devices:
                self._entering[d] = self._entering.get(d, 0) + 1

    def _leave(self, devices: set[str]) -> None:
        with self._cond:
            for d in devices:
                self._entering[d] -= 1
            self._cond.notify_all()

    def _busy(self, key: str) -> bool:
        """A phase is being placed on, or runs on, the device."""
        return bool(self._entering.get(key)) or any(h.in_use and str(h.device) == key for h in self.manager.handles)

    @contextlib.contextmanager
    def hold(self, spec: JobSpec, cancel_check: CancelCheck | None = None) -> Iterator[None]:
        key = str(spec.device)
        with self._cond:
            while key in self._held:  # another job holds it: wait for it
                if cancel_check is not None:
                    cancel_check()
                self._cond.wait(POLL_S)
            self._held[key] = spec  # from now on new phases there wait
        try:
            with self._cond:
                while self._busy(key):  # running phases end first
                    if cancel_check is not None:
                        cancel_check()
                    self._cond.wait(POLL_S)
            self.manager.events.append(("train", f"training:{spec.name}", 0))
            log.info("training job %s holds %s", spec.name, slot_name(spec.device))
            yield
        finally:
            with self._cond:
                del self._held[key]
                self.manager.events.append(("train_end", f"training:{spec.name}", 0))
                self._cond.notify_all()


_GATE_ATTR = "_mizuoto_training_gate"
_GATES_LOCK = threading.Lock()


def gate_of(manager: ModelManager) -> ManagerGate:
    """The manager's one gate (installed on first use; it lives as long as the manager)."""
    with _GATES_LOCK:
        gate = getattr(manager, _GATE_ATTR, None)
        if gate is None:
            gate = ManagerGate(manager)
            setattr(manager, _GATE_ATTR, gate)
        return gate
