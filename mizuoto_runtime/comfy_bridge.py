"""ComfyUI bridge: one memory accounting for Mizuoto and ComfyUI (M35), and the process runtime
the pack's nodes share. The only runtime module that imports `comfy` — always inside a function,
so `import mizuoto_runtime` (and this module) never imports ComfyUI.

**Accounting.** ComfyUI keeps `comfy.model_management.current_loaded_models`, a list of
`LoadedModel` entries (newest first), each holding a *weak* reference to a patcher. Every
Mizuoto handle on a device that moves weights (a GPU, or the simulated device of M55) gets a
`HandleAdapter` that speaks that patcher protocol, for the October 2025 ComfyUI (v0.3.64) and
the newest (dynamic VRAM: `is_dynamic()` is False, so core never reads the fields only its own
dynamic patcher has). Then:

* ComfyUI's `free_memory` / `unload_all_models` / "Unload models" evict our components: a
  request smaller than what the handle holds calls `partially_unload`, which gives back units
  in reverse placement order (M32) and keeps the entry; a larger one calls `detach(True)`,
  which moves the whole component off the device (host copies make that free, M25).
* When our manager needs room (`ExternalAccounting.free_for`), ComfyUI frees its own models
  first: `free_memory(get_free_memory(dev) + N, dev, keep_loaded=...)`, where `keep_loaded`
  lists the entries of the handles being placed and of every handle in use.
* Neither side evicts what the other uses: our handles in use are in `keep_loaded` when we
  ask, and the adapter refuses to unload one when ComfyUI asks; ComfyUI's models are only ever
  in use by the node ComfyUI is running, and our requests run inside our own nodes.

**Registration** (`on_placed`, called by the manager after each placement, i.e. before every
phase). The entry is inserted directly, not through `load_models_gpu`: that function would
call `free_memory` for the handle's *streamed* bytes plus ComfyUI's 0.8 GB+ inference reserve
(evicting ComfyUI models for memory our manager decided not to use) and then
`partially_load` the handle to ComfyUI's own budget (on CPU: whole), overriding the budget
split of M33. A direct insert does what `load_models_gpu`'s bookkeeping does and nothing else:
one `LoadedModel` per adapter (an existing entry moves to the front, so registering twice
leaves one entry), `real_model` and the finalizer that removes the entry when the handle dies.

**Simulated device** (M55, tests). ComfyUI measures the CPU's free memory as host RAM. Our
simulated copies are host tensors, so evicting them does raise it, but so does anything else
in the machine: on the simulated device `free_for` is approximate and may evict more idle
candidates than asked. The bytes it reports are measured on our own device service, so the
manager's arithmetic stays right; exact arithmetic is tested with `get_free_memory` patched to
the simulated budget. Under `--cpu` ComfyUI's device is the CPU, so "Unload models" reaches
simulated entries; under a GPU ComfyUI it frees the GPU only.

`model_management` has no lock: everything here runs on the thread that executes nodes.

**Node logic without ComfyUI.** The nodes' fallback switch (M44, `fallback_switch`) lives here,
not in `nodes/` (which imports ComfyUI), so the contract tests check it in CI; the checkpoint
listing is `checkpoints.py`.
"""
from __future__ import annotations

import collections
import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .engines import Engine
from .engines.qwen3tts_lora import LoraChoice, use_lora
from .handle import ModelHandle
from .manager import ModelManager
from .phases import RequestContext
from .report import REASON_YIELDED
from .runtime import Runtime

log = logging.getLogger(__name__)

#: What a component's `gave_up_for` (M50) names when ComfyUI evicted its units.
COMFYUI = "comfyui"


def _model_management() -> ModuleType:
    import comfy.model_management

    return comfy.model_management


def comfy_device(device: torch.device) -> torch.device:
    """ComfyUI's device object for `device`: entries match devices with `==`, and `cuda` is not
    `cuda:0`, so a device ComfyUI uses is named the way ComfyUI names it."""
    ours = _model_management().get_torch_device()
    if not isinstance(ours, torch.device) or ours.type != device.type:
        return device
    if ours.index == device.index or ours.index is None or device.index is None:
        return ours
    return device


