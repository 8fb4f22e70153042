"""ComfyUI accounting adapter: one memory accounting for Mizuoto and ComfyUI (M35). The only
runtime module that imports `comfy` — always inside a function, so importing it never imports
ComfyUI. The host the nodes share (`ProcessRuntime`, `EngineRef`) is `host.py`; this file is
what changes when a ComfyUI release changes its protocol.

**The protocol, release by release** (read from ComfyUI's `comfy/model_management.py`,
`model_patcher.py`, `multigpu.py`, `controlnet.py`, `execution.py` and `comfy_execution/
caching.py` from v0.3.64, Oct 2025, to 0.38.1, Nov 2026; the versions the harness runs are
listed in `tests/comfyui/versions/VERSIONS.txt`). What ComfyUI calls or reads on the patcher of
every `LoadedModel` entry, and what the adapter answers:

* every release: `load_device`, `offload_device`, `parent` (None), `model` (the handle:
  ComfyUI finalizes its entry on it), `model_size`, `loaded_size`, `current_loaded_device`,
  `model_dtype`, `model_patches_models`, `model_patches_to`, `is_clone`, `partially_load`,
  `partially_unload`, `detach(unpatch_all)`, `lowvram_patch_counter`; `model.__class__` in
  log lines; `sys.getrefcount(patcher)` in `free_memory`'s sort.
* 0.11–0.20: `is_dynamic()` on every entry in `load_models_gpu` and `free_memory`;
  `partially_unload_ram(n)` on every eviction candidate when RAM or pins are short.
* 0.17–0.20: `model_mmap_residency(free=...)` (a pair: resident bytes, model bytes) on every
  entry, and `pinned_memory_size()` in `load_models_gpu`.
* 0.22 on: `clone_base_uuid` on every entry (`unload_model_and_clones`, `multigpu`), with
  `get_nested_additional_models()` on the model unloaded; `multigpu` also reads
  `is_multigpu_base_clone` (absent = False) on every `loaded_models()` patcher.
* dynamic-only paths (`dynamic_pins`, `unregister_inactive_pins`, `loaded_ram_size`,
  `reset_cast_buffers`' pin reset, the cache's `all_outputs_dynamic`) are guarded by
  `is_dynamic()`, which is False here: aimdo's allocator cannot evict our units.
* `loaded_models(only_currently_used=True)` then `load_models_gpu(those)` (ControlNet and model
  patches reload "the models in use" in the middle of sampling): our entries leave
  `currently_used` when their phase ends (`on_released`), so they are never pulled back.

**Eviction.** ComfyUI's `free_memory` / `unload_all_models` / "Unload models" evict our
components: a request smaller than what the handle holds calls `partially_unload`, which gives
back units in reverse placement order (M32) and keeps the entry; a larger one calls
`detach(True)`, which moves the whole component off the device (host copies make that free,
M25). Either way the manager records the yield (`ModelManager.record_yield`, one place).

**Asking ComfyUI for room** (`free_for`): `free_memory(get_free_memory(dev) + N, dev,
keep_loaded=...)` where `keep_loaded` lists *every* Mizuoto entry, so ComfyUI frees only its
own models; our manager then yields ours in M30 order with `engines.<id>.pinned_models`
honoured (issue 17, item 4). Under dynamic VRAM (comfy-aimdo active) the call passes
`for_dynamic=True` where the release takes it: ComfyUI then unloads only its non-dynamic
models and leaves dynamic ones (and their pinned host buffers) in place — aimdo gives their
pages up on demand when our allocations need them.

**Budgets** (issue 17, item 2): the default VRAM reserve is ComfyUI's `extra_reserved_memory()`
(which honours `--reserve-vram`); under aimdo the free memory we measure adds what aimdo would
give up (`vbars_analyze`, as ComfyUI's `ModelPatcher.get_free_memory` counts it, in each of
the three shapes comfy-aimdo 0.1, 0.2 and 0.4+ give it); an
out-of-memory is whatever ComfyUI's `is_oom` accepts; pinned host memory shares ComfyUI's
budget (`ComfyPins`). CUDA Graphs are refused while aimdo is active: its allocation hooks may
evict or remap memory while a graph is being captured, and a replay would read stale pages.

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
simulated entries; under a GPU ComfyUI it frees the GPU only. ComfyUI's own reserve is for
real devices: a simulated device keeps the policy's (0 unless set).

`model_management` has no lock: everything here runs on the thread that executes nodes.

**Node logic without ComfyUI** lives beside this module, not in `nodes/` (which imports
ComfyUI), so the contract tests check it in CI: the host the nodes share (`host.py`) and the
checkpoint listing (`checkpoints.py`).
"""
from __future__ import annotations

import inspect
import logging
import sys
import uuid
import weakref
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

from ..memory import graphs, pinning
from ..memory.handle import ModelHandle
from ..memory.manager import ModelManager
from ..memory.phases import RequestContext
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


