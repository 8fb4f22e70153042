"""RuntimeService: the loaded models above the manager (M29, M34).

It keeps at most `compute.max_resident_models` engines loaded (least recently used go
first), unloads engines idle longer than `compute.unload_after_minutes` (a server calls
`unload_idle` on a timer), relieves host RAM when free RAM falls below
`compute.ram_reserve_mb` — first dropping host copies of whole-loaded components, then
unloading idle engines least recently used first — moves idle components off a device before
fine-tuning on it (`release_device`; a training job that owns the device takes it with
`manager.exclusive(device)`, which waits for running requests, keeps new ones out and moves
idle components off, M60), and after a job fails with OOM moves every unused component off
every device (`release_after_oom`, ComfyUI's `unload_all_models`). It never unloads an engine
in use, one a request is serving (`serving`: between its phases too, so another request's RAM
relief cannot unload it under it), or one with a component in `engines.<id>.pinned_models`.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Protocol

import psutil
import torch

from .handle import ModelHandle
from .manager import ModelManager
from .policy import VramPolicy

log = logging.getLogger(__name__)


class Engine(Protocol):
    """What the service reads of a loaded engine (an `engines.Engine`, which sits above the memory
    runtime: a protocol keeps this module below it): its id, its handles, and how to unload it."""

    @property
    def id(self) -> str: ...

    def handles(self) -> Sequence[ModelHandle]: ...

    def unload(self) -> None: ...


def available_ram() -> int:
    return psutil.virtual_memory().available


class RuntimeService:
    """Loaded engines, least recently used first, and the rules that unload them (M29, M34)."""

    def __init__(self, manager: ModelManager, policy: VramPolicy,
                 free_ram: Callable[[], int] = available_ram) -> None:
        self.manager = manager
        self.policy = policy
        self.free_ram = free_ram
        self._engines: collections.OrderedDict[Hashable, Engine] = collections.OrderedDict()
        self._used: dict[Hashable, float] = {}
        self._serving: collections.Counter[int] = collections.Counter()  # id(engine) -> requests
        self._serving_lock = threading.Lock()

    # ---- the registry ----------------------------------------------------------------------
    def get(self, key: Hashable) -> Engine | None:
        engine = self._engines.get(key)
        if engine is not None:
            self.touch(key)
        return engine

    def loaded(self, key: Hashable) -> Engine | None:
        """The engine under `key`, without counting it as used."""
        return self._engines.get(key)

    def add(self, key: Hashable, engine: Engine) -> None:
        self._engines[key] = engine
        self.touch(key)
        self.enforce_resident_limit(keep=key)

    def touch(self, key: Hashable) -> None:
        self._engines.move_to_end(key)
        self._used[key] = time.monotonic()

    def unload(self, key: Hashable) -> bool:
        engine = self._engines.pop(key, None)
        self._used.pop(key, None)
        if engine is None:
            return False
        engine.unload()
        return True

    def unload_all(self) -> None:
        for key in list(self._engines):
            self.unload(key)

    def __len__(self) -> int:
        return len(self._engines)

    @contextlib.contextmanager
    def serving(self, engine: Engine) -> Iterator[None]:
        """A request runs on `engine` for the block: no rule unloads it meanwhile."""
        with self._serving_lock:
            self._serving[id(engine)] += 1
        try:
            yield
        finally:
            with self._serving_lock:
                self._serving[id(engine)] -= 1
                if self._serving[id(engine)] <= 0:
                    del self._serving[id(engine)]

    # ---- the rules -------------------------------------------------------------------------
    def _unloadable(self, keep: Hashable | None = None) -> list[Hashable]:
        """Idle, unpinned engines, least recently used first."""
        return [k for k, e in self._engines.items() if k != keep and not self._busy(e) and not self._pinned(e)]

    def _busy(self, engine: Engine) -> bool:
        return id(engine) in self._serving or any(h.in_use for h in engine.handles())

    def _pinned(self, engine: Engine) -> bool:
        return any(self.policy.is_pinned(engine.id, h.name) for h in engine.handles())

    def enforce_resident_limit(self, keep: Hashable | None = None) -> list[Hashable]:
        """M34: at most `compute.max_resident_models` engines stay loaded (0: no limit)."""
        limit = self.policy.max_resident_models
        gone: list[Hashable] = []
        if limit <= 0:
            return gone
        for key in self._unloadable(keep):
            if len(self._engines) <= limit:
                break
            log.info("unloading %s: more than compute.max_resident_models=%d models loaded", key, limit)
            self.unload(key)
            gone.append(key)
        return gone

    def unload_idle(self, now: float | None = None) -> list[Hashable]:
        """M34: unload engines idle longer than `compute.unload_after_minutes` (0: never)."""
        minutes = self.policy.unload_after_minutes
        if minutes <= 0:
            return []
        now = time.monotonic() if now is None else now
        idle = [k for k in self._unloadable() if now - self._used[k] > minutes * 60]
        for key in idle:
            log.info("unloading %s: idle for more than %g minutes", key, minutes)
            self.unload(key)
        return idle

    def relieve_ram(self) -> int:
        """M29: below `compute.ram_reserve_mb` of free RAM, drop host copies of whole-loaded
        idle components, then unload idle engines least recently used first. Bytes released."""
        reserve = self.policy.ram_reserve_bytes()
        if self.free_ram() >= reserve:
            return 0
        released = 0
        for key in self._unloadable():
            for handle in self._engines[key].handles():
                released += handle.drop_host_copies()
        for key in self._unloadable():
            if self.free_ram() >= reserve:
                break
            released += sum(h.size_bytes for h in self._engines[key].handles())
            log.warning("free RAM below compute.ram_reserve_mb: unloading %s", key)
            self.unload(key)
        return released

    def release_device(self, device: torch.device | None = None) -> int:
        """M34: move every idle component off `device` (every device when None)."""
        return self.manager.offload_idle(device=device)

    def release_after_oom(self) -> int:
        """M34: after a job failed with OOM, every unused component leaves every device."""
        freed = self.release_device()
        log.warning("a request ran out of device memory: moved %.1f MB of idle components off the devices",
                    freed / 2**20)
        return freed