class HandleAdapter:
    """A Mizuoto handle as ComfyUI's `model_management` sees a `ModelPatcher` (M35).

    `model` is the handle itself: weak-referenceable and alive exactly as long as the handle
    (ComfyUI finalizes its entry on it). The adapter holds the handle weakly and lives as long
    as the handle does (see `ComfyAccounting`).
    """

    parent = None  # not a clone of another patcher

    def __init__(self, handle: ModelHandle, manager: ModelManager, load_device: torch.device) -> None:
        self._handle = weakref.ref(handle)
        self._manager = manager
        self.load_device = load_device
        self.offload_device = handle.devices.offload_device

    @property
    def model(self) -> ModelHandle | None:
        return self._handle()

    @property
    def handle(self) -> ModelHandle:
        handle = self._handle()
        if handle is None:
            raise ReferenceError("the Mizuoto component behind this ComfyUI entry no longer exists")
        return handle

    # ---- sizes -------------------------------------------------------------------------
    def model_size(self) -> int:
        return self.handle.size_bytes

    def loaded_size(self) -> int:
        """What the handle really holds on the device: resident weights and cached copies."""
        return self.handle.device_bytes

    def current_loaded_device(self) -> torch.device:
        return self.load_device if self.handle.device_bytes else self.offload_device

    def model_dtype(self) -> torch.dtype | None:
        param = next(iter(self.handle.module.parameters()), None)
        return None if param is None else param.dtype

    # ---- the parts of the patcher protocol that have nothing to do for us ----------------
    def model_patches_models(self) -> list[Any]:
        return []

    def model_patches_to(self, device_or_dtype: torch.device | torch.dtype | None) -> None:
        """No patches to move: a handle's weights are placed by the handle."""

    def lowvram_patch_counter(self) -> int:
        return 0

    def is_dynamic(self) -> bool:
        """Never ComfyUI's dynamic-VRAM patcher: its allocator cannot evict our units."""
        return False

    def loaded_ram_size(self) -> int:
        return 0

    def partially_unload_ram(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def is_clone(self, other: Any) -> bool:
        """True for itself (ComfyUI re-registers an entry by removing its clones first)."""
        return getattr(other, "model", None) is self.model

    # ---- placement -----------------------------------------------------------------------
    def partially_load(self, device: torch.device, extra_memory: float = 0,
                       force_patch_weights: bool = False) -> int:
        """Place up to `extra_memory` more bytes of the handle (ComfyUI's `1e32` = whole), never
        beyond the device's free memory; bytes newly placed."""
        handle = self.handle
        if handle.in_use or handle.unloaded or device != self.load_device:
            return 0  # a running phase's placement is the manager's; M31
        room = min(float(extra_memory), float(handle.devices.free_bytes(handle.device)))
        if room < 1:
            return 0
        budget = handle.loaded_bytes + int(room)
        if budget < handle.min_working_set:
            return 0  # the handle would place its minimum (M7), more than ComfyUI offered
        return handle.load(None if budget >= handle.size_bytes else budget)

    def partially_unload(self, device_to: torch.device, memory_to_free: float = 0) -> int:
        """Give back at least `memory_to_free` bytes, unit by unit (M32); bytes really freed.
        A handle in use gives nothing (M35), and ComfyUI then detaches it instead."""
        handle = self.handle
        if handle.in_use:
            log.info("ComfyUI asked %s for %.1f MB while a phase uses it; it keeps its units",
                     self._manager.key(handle), memory_to_free / 2**20)
            return 0
        return self._yielded(handle, handle.partially_unload(int(memory_to_free)))

    def detach(self, unpatch_all: bool = True) -> ModelHandle | None:
        """`False`: ComfyUI re-registers the entry, units stay. `True`: the component leaves the
        device, unless a phase uses it (M35): then it leaves when the phase has ended and
        ComfyUI asks again."""
        handle = self._handle()
        if handle is None or not unpatch_all:
            return handle
        if handle.in_use:
            log.warning("ComfyUI unloaded %s while a phase uses it; it stays on the device",
                        self._manager.key(handle))
            return handle
        self._yielded(handle, handle.offload())
        return handle

    def _yielded(self, handle: ModelHandle, freed: int) -> int:
        """Record an eviction by ComfyUI the way the manager records a yield (M50)."""
        if freed:
            handle.partial_reason = REASON_YIELDED if handle.loaded_bytes else None
            handle.gave_up_for = sorted(set(handle.gave_up_for) | {COMFYUI})
            self._manager.events.append(("yield", self._manager.key(handle), freed))
            log.info("%s gave ComfyUI %.1f MB", self._manager.key(handle), freed / 2**20)
        return freed

    def __repr__(self) -> str:
        handle = self._handle()
        return f"HandleAdapter({self._manager.key(handle) if handle else 'released'})"


class ComfyAccounting:
    """`ExternalAccounting` (manager.py) over ComfyUI's `current_loaded_models` (M35)."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager
        # One adapter per handle, alive exactly as long as the handle (ComfyUI refers to it weakly).
        self._adapters: weakref.WeakKeyDictionary[ModelHandle, HandleAdapter] = weakref.WeakKeyDictionary()

    def adapter(self, handle: ModelHandle) -> HandleAdapter:
        adapter = self._adapters.get(handle)
        if adapter is None:
            adapter = HandleAdapter(handle, self.manager, comfy_device(handle.device))
            self._adapters[handle] = adapter
        return adapter

    def entry(self, handle: ModelHandle) -> Any | None:
        """The handle's `LoadedModel` in ComfyUI's list, if registered."""
        adapter = self._adapters.get(handle)
        if adapter is None:
            return None
        return next((e for e in _model_management().current_loaded_models if e.model is adapter), None)

    def register(self, handle: ModelHandle) -> Any:
        """Put the handle's entry at the front of ComfyUI's list (once; see the module docstring)."""
        mm = _model_management()
        entry = self.entry(handle)
        if entry is None:
            entry = mm.LoadedModel(self.adapter(handle))
            entry.real_model = weakref.ref(handle)
            entry.model_finalizer = weakref.finalize(handle, mm.cleanup_models)
            entry.model_finalizer.atexit = False
        else:
            _remove(mm.current_loaded_models, entry)
        entry.currently_used = True
        mm.current_loaded_models.insert(0, entry)
        return entry

    # ---- ExternalAccounting --------------------------------------------------------------
    def on_placed(self, handles: Sequence[ModelHandle]) -> None:
        for handle in handles:
            if self.manager.devices.moves(handle.device):
                self.register(handle)
        self.prune()

    def free_for(self, device: torch.device, nbytes: int, keep: Sequence[ModelHandle]) -> int:
        """Ask ComfyUI to free `nbytes` on `device` (its models first, then our idle handles in
        its order); never an entry of `keep` or of a handle in use. Bytes gained on our device."""
        mm = _model_management()
        self.prune()
        target = comfy_device(device)
        protected = [e for e in mm.current_loaded_models if self._protects(e, keep)]
        before = self.manager.devices.free_bytes(device)
        mm.free_memory(mm.get_free_memory(target) + nbytes, target, keep_loaded=protected)
        return max(0, self.manager.devices.free_bytes(device) - before)

    @staticmethod
    def _protects(entry: Any, keep: Sequence[ModelHandle]) -> bool:
        adapter = entry.model
        if not isinstance(adapter, HandleAdapter):
            return False
        handle = adapter.model
        return handle is not None and (bool(handle.in_use) or any(handle is k for k in keep))

    # ---- housekeeping --------------------------------------------------------------------
    def prune(self) -> None:
        """Drop entries of components that hold nothing on the device or were unloaded (a spent
        handle; ComfyUI's own finalizer only runs once the handle is collected)."""
        mm = _model_management()
        for entry in list(mm.current_loaded_models):
            adapter = entry.model
            if isinstance(adapter, HandleAdapter) and _stale(adapter.model):
                _remove(mm.current_loaded_models, entry)
                if entry.model_finalizer is not None:
                    entry.model_finalizer.detach()

    def forget_all(self) -> None:
        """Remove every entry this accounting made (the runtime it serves is being replaced)."""
        mm = _model_management()
        mine = set(map(id, self._adapters.values()))
        for entry in list(mm.current_loaded_models):
            if id(entry.model) in mine:
                _remove(mm.current_loaded_models, entry)
                if entry.model_finalizer is not None:
                    entry.model_finalizer.detach()


def _stale(handle: ModelHandle | None) -> bool:
    return handle is None or handle.unloaded or (not handle.in_use and handle.device_bytes == 0)


def _remove(entries: list[Any], entry: Any) -> None:
    """Remove by identity: `LoadedModel.__eq__` compares patchers, and dead entries all equal None."""
    for i, e in enumerate(entries):
        if e is entry:
            del entries[i]
            return


def install(runtime: Runtime) -> ComfyAccounting:
    """Join `runtime`'s manager to ComfyUI's accounting (M35)."""
    accounting = ComfyAccounting(runtime.manager)
    runtime.manager.external = accounting
    return accounting


# ---- requests from nodes ---------------------------------------------------------------------
def interrupt_check() -> None:
    """Raise ComfyUI's interruption once `/interrupt` (or Cancel) was requested."""
    _model_management().throw_exception_if_processing_interrupted()


class ProgressReporter:
    """A request's `on_progress(done, total)` shown on ComfyUI's progress bar (per token or step)."""

    def __init__(self) -> None:
        self._bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if total <= 0:
            return
        if self._bar is None or self._bar.total != total:
            import comfy.utils

            self._bar = comfy.utils.ProgressBar(total)
        self._bar.update_absolute(done, total)


def node_request(runtime: Runtime, seed: int = 0) -> RequestContext:
    """A request for one node: ComfyUI's progress bar, and `/interrupt` honoured between tokens
    and between streamed copies."""
    return runtime.request(seed, cancel_check=interrupt_check, on_progress=ProgressReporter())


def fallback_switch(toggle: bool) -> bool | None:
    """M44: a node's `allow_fallback` toggle as the runtime's switch (`ctx.run(allow_fallback=)`).

    On: the engine's cheaper fallback is allowed whatever `compute.oom_fallback` says. Off: None,
    so that setting decides — a toggle left at its default never refuses what Memory Settings
    allow for the whole process."""
    return True if toggle else None


# ---- the process runtime ---------------------------------------------------------------------
EngineKey = tuple[str, str | None, str, str]  # engine, folder, dtype, device


class EngineRef:
    """The value of a `MIZUOTO_ENGINE` socket: which engine, resolved in the process runtime.

    The engine lives as long as any reference to it lives — ComfyUI's node cache holds the
    loader's output — so "Free model and node cache" (or removing the loader from the graph)
    unloads it from RAM too, like ComfyUI's own models.
    """

    def __init__(self, owner: ProcessRuntime, engine_id: str, model_dir: str | Path | None, dtype: str,
                 device: str = "auto", lora: LoraChoice | None = None) -> None:
        self.owner = owner
        self.key: EngineKey = (engine_id, str(model_dir) if model_dir else None, dtype, device)
        self.lora = lora
        owner._acquire(self.key)
        weakref.finalize(self, owner._release, self.key).atexit = False

    @property
    def engine(self) -> Engine:
        """The engine, loaded in the current runtime (again, after the runtime was replaced);
        `Runtime.engine` builds it outside ComfyUI's inference mode. Its weights are this
        reference's: a LoRA node's reference applies its LoRA, a plain one gives the engine its
        checkpoint's weights back (both do nothing when the engine already has them)."""
        engine = self.owner.runtime().engine(*self.key)
        use_lora(engine, self.lora)
        return engine

    def with_lora(self, lora: LoraChoice | None) -> EngineRef:
        """The same engine, with `lora` applied whenever it is used through the new reference."""
        return EngineRef(self.owner, *self.key, lora=lora)

    @property
    def runtime(self) -> Runtime:
        return self.owner.runtime()

    def __repr__(self) -> str:
        engine_id, model_dir, dtype, device = self.key
        lora = f", LoRA {self.lora.path.name} x{self.lora.strength:g}" if self.lora else ""
        return f"EngineRef({engine_id}, {model_dir or 'built-in weights'}, {dtype}, {device}{lora})"


class ProcessRuntime:
    """The one `Runtime` of a ComfyUI process, joined to ComfyUI's accounting."""

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self._settings = dict(settings or {})
        self._runtime: Runtime | None = None
        self._accounting: ComfyAccounting | None = None
        self._refs: collections.Counter[EngineKey] = collections.Counter()
        self._lock = threading.RLock()

    def runtime(self) -> Runtime:
        with self._lock:
            if self._runtime is None:
                self._runtime = Runtime(self._settings)
                self._accounting = install(self._runtime)
            return self._runtime

    def configure(self, settings: Mapping[str, Any]) -> Runtime:
        """Apply `compute.*` settings (`VramPolicy.update`: all validated before any applies).
        A new `compute.simulate_vram_mb` needs a new device service: the runtime is rebuilt
        with the same policy and its engines load again on next use."""
        with self._lock:
            runtime = self.runtime()
            simulate = runtime.policy.simulate_vram_mb
            runtime.policy.update(settings)
            if runtime.policy.simulate_vram_mb != simulate:
                self._replace(runtime.policy.as_dict())
            return self.runtime()

    def _replace(self, settings: Mapping[str, Any]) -> None:
        old, accounting = self._runtime, self._accounting
        assert old is not None and accounting is not None
        old.unload_engines()
        accounting.forget_all()
        log.info("Mizuoto runtime rebuilt for compute.simulate_vram_mb=%s", settings.get("compute.simulate_vram_mb"))
        self._settings = dict(settings)
        self._runtime = None
        self.runtime()

    def engine(self, engine_id: str, model_dir: str | Path | None = None, dtype: str = "float32",
               device: str = "auto") -> EngineRef:
        """Load an engine now (errors surface at the loader node) and return a reference to it."""
        ref = EngineRef(self, engine_id, model_dir, dtype, device)
        _ = ref.engine
        return ref

    def _acquire(self, key: EngineKey) -> None:
        with self._lock:
            self._refs[key] += 1

    def _release(self, key: EngineKey) -> None:
        with self._lock:
            self._refs[key] -= 1
            if self._refs[key] > 0:
                return
            del self._refs[key]
            if self._runtime is not None and self._runtime.unload_engine(*key):
                log.info("Mizuoto engine %s unloaded: ComfyUI no longer holds it", key[0])
                assert self._accounting is not None
                self._accounting.prune()


#: The process runtime of the ComfyUI pack (nodes and routes use it).
PROCESS = ProcessRuntime()


__all__ = [
    "COMFYUI", "PROCESS", "ComfyAccounting", "EngineRef", "HandleAdapter", "ProcessRuntime", "ProgressReporter",
    "comfy_device", "fallback_switch", "install", "interrupt_check", "node_request",
]