# ---- dynamic VRAM (comfy-aimdo) ------------------------------------------------------------
def aimdo_active() -> bool:
    """Whether ComfyUI runs with dynamic VRAM. ComfyUI sets a flag in `comfy.memory_management`
    once comfy-aimdo initialized: `aimdo_enabled` (0.16 and later), `aimdo_allocator` (0.12 and
    0.13: the allocator, None when inactive). Releases before dynamic VRAM have neither."""
    memory_management = sys.modules.get("comfy.memory_management")
    if memory_management is None:
        return False
    return bool(getattr(memory_management, "aimdo_enabled", False)) or \
        getattr(memory_management, "aimdo_allocator", None) is not None


def aimdo_reclaimable(device: torch.device) -> int:
    """VRAM aimdo would give up on demand on `device`: the pages of ComfyUI's dynamic models,
    measured as ComfyUI's own dynamic patcher measures them (`ModelPatcher.get_free_memory`).
    comfy-aimdo's `model_vbar.vbars_analyze` changed shape across the releases ComfyUI pins:
    0.4 on take the device index; 0.2 take nothing and answer for the one device ComfyUI
    initialized; 0.1 only log (return None) — there the dynamic entries' resident bytes are
    counted instead, what their `loaded_size()` reports. 0 when aimdo is inactive or has no
    context on this device."""
    if device.type != "cuda" or not aimdo_active():
        return 0
    import comfy_aimdo.model_vbar

    index = device.index if device.index is not None else torch.cuda.current_device()
    analyze = getattr(comfy_aimdo.model_vbar, "vbars_analyze", None)
    try:
        if analyze is None:
            pages = None
        elif _accepts(analyze, "device"):
            pages = analyze(index)
        elif index == _comfy_device_index():
            pages = analyze()
        else:
            return 0  # this aimdo initialized ComfyUI's device only
    except RuntimeError as exc:  # the device was never initialized for aimdo
        log.debug("comfy-aimdo has no context on %s (%s): nothing to reclaim there", device, exc)
        return 0
    return int(pages) if isinstance(pages, int) else _dynamic_resident_bytes(device)


def _comfy_device_index() -> int | None:
    ours = _model_management().get_torch_device()
    return ours.index if isinstance(ours, torch.device) else None


def _dynamic_resident_bytes(device: torch.device) -> int:
    """Bytes ComfyUI's dynamic models hold on `device` (aimdo pages them out on demand)."""
    target = comfy_device(device)
    return sum(int(e.model.loaded_size()) for e in _model_management().current_loaded_models
               if e.model is not None and e.device == target and getattr(e.model, "is_dynamic", lambda: False)())


#: Why no CUDA Graph is captured inside a ComfyUI running dynamic VRAM (M24; `meta.applied` says it).
AIMDO_GRAPH_REFUSAL = ("ComfyUI's dynamic VRAM (comfy-aimdo) is active: its allocation hooks may evict or "
                       "remap memory during capture")


def _accepts(function: Any, name: str) -> bool:
    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


# ---- the adapter ---------------------------------------------------------------------------
class HandleAdapter:
    """A Mizuoto handle as ComfyUI's `model_management` sees a `ModelPatcher` (M35).

    `model` is the handle itself: weak-referenceable and alive exactly as long as the handle
    (ComfyUI finalizes its entry on it). The adapter holds the handle weakly and lives as long
    as the handle does (see `ComfyAccounting`).
    """

    parent = None  # not a clone of another patcher
    is_multigpu_base_clone = False

    def __init__(self, handle: ModelHandle, manager: ModelManager, load_device: torch.device) -> None:
        self._handle = weakref.ref(handle)
        self._manager = manager
        self.load_device = load_device
        self.offload_device = handle.devices.offload_device
        # Never equal to a ComfyUI model's: `unload_model_and_clones` unloads by this id.
        self.clone_base_uuid = uuid.uuid4()

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

    def loaded_ram_size(self) -> int:
        """Host RAM the component holds (its host copies)."""
        return sum(t.nbytes for t in self.handle.host_tensors())

    def pinned_memory_size(self) -> int:
        """Host bytes of the component in page-locked memory (M22)."""
        handle = self.handle
        return sum(t.nbytes for t in handle.host_tensors() if handle.streamer.is_pinned(t))

    def model_mmap_residency(self, free: bool = False) -> tuple[int, int]:
        """(host bytes resident in RAM, model bytes). Our host copies are ordinary RAM (or
        safetensors pages we already read), so nothing is released for `free=True`: dropping
        host copies is RAM relief (`partially_unload_ram`, M29), not an mmap's pages."""
        return self.loaded_ram_size(), self.model_size()

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

    def get_nested_additional_models(self) -> list[Any]:
        return []

    def get_additional_models(self) -> list[Any]:
        return []

    def get_additional_models_with_key(self, key: str) -> list[Any]:
        return []

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
        return self._manager.record_yield(handle, handle.partially_unload(int(memory_to_free)), [COMFYUI])

    def partially_unload_ram(self, ram_to_free: float = 0, *args: Any, **kwargs: Any) -> int:
        """ComfyUI is short of host RAM (0.11–0.20 ask every candidate): an idle whole-loaded
        component drops its host copies, the first step of M29. Bytes of RAM released."""
        handle = self._handle()
        if handle is None or ram_to_free <= 0 or kwargs.get("subsets") is not None:
            return 0  # `subsets` name a dynamic model's pin pools; we have none
        return handle.drop_host_copies()

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
        self._manager.record_yield(handle, handle.offload(), [COMFYUI])
        return handle

    def __repr__(self) -> str:
        handle = self._handle()
        return f"HandleAdapter({self._manager.key(handle) if handle else 'released'})"


