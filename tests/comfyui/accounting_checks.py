"""ComfyUI's accounting functions over a ComfyUI `ModelPatcher` entry and our adapters (M35,
issue 17), on one simulated device shared by both managers (`shared_device.py`): each check
drives `free_memory`, `load_models_gpu` (with its clone sweep), `loaded_models(
only_currently_used=True)`, `unload_model_and_clones`, `unload_all_models` or `cleanup_models`,
so any attribute a release reads that the adapter lacks fails here as the AttributeError users
would see. Imported by `version_check.py` (each release of the version harness) and
`comfy_inprocess.py` (the labs), once ComfyUI parsed `--cpu --reserve-vram RESERVE_GB`.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import json
import sys
import traceback
from collections.abc import Callable, Iterator

import aimdo_boundary
import comfy.model_management as mm
import torch
from shared_device import CPU, MB, SharedDevice, Stack
from torch import nn

from mizuoto_runtime.app.comfy_bridge import ComfyPins, HandleAdapter
from mizuoto_runtime.memory.pinning import PinnedBudget

GB = 1 << 30
RESERVE_GB = 4  # the `--reserve-vram` both scripts start ComfyUI with
COMFYUI_ARGS = ["--cpu", "--reserve-vram", str(RESERVE_GB)]


def check_free_memory_takes_units_one_by_one() -> None:
    """A request below what a handle holds: ComfyUI's `partially_unload` path, whole units in
    reverse placement order, exactly enough, the entry kept; ComfyUI's own model untouched."""
    s = SharedDevice(mm)
    diffusion = s.comfy_model(4)
    first, second = s.handle("first"), s.handle("second")
    free = mm.get_free_memory(CPU)
    mm.free_memory(free + int(2.5 * MB), CPU, keep_loaded=[s.entry_of(diffusion)])
    streamed = [len(h.streamed_units) for h in (first, second)]
    assert sorted(streamed) == [0, 3], streamed  # one candidate gave three units, the other nothing
    assert mm.get_free_memory(CPU) == free + 3 * MB, (mm.get_free_memory(CPU), free)
    yields = [e for e in s.manager.events if e[0] == "yield"]
    assert yields and sum(e[2] for e in yields) == 3 * MB, yields
    assert sorted(s.ours(), key=id) == sorted([first, second], key=id) and diffusion.loaded_size() == 4 * MB


def check_free_memory_detaches_a_handle_asked_for_more() -> None:
    s = SharedDevice(mm)
    diffusion = s.comfy_model(4)
    handle = s.handle("tts")
    mm.free_memory(mm.get_free_memory(CPU) + handle.size_bytes + MB, CPU, keep_loaded=[s.entry_of(diffusion)])
    assert handle.device_bytes == 0 and s.ours() == [] and not handle.unloaded
    assert diffusion.loaded_size() == 4 * MB


def check_our_manager_frees_only_comfyui_models() -> None:
    """Our manager short of room: ComfyUI frees its model (every Mizuoto entry is kept); ours
    yield only after, in M30 order — here nothing of ours had to."""
    s = SharedDevice(mm)
    idle = s.handle("idle", units=4)
    diffusion = s.comfy_model(16)
    needy = s.manager.register(Stack(), engine="t", name="needy")
    deficit = needy.size_bytes - s.free()
    assert deficit > MB, deficit
    s.manager.load([needy])
    assert 16 * MB - diffusion.loaded_size() >= deficit, (diffusion.loaded_size(), deficit)
    assert idle.is_whole and needy.is_whole
    assert not [e for e in s.manager.events if e[0] == "yield"]


def check_load_models_gpu_clone_sweep_keeps_one_entry() -> None:
    """ControlNet-style reload of our entry: `detach(False)` in the sweep, one entry, units kept."""
    s = SharedDevice(mm)
    a, b = s.handle("a"), s.handle("b")
    mm.load_models_gpu([s.accounting.adapter(a)])
    assert s.ours() == [a, b] and a.is_whole and len(mm.current_loaded_models) == 2