# ---- pinned memory -------------------------------------------------------------------------
class ComfyPins:
    """ComfyUI's pinned-memory accounting as the outside share of our pinned budget (M21).

    ComfyUI (from Oct 2025) pins within `MAX_PINNED_MEMORY` and counts what it pinned in
    `TOTAL_PINNED_MEMORY`, a module global its `pin_memory` and `ensure_pin_registerable` read.
    Our pinner takes a region only if it also fits in what ComfyUI has left, and adds it to
    ComfyUI's total while held (and takes it off when released), so each side sees the other's
    pins and together they never go past ComfyUI's limit. Releases without pinned-memory
    accounting, and ComfyUI with pinning off (`MAX_PINNED_MEMORY <= 0`), leave our own budget alone.
    """

    def free(self) -> int | None:
        mm = _model_management()
        limit = getattr(mm, "MAX_PINNED_MEMORY", None)
        if limit is None or limit <= 0:
            return None
        return max(0, int(limit - mm.TOTAL_PINNED_MEMORY))

    def add(self, nbytes: int) -> None:
        mm = _model_management()
        if getattr(mm, "MAX_PINNED_MEMORY", 0) > 0:
            mm.TOTAL_PINNED_MEMORY += nbytes


# ---- the accounting ------------------------------------------------------------------------
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

    def on_released(self, handles: Sequence[ModelHandle]) -> None:
        """A phase ended: its entries are no longer "currently used" (see the module doc)."""
        for handle in handles:
            entry = self.entry(handle)
            if entry is not None and not handle.in_use:
                entry.currently_used = False

    def free_for(self, device: torch.device, nbytes: int, keep: Sequence[ModelHandle]) -> int:
        """Ask ComfyUI to free `nbytes` on `device` from its own models only (every Mizuoto
        entry is kept: the manager yields ours in M30 order). Bytes gained on our device,
        counting what aimdo would give up on demand."""
        mm = _model_management()
        self.prune()
        target = comfy_device(device)
        ours = [e for e in mm.current_loaded_models if isinstance(e.model, HandleAdapter)]
        before = self.free_bytes(device)
        options: dict[str, Any] = {}
        if aimdo_active() and _accepts(mm.free_memory, "for_dynamic"):
            options["for_dynamic"] = True  # dynamic models keep their pages and pinned buffers
        mm.free_memory(mm.get_free_memory(target) + nbytes, target, keep_loaded=ours, **options)
        return max(0, self.free_bytes(device) - before)

    def free_bytes(self, device: torch.device) -> int:
        return self.manager.devices.free_bytes(device) + self.reclaimable_bytes(device)

    def reclaimable_bytes(self, device: torch.device) -> int:
        """VRAM that is used but that aimdo gives up on demand (counted as free, M6.2)."""
        return aimdo_reclaimable(device) if not self.manager.devices.is_simulated(device) else 0

    def reserve_bytes(self, device: torch.device) -> int | None:
        """ComfyUI's own reserve (`extra_reserved_memory()`: ~400 MB on Linux, 600–700 MB on
        Windows, or the user's `--reserve-vram`) for a real device; None on the simulated one."""
        if self.manager.devices.is_simulated(device):
            return None
        return int(_model_management().extra_reserved_memory())

    def is_oom(self, exc: BaseException) -> bool:
        """ComfyUI's `is_oom` (newer releases also accept `torch.AcceleratorError` OOMs)."""
        mm = _model_management()
        check = getattr(mm, "is_oom", None)
        if check is not None:
            return bool(check(exc))
        return isinstance(exc, getattr(mm, "OOM_EXCEPTION", torch.OutOfMemoryError))

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
    """Join `runtime`'s manager to ComfyUI's accounting (M35), its pinned budget to ComfyUI's
    (M21), and refuse CUDA Graphs while dynamic VRAM is active (M24)."""
    accounting = ComfyAccounting(runtime.manager)
    runtime.manager.external = accounting
    pinning.share_budget(ComfyPins())
    graphs.refuse_capture(AIMDO_GRAPH_REFUSAL if aimdo_active() else None)
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


__all__ = [
    "COMFYUI", "ComfyAccounting", "ComfyPins", "HandleAdapter", "ProgressReporter", "aimdo_active",
    "aimdo_reclaimable", "comfy_device", "install", "interrupt_check", "node_request",
]