def check_phase_end_leaves_currently_used() -> None:
    """`loaded_models(only_currently_used=True)` + `load_models_gpu` mid-sampling never pulls our
    units back once the phase ended."""
    s = SharedDevice(mm)
    diffusion = s.comfy_model(2)
    handle = s.manager.register(Stack(), engine="t", name="phase")
    s.manager.acquire([handle])
    assert s.accounting.adapter(handle) in mm.loaded_models(only_currently_used=True)
    s.manager.release([handle])
    in_use = mm.loaded_models(only_currently_used=True)
    assert s.accounting.adapter(handle) not in in_use and diffusion in in_use, in_use
    mm.free_memory(mm.get_free_memory(CPU) + handle.size_bytes + MB, CPU, keep_loaded=[s.entry_of(diffusion)])
    mm.load_models_gpu(in_use)
    assert handle.device_bytes == 0, handle


def check_ram_short_free_memory_takes_host_copies_not_units() -> None:
    """0.12-0.20 ask every eviction candidate for host RAM (`partially_unload_ram`) when RAM or
    pins are short: an idle whole-loaded handle gives its host copies (M29) and keeps its
    units; releases that ask only their dynamic models leave ours alone."""
    s = SharedDevice(mm)
    handle = s.handle("ram")
    host = handle.describe()["host_bytes"]
    asks = [name for name in ("ram_required", "pins_required")
            if name in inspect.signature(mm.free_memory).parameters]
    source = inspect.getsource(mm.free_memory)
    every_candidate = "model.partially_unload_ram(ram_to_free)" in source or \
        "model.partially_unload_ram(pins_to_free)" in source
    mm.free_memory(0, CPU, **{name: 1e30 for name in asks})  # VRAM target met: only RAM is short
    assert handle.is_whole, handle
    after = handle.describe()["host_bytes"]
    assert (after < host) is every_candidate, (asks, host, after)


def check_unload_model_and_clones_keeps_ours() -> None:
    """0.22 on: unloading one ComfyUI model and its clones by `clone_base_uuid` keeps our entries."""
    s = SharedDevice(mm)
    handle = s.handle("keep")
    diffusion = s.comfy_model(4)
    unload = getattr(mm, "unload_model_and_clones", None)
    if unload is None:
        print("(no unload_model_and_clones in this release)", file=sys.stderr)
        return
    unload(diffusion)
    assert diffusion.loaded_size() == 0 and handle.is_whole and s.ours() == [handle]


def check_unload_all_models_frees_our_handles() -> None:
    s = SharedDevice(mm)
    handles = [s.handle(name, units=4) for name in ("a", "b")]
    diffusion = s.comfy_model(4)
    mm.unload_all_models()
    assert s.devices.counted_bytes(CPU) == 0 and mm.current_loaded_models == []
    assert all(h.device_bytes == 0 and not h.unloaded for h in handles) and diffusion.loaded_size() == 0


def check_cleanup_models_drops_a_dead_handles_entry() -> None:
    s = SharedDevice(mm)
    handle = s.handle("gone")
    s.manager.unregister(handle)
    del handle
    gc.collect()
    mm.cleanup_models_gc()
    mm.cleanup_models()
    assert mm.current_loaded_models == []


def check_every_entry_answers_what_this_release_reads() -> None:
    """The fields this release reads on every patcher, called the way it calls them."""
    s = SharedDevice(mm)
    handle = s.handle("fields")
    entry = s.accounting.entry(handle)
    assert entry is not None and isinstance(entry.model, HandleAdapter)
    adapter = entry.model
    assert entry.model_memory() == handle.size_bytes and entry.model_offloaded_memory() == 0
    assert entry.model_memory_required(CPU) == 0
    if hasattr(entry, "model_mmap_residency"):
        assert entry.model_mmap_residency(free=True) == (handle.size_bytes, handle.size_bytes)
    assert adapter.is_dynamic() is False and adapter.pinned_memory_size() == 0
    assert adapter.clone_base_uuid != s.accounting.adapter(s.handle("other")).clone_base_uuid


@contextlib.contextmanager
def free_memory_calls() -> Iterator[list[dict[str, object]]]:
    """The keyword arguments of each call to ComfyUI's `free_memory` meanwhile."""
    asked: list[dict[str, object]] = []
    free_memory = mm.free_memory

    @functools.wraps(free_memory)  # the same signature: the bridge reads it
    def recorded(*args: object, **kwargs: object) -> object:
        asked.append(kwargs)
        return free_memory(*args, **kwargs)

    mm.free_memory = recorded
    try:
        yield asked
    finally:
        mm.free_memory = free_memory


def check_under_dynamic_vram_we_ask_comfyui_with_for_dynamic() -> None:
    """0.12 on, comfy-aimdo active (this release's own flag: `aimdo_allocator` in 0.12-0.13,
    `aimdo_enabled` later): our manager asks this release's `free_memory` with `for_dynamic`
    (so it leaves its dynamic models to aimdo's on-demand paging), and that frees ComfyUI's
    legacy model while every Mizuoto entry is kept. What `free_memory` then does with a dynamic
    model is the contract test's (a real dynamic patcher needs aimdo on a GPU)."""
    if "for_dynamic" not in inspect.signature(mm.free_memory).parameters:
        print("(no dynamic VRAM in this release)", file=sys.stderr)
        return
    import comfy.memory_management as memory

    flag, on = ("aimdo_enabled", True) if hasattr(memory, "aimdo_enabled") else ("aimdo_allocator", object())
    s = SharedDevice(mm)
    handle = s.handle("tts")
    legacy = s.comfy_model(4)
    before = getattr(memory, flag)
    setattr(memory, flag, on)
    try:
        with free_memory_calls() as asked:
            gained = s.accounting.free_for(CPU, 2 * MB, [handle])
    finally:
        setattr(memory, flag, before)
    assert asked and asked[0].get("for_dynamic") is True, asked
    assert legacy.loaded_size() <= 2 * MB and gained == 4 * MB - legacy.loaded_size(), (legacy.loaded_size(), gained)
    assert handle.is_whole and s.ours() == [handle]


def check_dynamic_vram_paths_with_comfy_aimdo_stubbed_at_its_library() -> None:
    """0.33 on, comfy-aimdo 0.4 (issue 23): the paths ComfyUI takes with `aimdo_enabled`, with
    only aimdo's compiled library stubbed (`aimdo_boundary.py`; its Python, ComfyUI's and ours
    real). `vbars_analyze` in 0.4's shape: what ComfyUI's own patcher adds to its free memory on
    cuda:0 is what we count as reclaimable, nothing where aimdo has no context; the `for_dynamic`
    free: ComfyUI keeps its real dynamic patcher (aimdo pages it out on demand), frees its legacy
    model for us and keeps our entries; the `is_dynamic()` guards (pin eviction, the per-node
    `reset_cast_buffers`, the prompt's model tracker) reach ComfyUI's dynamic model, never ours."""
    why = aimdo_boundary.dynamic_vram_here()
    if why:
        print(f"({why})", file=sys.stderr)
        return
    import comfy.model_patcher

    from mizuoto_runtime.app.comfy_bridge import aimdo_active, aimdo_reclaimable

    s = SharedDevice(mm)
    handle = s.handle("tts")
    legacy = s.comfy_model(4)
    cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
    with aimdo_boundary.stubbed_library({0: 3 * GB}) as library:
        assert aimdo_active()
        added = legacy.get_free_memory(cuda0) - mm.get_free_memory(cuda0)  # ComfyUI's own count
        assert added == aimdo_reclaimable(cuda0) == s.accounting.reclaimable_bytes(cuda0) == 3 * GB, added
        assert aimdo_reclaimable(cuda1) == 0  # aimdo's get_devctx raises: no context on cuda:1
        assert library.called("vbars_analyze") == [(aimdo_boundary.DEVCTX_BASE, False)] * 3, library.calls

        layers = nn.Sequential(*(nn.Linear(512, 512, bias=False) for _ in range(2)))  # 2 MiB
        dynamic = aimdo_boundary.dynamic_patcher(layers, CPU)
        mm.load_models_gpu([dynamic])
        held = dynamic.loaded_size()
        assert dynamic.is_dynamic() and held == 2 * MB, held
        with free_memory_calls() as asked:
            gained = s.accounting.free_for(CPU, 3 * MB, [handle])
        assert asked and asked[0].get("for_dynamic") is True, asked
        # ComfyUI counts its dynamic model's pages as given up on demand and frees its legacy
        # model only for the rest; the dynamic one keeps every byte.
        assert gained + held >= 3 * MB and legacy.loaded_size() == 4 * MB - gained, (gained, legacy.loaded_size())
        assert s.entry_of(dynamic) is not None and dynamic.loaded_size() == held
        assert handle.is_whole and s.ours() == [handle]

        if hasattr(mm, "models_for_pin_eviction"):  # 0.3x: pin eviction under RAM pressure
            assert list(mm.models_for_pin_eviction(None)) == [dynamic]  # never one of ours
            mm.free_pins(1 << 40, evict_active=True)
        allocated = len(library.called("hostbuf_allocate"))
        mm.reset_cast_buffers()  # after every node under aimdo: the dynamic model's pins reset
        assert len(library.called("hostbuf_allocate")) > allocated and handle.is_whole
        if hasattr(comfy.model_patcher, "PromptModelTracker"):  # 0.3x: the prompt's models
            tracker = comfy.model_patcher.PromptModelTracker()
            tracker.add([s.accounting.adapter(handle), dynamic])
            assert list(tracker.models.values()) == [dynamic]
            tracker.end()
    mm.current_loaded_models.remove(s.entry_of(dynamic))  # ComfyUI cannot unload a dynamic model off a GPU


def check_reserve_is_comfyuis_reserve_vram() -> None:
    s = SharedDevice(mm)
    assert mm.extra_reserved_memory() == RESERVE_GB * GB
    assert s.manager.reserve_bytes(torch.device("cuda", 0)) == RESERVE_GB * GB  # a real device
    assert s.manager.reserve_bytes(CPU) == 0  # the simulated device keeps the policy's


def check_out_of_memory_is_comfyuis() -> None:
    s = SharedDevice(mm)
    assert s.manager.is_oom(torch.OutOfMemoryError("x")) and not s.manager.is_oom(ValueError("x"))
    accelerator = getattr(mm, "ACCELERATOR_ERROR", None)
    if accelerator is torch.AcceleratorError:  # releases whose is_oom accepts AcceleratorError
        mm.discard_cuda_async_error = lambda: None  # no device here to clear an error on
        assert s.manager.is_oom(torch.AcceleratorError("CUDA error: out of memory"))


def check_pinned_budget_is_shared_with_comfyuis() -> None:
    if not hasattr(mm, "TOTAL_PINNED_MEMORY"):
        assert ComfyPins().free() is None  # no pinned-memory accounting in this release
        return
    # ComfyUI pinned 7 of 10; its own values come back after, or a later check's partial unload
    # would pin through CUDA on this CPU-only machine.
    saved = mm.MAX_PINNED_MEMORY, mm.TOTAL_PINNED_MEMORY
    mm.MAX_PINNED_MEMORY, mm.TOTAL_PINNED_MEMORY = 10 * MB, 7 * MB
    try:
        budget = PinnedBudget(100 * MB, ComfyPins())
        assert not budget.take(4 * MB) and budget.take(3 * MB)
        assert mm.TOTAL_PINNED_MEMORY == 10 * MB
        budget.give(3 * MB)
        assert mm.TOTAL_PINNED_MEMORY == 7 * MB and budget.used == 0
    finally:
        mm.MAX_PINNED_MEMORY, mm.TOTAL_PINNED_MEMORY = saved


CHECKS: dict[str, Callable[[], None]] = {
    name[len("check_"):]: fn for name, fn in list(globals().items()) if name.startswith("check_")
}


def report(checks: dict[str, Callable[[], None]], wanted: list[str] | None = None) -> None:
    """Run `checks` (those `wanted`, or all) and print one JSON line each: {"check", "ok", "error"}."""
    for name in wanted or list(checks):
        try:
            checks[name]()
            result = {"check": name, "ok": True, "error": ""}
        except Exception:  # noqa: BLE001 — every failure is reported to the test that asked
            result = {"check": name, "ok": False, "error": traceback.format_exc()}
        print("MIZUOTO-CHECK " + json.dumps(result), flush=True)
