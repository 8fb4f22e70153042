"""The ComfyUI bridge's contract (M35, M50), checked without ComfyUI.

**STAND-IN, NOT ComfyUI.** ComfyUI is not installed in CI, so these tests run the bridge against
`StandIn`, a small restatement — written for these tests, not copied — of what ComfyUI's
`comfy/model_management.py` (v0.3.64, commit a125cd84) does with a patcher: `LoadedModel`
entries holding weak references, `free_memory`'s absolute target and eviction order (most
offloaded first, then smallest; the real one also ranks by reference count in between),
`model_unload`'s partial-then-detach rule, `load_models_gpu`'s clone sweep, and
`unload_all_models`. The stand-in's ComfyUI model allocates on the same simulated device
(M55) as our handles, so both managers see one device. The same behaviour is checked against
a real ComfyUI in `tests/comfyui/` when `COMFYUI_PATH` is set.
"""
from __future__ import annotations

import gc
import subprocess
import sys
import types
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from mizuoto_runtime import DeviceService, ModelHandle, ModelManager, SettingError, VramPolicy
from mizuoto_runtime.app.comfy_bridge import (
    COMFYUI,
    ComfyAccounting,
    HandleAdapter,
    comfy_device,
    install,
    node_request,
)
from mizuoto_runtime.app.host import ProcessRuntime, fallback_switch
from mizuoto_runtime.engines import Codes, Sampling
from mizuoto_runtime.memory import graphs, pinning

MB = 1 << 20
CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[2]


# ---- STAND-IN of ComfyUI's model-management protocol ------------------------------------------
class StandInLoadedModel:
    """Stand-in for ComfyUI's `LoadedModel`: a weak reference to a patcher, and its device."""

    def __init__(self, patcher: Any) -> None:
        self._patcher = weakref.ref(patcher)
        self.device = patcher.load_device
        self.real_model: Any = None
        self.model_finalizer: Any = None
        self.currently_used = True

    @property
    def model(self) -> Any:
        return self._patcher()

    def model_memory(self) -> int:
        return self.model.model_size()

    def model_offloaded_memory(self) -> int:
        return self.model.model_size() - self.model.loaded_size()

    def model_unload(self, memory_to_free: float | None = None, unpatch_weights: bool = True) -> bool:
        """Partial unload when the shortfall is below what is loaded and it frees enough; else detach."""
        if memory_to_free is not None and memory_to_free < self.model.loaded_size():
            if self.model.partially_unload(self.model.offload_device, memory_to_free) >= memory_to_free:
                return False
        self.model.detach(unpatch_weights)
        self.model_finalizer.detach()
        self.model_finalizer = None
        self.real_model = None
        return True

    def __eq__(self, other: object) -> bool:
        return self.model is getattr(other, "model", None)

    __hash__ = None  # type: ignore[assignment]  # like the original: compared, never hashed

    def is_dead(self) -> bool:
        return self.real_model is not None and self.real_model() is not None and self.model is None


class StandInPatcher:
    """Stand-in for a ComfyUI model (a `ModelPatcher`) placed on the shared simulated device."""

    def __init__(self, devices: DeviceService, size: int) -> None:
        self.model = nn.Linear(4, 4)  # the weak-referenceable "real model"
        self.devices, self.size, self.loaded = devices, size, 0
        self.load_device = self.offload_device = CPU
        self.parent = None

    def model_size(self) -> int:
        return self.size

    def loaded_size(self) -> int:
        return self.loaded

    def current_loaded_device(self) -> torch.device:
        return CPU

    def model_patches_models(self) -> list[Any]:
        return []

    def model_patches_to(self, device_or_dtype: Any) -> None:
        pass

    def model_dtype(self) -> torch.dtype:
        return torch.float32

    def is_clone(self, other: Any) -> bool:
        return getattr(other, "model", None) is self.model

    def partially_load(self, device: torch.device, extra_memory: float = 0, force_patch_weights: bool = False) -> int:
        more = int(min(extra_memory, self.size - self.loaded))
        self.devices.allocate(CPU, more)
        self.loaded += more
        return more

    def partially_unload(self, device_to: torch.device, memory_to_free: float = 0) -> int:
        return 0  # like a ComfyUI model without lowvram-capable layers: it detaches whole

    def detach(self, unpatch_all: bool = True) -> Any:
        if unpatch_all:
            self.devices.release(CPU, self.loaded)
            self.loaded = 0
        return self.model


class StandInAcceleratorError(RuntimeError):
    """Stand-in for `torch.AcceleratorError` (what a CUDA OOM raises from some kernels)."""


class StandInInterrupt(Exception):
    """Stand-in for ComfyUI's `InterruptProcessingException`."""


class StandIn:
    """Stand-in `comfy.model_management` and `comfy.utils` over one simulated device."""

    def __init__(self, devices: DeviceService) -> None:
        self.devices = devices
        self.current_loaded_models: list[StandInLoadedModel] = []
        self.LoadedModel = StandInLoadedModel
        self.InterruptProcessingException = StandInInterrupt
        self.interrupted = False
        self.bars: list[StandInProgressBar] = []
        self.free_calls: list[tuple[float, list[Any], bool]] = []  # what each free_memory was asked
        self.reserved = 400 * MB  # `extra_reserved_memory()`: ComfyUI's, or `--reserve-vram`

    def extra_reserved_memory(self) -> int:
        return self.reserved

    def is_oom(self, e: BaseException) -> bool:
        """Like the newest ComfyUI: torch's OOM, or an accelerator error that says out of memory."""
        return isinstance(e, torch.OutOfMemoryError) or (
            isinstance(e, StandInAcceleratorError) and "out of memory" in str(e).lower())

    def get_torch_device(self) -> torch.device:
        return CPU

    def get_free_memory(self, dev: torch.device | None = None, torch_free_too: bool = False) -> Any:
        free = self.devices.free_bytes(CPU)
        return (free, 0) if torch_free_too else free

    def cleanup_models(self) -> None:
        self.current_loaded_models[:] = [e for e in self.current_loaded_models
                                         if e.real_model is None or e.real_model() is not None]

    def free_memory(self, memory_required: float, device: torch.device, keep_loaded: list[Any] = [],  # noqa: B006
                    for_dynamic: bool = False) -> list[Any]:
        """`memory_required` is the absolute free-memory target, re-measured before each candidate.
        (Dynamic models, which `for_dynamic` spares in the newest releases, the stand-in has none.)"""
        self.free_calls.append((memory_required, list(keep_loaded), for_dynamic))
        candidates = []
        for i, e in enumerate(self.current_loaded_models):
            if e.device == device and e not in keep_loaded and not e.is_dead():
                candidates.append((-e.model_offloaded_memory(), e.model_memory(), i))
                e.currently_used = False
        unloaded = []
        for *_, i in sorted(candidates):
            free = self.get_free_memory(device)
            if free > memory_required:
                break
            if self.current_loaded_models[i].model_unload(memory_required - free):
                unloaded.append(i)
        return [self.current_loaded_models.pop(i) for i in sorted(unloaded, reverse=True)]

    def load_models_gpu(self, models: list[Any]) -> None:
        """The clone sweep (`detach(False)` of every entry of the same model) and a load within
        the free memory; no `free_memory` call (as on a CPU device)."""
        for patcher in models:
            entry = (next((e for e in self.current_loaded_models if e.model is patcher), None)
                     or StandInLoadedModel(patcher))
            for old in [e for e in self.current_loaded_models if patcher.is_clone(e.model)]:
                self.current_loaded_models.remove(old)
                old.model.detach(False)
                old.model_finalizer.detach()
            patcher.partially_load(patcher.load_device, self.get_free_memory(patcher.load_device))
            entry.real_model = weakref.ref(patcher.model)
            entry.model_finalizer = weakref.finalize(patcher.model, self.cleanup_models)
            self.current_loaded_models.insert(0, entry)

    def unload_all_models(self) -> None:
        self.free_memory(1e30, self.get_torch_device())

    def throw_exception_if_processing_interrupted(self) -> None:
        if self.interrupted:
            self.interrupted = False
            raise StandInInterrupt()

    def progress_bar(self, total: int) -> StandInProgressBar:
        bar = StandInProgressBar(total)
        self.bars.append(bar)
        return bar


class StandInProgressBar:
    """Stand-in for `comfy.utils.ProgressBar` (without the server's interruption hook)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.values: list[int] = []

    def update_absolute(self, value: int, total: int | None = None) -> None:
        self.values.append(min(value, self.total))


def joined(settings: dict[str, Any]) -> ProcessRuntime:
    """The pack's process runtime, joined to the stand-in's accounting."""
    return ProcessRuntime(settings, join=install)


@pytest.fixture
def devices() -> DeviceService:
    return DeviceService(simulate={"cpu": 16 * MB}, strict=True)


@pytest.fixture
def comfy(devices: DeviceService, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    """Installs the stand-in as `comfy`, `comfy.model_management` and `comfy.utils`."""
    stand_in = StandIn(devices)
    mm = types.ModuleType("comfy.model_management")
    for name in ("current_loaded_models", "LoadedModel", "InterruptProcessingException", "get_torch_device",
                 "get_free_memory", "cleanup_models", "free_memory", "load_models_gpu", "unload_all_models",
                 "throw_exception_if_processing_interrupted", "extra_reserved_memory", "is_oom"):
        setattr(mm, name, getattr(stand_in, name))
    mm.MAX_PINNED_MEMORY, mm.TOTAL_PINNED_MEMORY = -1, 0  # ComfyUI's pinned accounting (pinning off)
    utils = types.ModuleType("comfy.utils")
    utils.ProgressBar = stand_in.progress_bar  # type: ignore[attr-defined]
    package = types.ModuleType("comfy")
    package.model_management, package.utils = mm, utils  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "comfy", package)
    monkeypatch.setitem(sys.modules, "comfy.model_management", mm)
    monkeypatch.setitem(sys.modules, "comfy.utils", utils)
    yield stand_in
    pinning.share_budget(None)  # `install` shared the process's pinned budget with the stand-in


# ---- our side ---------------------------------------------------------------------------------
class Stack(nn.Module):
    """A small fixed part (the norm) and `n` units of exactly 1 MiB (M11–M14)."""

    def __init__(self, n: int = 6, dim: int = 512) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(n))


@pytest.fixture
def manager(devices: DeviceService) -> ModelManager:
    return ModelManager(devices, VramPolicy({"compute.vram_mode": "normal"}))


@pytest.fixture
def accounting(manager: ModelManager, comfy: StandIn) -> ComfyAccounting:
    accounting = ComfyAccounting(manager)
    manager.external = accounting
    return accounting


def place(manager: ModelManager, name: str, units: int = 6) -> ModelHandle:
    handle = manager.register(Stack(units), engine="t", name=name)
    manager.load([handle])
    return handle


def ours(comfy: StandIn) -> list[ModelHandle]:
    """The handles behind our entries in the stand-in's list, newest first."""
    return [e.model.model for e in comfy.current_loaded_models if isinstance(e.model, HandleAdapter)]


def comfy_model(comfy: StandIn, devices: DeviceService, size: int) -> StandInPatcher:
    patcher = StandInPatcher(devices, size)
    comfy.load_models_gpu([patcher])
    assert patcher.loaded == size
    return patcher


# ---- the adapter's protocol -------------------------------------------------------------------
def test_adapter_speaks_the_patcher_protocol_of_old_and_new_comfyui(manager: ModelManager,
                                                                     accounting: ComfyAccounting) -> None:
    handle = place(manager, "a")
    adapter = accounting.adapter(handle)
    assert adapter.model is handle and weakref.ref(adapter.model)() is handle
    assert adapter.load_device == CPU and adapter.offload_device == CPU and adapter.parent is None
    assert adapter.model_size() == handle.size_bytes
    assert adapter.loaded_size() == handle.device_bytes == handle.size_bytes
    assert adapter.current_loaded_device() == CPU
    assert adapter.model_dtype() == torch.float32
    assert adapter.model_patches_models() == [] and adapter.model_patches_to(CPU) is None
    assert adapter.lowvram_patch_counter() == 0
    other = accounting.adapter(place(manager, "b"))
    assert adapter.is_clone(adapter) and not adapter.is_clone(other)
    # 0.11 on (dynamic VRAM): never dynamic; a dynamic model's pin pools (`subsets`) we have none of.
    assert adapter.is_dynamic() is False
    assert adapter.partially_unload_ram(1 << 30, subsets=["weights"]) == 0
    # Honest host figures: the host copies are kept (M25), none of them pinned on the simulated device.
    assert adapter.loaded_ram_size() == handle.size_bytes and adapter.pinned_memory_size() == 0
    # 0.17–0.20: (resident host bytes, model bytes); nothing is released for free=True.
    assert adapter.model_mmap_residency(free=True) == (handle.size_bytes, handle.size_bytes)
    assert handle.describe()["host_bytes"] == handle.size_bytes
    # 0.22 on: unload_model_and_clones and multigpu read these on every entry.
    assert adapter.clone_base_uuid != other.clone_base_uuid and adapter.is_multigpu_base_clone is False
    assert adapter.get_nested_additional_models() == [] and adapter.get_additional_models() == []


def test_each_placement_registers_the_handle_once_at_the_front(manager: ModelManager, comfy: StandIn,
                                                               accounting: ComfyAccounting) -> None:
    a = place(manager, "a")
    b = place(manager, "b")
    assert ours(comfy) == [b, a]
    accounting.on_placed([a])
    accounting.on_placed([a])  # re-registering twice leaves one entry
    assert ours(comfy) == [a, b]
    entry = accounting.entry(a)
    assert entry is not None and entry.currently_used and entry.real_model() is a and entry.model_finalizer.alive


def test_comfyui_takes_exactly_enough_units_and_keeps_the_entry(manager: ModelManager, comfy: StandIn,
                                                                accounting: ComfyAccounting) -> None:
    handle = place(manager, "a")
    free = comfy.get_free_memory(CPU)
    comfy.free_memory(free + int(2.5 * MB), CPU)  # part of our size
    # Units leave in reverse placement order until 2.5 MiB are covered: three whole units (M32).
    assert len(handle.streamed_units) == 3 and handle.loaded_bytes == handle.size_bytes - 3 * MB
    assert comfy.get_free_memory(CPU) == free + 3 * MB
    assert ours(comfy) == [handle]  # the entry is kept, with honest sizes
    assert accounting.adapter(handle).loaded_size() == handle.device_bytes
    assert handle.partial_reason == "yielded for another component" and COMFYUI in handle.gave_up_for  # M50
    assert ("yield", "t:a", 3 * MB) in manager.events


def test_a_larger_request_detaches_the_whole_handle(manager: ModelManager, comfy: StandIn,
                                                    accounting: ComfyAccounting) -> None:
    handle = place(manager, "a")
    comfy.free_memory(comfy.get_free_memory(CPU) + handle.size_bytes + MB, CPU)
    assert handle.device_bytes == 0 and ours(comfy) == []
    assert handle.describe()["host_bytes"] == handle.size_bytes  # host copies kept: placing again is free (M25)
    manager.load([handle])
    assert handle.is_whole and ours(comfy) == [handle]


def test_our_manager_evicts_comfyui_models_not_our_handle_in_use(manager: ModelManager, comfy: StandIn,
                                                                  devices: DeviceService,
                                                                  accounting: ComfyAccounting) -> None:
    busy = manager.register(Stack(), engine="t", name="busy")
    manager.acquire([busy])  # in use by a request (M31)
    diffusion = comfy_model(comfy, devices, 8 * MB)
    assert devices.free_bytes(CPU) < 6 * MB
    needy = manager.register(Stack(), engine="t", name="needy")
    manager.load([needy])
    assert diffusion.loaded == 0 and not any(e.model is diffusion for e in comfy.current_loaded_models)
    assert busy.is_whole and needy.is_whole
    assert ours(comfy) == [needy, busy]
    assert not [e for e in manager.events if e[0] == "yield"]  # ComfyUI's model made the room
    manager.release([busy])


def test_comfyui_never_evicts_a_handle_in_use(manager: ModelManager, comfy: StandIn,
                                              accounting: ComfyAccounting) -> None:
    busy = place(manager, "busy")
    idle = place(manager, "idle")
    manager.acquire([busy])
    comfy.unload_all_models()  # no keep_loaded: the adapter itself refuses (M35)
    assert busy.is_whole and idle.device_bytes == 0
    assert accounting.adapter(busy).partially_unload(CPU, MB) == 0
    manager.release([busy])
    manager.load([busy])  # the next phase registers it again
    assert ours(comfy) == [busy]


def test_unload_models_frees_every_idle_handle(manager: ModelManager, comfy: StandIn, devices: DeviceService,
                                               accounting: ComfyAccounting) -> None:
    handles = [place(manager, name, units=4) for name in ("a", "b", "c")]
    comfy.unload_all_models()
    assert devices.counted_bytes(CPU) == 0 and ours(comfy) == []
    assert all(h.device_bytes == 0 and not h.unloaded for h in handles)


def test_comfyui_reloading_our_entry_keeps_units_and_one_entry(manager: ModelManager, comfy: StandIn,
                                                               accounting: ComfyAccounting) -> None:
    """ControlNet-style code reloads `loaded_models()` with `load_models_gpu`: the clone sweep
    detaches with `unpatch_all=False` (units stay) and `partially_load` stays within free memory."""
    handle = place(manager, "a")
    comfy.free_memory(comfy.get_free_memory(CPU) + int(2.5 * MB), CPU)
    comfy.load_models_gpu([accounting.adapter(handle)])
    assert handle.is_whole and ours(comfy) == [handle]


def test_partially_load_never_goes_beyond_free_memory(manager: ModelManager, comfy: StandIn,
                                                      devices: DeviceService, accounting: ComfyAccounting) -> None:
    handle = place(manager, "a")
    adapter = accounting.adapter(handle)
    handle.offload()
    devices.allocate(CPU, 13 * MB)  # 3 MiB left
    placed = adapter.partially_load(CPU, 1e32)
    assert 0 < placed <= 3 * MB and handle.is_partial
    assert adapter.partially_load(CPU, 0.1) == 0  # ComfyUI's "no VRAM" budget
    devices.release(CPU, 13 * MB)


def test_an_entry_goes_when_its_handle_is_unloaded_or_collected(manager: ModelManager, comfy: StandIn,
                                                                accounting: ComfyAccounting) -> None:
    spent = place(manager, "spent")
    gone = place(manager, "gone")
    manager.unregister(spent)  # spent: unloaded, still referenced here
    accounting.prune()
    assert ours(comfy) == [gone]
    manager.unregister(gone)
    del gone
    gc.collect()
    assert comfy.current_loaded_models == []  # ComfyUI's own finalizer on the handle


def test_free_for_reports_what_our_device_gained(manager: ModelManager, comfy: StandIn, devices: DeviceService,
                                                 accounting: ComfyAccounting) -> None:
    diffusion = comfy_model(comfy, devices, 5 * MB)
    keep = place(manager, "keep")
    assert accounting.free_for(CPU, MB, [keep]) == 5 * MB
    assert keep.is_whole and diffusion.loaded == 0


# ---- the process runtime and node requests ----------------------------------------------------
def test_configure_validates_and_rebuilds_for_a_new_simulated_device(comfy: StandIn) -> None:
    process = joined({"compute.simulate_vram_mb": 32})
    ref = process.engine("demo")
    first, old_handles = process.runtime(), ref.engine.handles()
    assert isinstance(first.manager.external, ComfyAccounting)
    with pytest.raises(SettingError, match="compute.vram_mod"):
        process.configure({"compute.vram_mod": "low"})
    assert process.configure({"compute.vram_mode": "low"}) is first and first.policy.vram_mode == "low"
    second = process.configure({"compute.simulate_vram_mb": 48})
    assert second is not first and second.devices.total_bytes(CPU) == 48 * MB
    assert second.policy.vram_mode == "low" and isinstance(second.manager.external, ComfyAccounting)
    assert all(h.unloaded for h in old_handles) and ours(comfy) == []
    assert ref.engine.manager is second.manager  # loaded again in the new runtime


def test_an_engine_lives_as_long_as_comfyui_holds_a_reference(comfy: StandIn) -> None:
    process = joined({"compute.simulate_vram_mb": 32})
    first, second = process.engine("demo"), process.engine("demo")
    handles = first.engine.handles()
    assert second.engine is first.engine
    del first
    assert process.runtime().describe()["models"]  # still referenced
    del second
    gc.collect()
    assert process.runtime().describe()["models"] == [] and all(h.unloaded for h in handles)


def test_node_requests_drive_the_progress_bar_and_honour_interrupt(comfy: StandIn) -> None:
    runtime = joined({"compute.simulate_vram_mb": 32}).runtime()
    engine = runtime.engine("demo")
    voice = engine.voice_prompt(node_request(runtime), None, None, None)
    sampling = Sampling(seed=3, max_new_tokens=40)
    engine.generate(node_request(runtime, 3), "hi", voice, sampling)
    bar = comfy.bars[-1]
    assert bar.total == engine.frames_for("hi", sampling) and bar.values == sorted(bar.values) and len(bar.values) > 8

    calls = 0

    def interrupt_later(done: int, total: int) -> None:
        nonlocal calls
        calls += 1
        comfy.interrupted = calls == 5

    ctx = node_request(runtime, 3)
    ctx.on_progress = interrupt_later
    with pytest.raises(StandInInterrupt):
        engine.generate(ctx, "a longer text to be interrupted", voice, sampling)
    assert calls == 5 and all(h.in_use == 0 for h in engine.handles())


@pytest.mark.parametrize(("oom_fallback", "toggle", "falls_back"), [
    (False, True, True),    # the node's toggle allows it although the setting is off
    (True, False, True),    # toggle off: the setting decides
    (False, False, False),  # neither: the out-of-memory error reaches the node
])
def test_a_decoder_nodes_toggle_allows_the_fallback_and_off_defers_to_the_setting(
        comfy: StandIn, oom_fallback: bool, toggle: bool, falls_back: bool) -> None:
    """M44: the decoder and TTS nodes pass `fallback_switch(allow_fallback)` to the engine."""
    runtime = joined({"compute.simulate_vram_mb": 32, "compute.oom_fallback": oom_fallback}).runtime()
    engine = runtime.engine("demo")
    codes = Codes(torch.randint(0, 256, (1, 400)), engine.id)  # more frames than one 256-frame tile
    decoder = engine.decoder.module
    whole = decoder.forward

    def out_of_memory_when_whole(tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[-1] > 300:
            raise torch.OutOfMemoryError("test: a whole decode does not fit")
        return whole(tokens)

    decoder.forward = out_of_memory_when_whole  # type: ignore[method-assign]
    ctx = node_request(runtime)
    if not falls_back:
        with pytest.raises(torch.OutOfMemoryError):
            engine.decode(ctx, codes, fallback_switch(toggle))
        return
    audio = engine.decode(ctx, codes, fallback_switch(toggle))
    assert ctx.meta["applied"]["fallbacks"] == ["tiled_1d"] and audio.waveform.shape[-1] == 400 * 256


def test_install_joins_a_runtime_to_comfyui(comfy: StandIn) -> None:
    from mizuoto_runtime import Runtime

    runtime = Runtime({"compute.simulate_vram_mb": 32})
    accounting = install(runtime)
    audio, _ = runtime.say(runtime.engine("demo"), "hello", sampling=Sampling(max_new_tokens=16))
    assert runtime.manager.external is accounting and audio.waveform.numel() > 0
    registered = ours(comfy)
    assert registered and all(h.device_bytes for h in registered)


def test_engines_built_inside_comfyuis_inference_mode_still_run(comfy: StandIn) -> None:
    """ComfyUI runs every node under `torch.inference_mode()`; placement swaps `Parameter.data`."""
    process = joined({"compute.simulate_vram_mb": 32})
    with torch.inference_mode():
        ref = process.engine("demo")
        audio, _ = ref.runtime.say(ref.engine, "inference mode", sampling=Sampling(max_new_tokens=16))
    assert audio.waveform.abs().sum() > 0


def test_entries_use_comfyuis_device_object(comfy: StandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries match devices with `==` and `cuda` is not `cuda:0`: ComfyUI's object is used."""
    comfy_cuda = torch.device("cuda", 0)
    monkeypatch.setattr(sys.modules["comfy.model_management"], "get_torch_device", lambda: comfy_cuda)
    assert comfy_device(torch.device("cuda")) is comfy_cuda and comfy_device(torch.device("cuda", 0)) is comfy_cuda
    assert comfy_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert comfy_device(CPU) == CPU


def test_the_pack_entry_does_nothing_outside_comfyui() -> None:
    """pytest imports the repository root's `__init__.py` (the package holding `tests/`)."""
    code = ("import importlib.util, sys; "
            "spec = importlib.util.spec_from_file_location('pack', 'REPO/__init__.py', "
            "submodule_search_locations=['REPO']); "
            "pack = importlib.util.module_from_spec(spec); spec.loader.exec_module(pack); "
            "assert pack.WEB_DIRECTORY == './web' and callable(pack.comfy_entrypoint); "
            "assert not [m for m in sys.modules if m.split('.')[0] in ('comfy', 'comfy_api', 'server', 'aiohttp')]"
            ).replace("REPO", str(REPO))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_importing_the_runtime_never_imports_comfy() -> None:
    code = ("import sys, mizuoto_runtime, mizuoto_runtime.app.comfy_bridge; "
            "assert not [m for m in sys.modules if m == 'comfy' or m.startswith('comfy.')], 'comfy imported'")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# ---- ComfyUI's budgets are ours inside ComfyUI (issue 17, items 2-5) --------------------------
def test_the_default_reserve_is_comfyuis_reserve_vram(manager: ModelManager, comfy: StandIn,
                                                      accounting: ComfyAccounting) -> None:
    """A user who starts ComfyUI with `--reserve-vram 4` gets 4 GB reserved, not our 400 MB."""
    cuda = torch.device("cuda", 0)
    comfy.reserved = 4 << 30
    assert manager.reserve_bytes(cuda) == 4 << 30
    assert manager.reserve_bytes(CPU) == 0  # the simulated device keeps the policy's own
    manager.policy.update({"compute.vram_reserve_mb": 100})  # a value the user set wins
    assert manager.reserve_bytes(cuda) == 100 * MB
    manager.external = None
    manager.policy.update({"compute.vram_reserve_mb": None})
    assert manager.reserve_bytes(cuda) == 400 * MB  # outside ComfyUI: the default


def test_pinned_memory_shares_comfyuis_budget(comfy: StandIn) -> None:
    """Ours and ComfyUI's pins together never pass ComfyUI's MAX_PINNED_MEMORY; each side's
    total counts the other's."""
    from mizuoto_runtime.app.comfy_bridge import ComfyPins

    mm = sys.modules["comfy.model_management"]
    assert ComfyPins().free() is None  # ComfyUI's pinning off (-1): our own budget alone
    budget = pinning.PinnedBudget(64 * MB, ComfyPins())
    assert budget.take(40 * MB) and mm.TOTAL_PINNED_MEMORY == 0  # nothing counted while off
    budget.give(40 * MB)
    mm.MAX_PINNED_MEMORY, mm.TOTAL_PINNED_MEMORY = 16 * MB, 10 * MB  # ComfyUI pinned 10 of 16 MB
    assert not budget.take(7 * MB)  # within our 64 MB, beyond what ComfyUI has left
    assert budget.take(6 * MB) and mm.TOTAL_PINNED_MEMORY == 16 * MB and ComfyPins().free() == 0
    budget.give(6 * MB)
    assert mm.TOTAL_PINNED_MEMORY == 10 * MB and budget.used == 0
    # The process's pinners are joined once a runtime is installed into ComfyUI.
    shared = pinning.PinnedBudget(64 * MB)
    assert shared.take(MB)
    pinning._attach(shared, ComfyPins())
    assert mm.TOTAL_PINNED_MEMORY == 11 * MB
    pinning._attach(shared, None)
    assert mm.TOTAL_PINNED_MEMORY == 10 * MB


def test_an_accelerator_error_oom_gets_the_exact_retry(manager: ModelManager, comfy: StandIn,
                                                       accounting: ComfyAccounting) -> None:
    """M40 inside ComfyUI: whatever `is_oom` accepts is retried exactly, with the same numbers."""
    handle = manager.register(Stack(), engine="t", name="a")
    attempts: list[torch.Tensor] = []
    gen = torch.Generator().manual_seed(5)

    def phase() -> torch.Tensor:
        attempts.append(torch.rand(3, generator=gen))
        if len(attempts) == 1:
            raise StandInAcceleratorError("CUDA error: out of memory")
        return attempts[-1]

    ctx = manager.request()
    out = ctx.run("p", [handle], phase, generators=[gen])
    assert torch.equal(out, attempts[0]) and ctx.meta["applied"]["oom_retries"] == 1
    with pytest.raises(StandInAcceleratorError, match="illegal"):  # not an OOM: no retry
        manager.request().run("p", [handle], lambda: (_ for _ in ()).throw(StandInAcceleratorError("illegal")))
    manager.external = None  # outside ComfyUI the same error is not an OOM
    with pytest.raises(StandInAcceleratorError):
        manager.request().run("p", [handle], lambda: (_ for _ in ()).throw(StandInAcceleratorError("out of memory")))


@pytest.mark.parametrize(("mode", "evicts"), [("none", False), ("low", False), ("normal", True)])
def test_needed_is_what_the_mode_places(devices: DeviceService, comfy: StandIn, mode: str, evicts: bool) -> None:
    """M6, issue 17 item 5: a TTS phase streaming in `none` (or `low`) mode asks only for what it
    will place, so the user's diffusion model stays; `normal` asks for the whole component."""
    manager = ModelManager(devices, VramPolicy({"compute.vram_mode": mode}))
    manager.external = ComfyAccounting(manager)
    diffusion = comfy_model(comfy, devices, 8 * MB)
    tts = manager.register(Stack(12), engine="t", name="talker")  # 12 MiB: whole does not fit beside it
    manager.load([tts])
    assert (diffusion.loaded == 0) is evicts, (mode, diffusion.loaded)
    assert tts.is_whole is evicts and tts.device_bytes <= devices.total_bytes(CPU) - diffusion.loaded


def test_a_capped_handle_asks_for_its_cap(manager: ModelManager, comfy: StandIn, devices: DeviceService,
                                          accounting: ComfyAccounting) -> None:
    tts = manager.register(Stack(12), engine="t", name="talker")
    tts.cap_bytes = 4 * MB  # after an OOM (M40)
    diffusion = comfy_model(comfy, devices, 8 * MB)
    manager.load([tts])
    assert diffusion.loaded == 8 * MB and tts.loaded_bytes <= 4 * MB


def test_comfyui_frees_only_its_own_models_then_ours_yield_in_m30_order(devices: DeviceService,
                                                                        comfy: StandIn) -> None:
    """Issue 17 item 4: every Mizuoto entry is in `keep_loaded`; our manager then yields ours —
    unpinned before pinned (`engines.<id>.pinned_models`) — and records each yield once."""
    manager = ModelManager(devices, VramPolicy({"engines.t.pinned_models": ["pinned"]}))
    manager.external = ComfyAccounting(manager)
    pinned = place(manager, "pinned", units=4)
    unpinned = place(manager, "unpinned", units=4)
    diffusion = comfy_model(comfy, devices, 2 * MB)
    needy = manager.register(Stack(8), engine="t", name="needy")
    manager.load([needy])
    _, keep, _ = comfy.free_calls[-1]
    assert {id(e.model.model) for e in keep} == {id(pinned), id(unpinned)}  # ours, all of them
    assert diffusion.loaded == 0 and needy.is_whole
    yields = [e for e in manager.events if e[0] == "yield"]
    assert yields and yields[0][1] == "t:unpinned", yields  # M30's second key
    assert pinned.is_whole or unpinned.device_bytes == 0
    assert unpinned.gave_up_for == ["t:needy"] and len(yields) == len({e[1] for e in yields})


def test_a_phase_end_leaves_comfyuis_currently_used(manager: ModelManager, comfy: StandIn,
                                                    accounting: ComfyAccounting) -> None:
    """ComfyUI reloads `loaded_models(only_currently_used=True)` mid-sampling: not our entries
    once their phase ended."""
    handle = manager.register(Stack(), engine="t", name="a")
    manager.acquire([handle])
    assert accounting.entry(handle).currently_used
    manager.release([handle])
    assert not accounting.entry(handle).currently_used


def test_comfyui_short_of_ram_gets_host_copies_of_idle_whole_components(manager: ModelManager,
                                                                        accounting: ComfyAccounting) -> None:
    """0.11-0.20 call `partially_unload_ram(n)` on every candidate: M29's first step, honestly."""
    handle = place(manager, "a")
    adapter = accounting.adapter(handle)
    assert adapter.partially_unload_ram(0) == 0 and adapter.loaded_ram_size() == handle.size_bytes
    released = adapter.partially_unload_ram(MB)
    assert released > 0 and adapter.loaded_ram_size() == handle.size_bytes - released
    manager.acquire([handle])
    assert adapter.partially_unload_ram(MB) == 0  # in use (M31)
    manager.release([handle])


# ---- dynamic VRAM (comfy-aimdo), with stand-ins of its real API (comfy-aimdo 0.6.0) -----------
class StandInVbars:
    """Stand-in for `comfy_aimdo.model_vbar`: `vbars_analyze(device=None)` returns the bytes of
    VBAR pages aimdo would evict on demand; an uninitialized device raises RuntimeError (0.6.0's
    `control.get_devctx`)."""

    def __init__(self, reclaimable: dict[int, int]) -> None:
        self.reclaimable = reclaimable

    def vbars_analyze(self, device: int | None = None) -> int:
        index = 0 if device is None else device
        if index not in self.reclaimable:
            raise RuntimeError(f"comfy-aimdo device {index} is not initialized")
        return self.reclaimable[index]


@pytest.fixture
def aimdo(comfy: StandIn, monkeypatch: pytest.MonkeyPatch) -> StandInVbars:
    """ComfyUI running with dynamic VRAM: `comfy.memory_management.aimdo_enabled` and aimdo's vbars."""
    vbars = StandInVbars({0: 3 << 30})
    memory_management = types.ModuleType("comfy.memory_management")
    memory_management.aimdo_enabled = True  # type: ignore[attr-defined]
    model_vbar = types.ModuleType("comfy_aimdo.model_vbar")
    model_vbar.vbars_analyze = vbars.vbars_analyze  # type: ignore[attr-defined]
    package = types.ModuleType("comfy_aimdo")
    package.model_vbar = model_vbar  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "comfy.memory_management", memory_management)
    monkeypatch.setitem(sys.modules, "comfy_aimdo", package)
    monkeypatch.setitem(sys.modules, "comfy_aimdo.model_vbar", model_vbar)
    return vbars


def test_aimdo_pages_count_as_free_the_way_comfyui_counts_them(aimdo: StandInVbars, comfy: StandIn) -> None:
    from mizuoto_runtime.app.comfy_bridge import aimdo_active, aimdo_reclaimable

    manager = ModelManager(DeviceService(), VramPolicy())  # a real (non-simulated) device service
    accounting = ComfyAccounting(manager)
    assert aimdo_active() and aimdo_reclaimable(torch.device("cuda", 0)) == 3 << 30
    assert accounting.reclaimable_bytes(torch.device("cuda", 0)) == 3 << 30
    assert aimdo_reclaimable(torch.device("cuda", 1)) == 0  # aimdo has no context there
    assert aimdo_reclaimable(CPU) == 0
    sys.modules["comfy.memory_management"].aimdo_enabled = False  # type: ignore[attr-defined]
    assert aimdo_reclaimable(torch.device("cuda", 0)) == 0


def test_older_aimdo_releases_are_read_as_comfyui_read_them(comfy: StandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    """ComfyUI 0.12-0.13 flag aimdo with `aimdo_allocator` and pin comfy-aimdo 0.1, whose
    `vbars_analyze()` takes no device and only logs (returns None): the dynamic entries'
    resident bytes count. ComfyUI 0.16-0.20 pin comfy-aimdo 0.2: `vbars_analyze()` takes no
    device and answers for the one device ComfyUI initialized (before, a device argument raised
    TypeError in every placement)."""
    from mizuoto_runtime.app.comfy_bridge import aimdo_active, aimdo_reclaimable

    cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
    monkeypatch.setattr(sys.modules["comfy.model_management"], "get_torch_device", lambda: cuda0)
    memory_management = types.ModuleType("comfy.memory_management")
    model_vbar = types.ModuleType("comfy_aimdo.model_vbar")
    package = types.ModuleType("comfy_aimdo")
    package.model_vbar = model_vbar  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "comfy.memory_management", memory_management)
    monkeypatch.setitem(sys.modules, "comfy_aimdo", package)
    monkeypatch.setitem(sys.modules, "comfy_aimdo.model_vbar", model_vbar)
    assert not aimdo_active() and aimdo_reclaimable(cuda0) == 0  # no flag: a release before aimdo

    # 0.12-0.13 with comfy-aimdo 0.1
    memory_management.aimdo_allocator = object()  # type: ignore[attr-defined]
    model_vbar.vbars_analyze = lambda: None  # type: ignore[attr-defined]
    dynamic = StandInPatcher(DeviceService(), 5 * MB)
    dynamic.load_device, dynamic.loaded = cuda0, 5 * MB
    dynamic.is_dynamic = lambda: True  # type: ignore[attr-defined]
    legacy = StandInPatcher(DeviceService(), 7 * MB)
    legacy.load_device, legacy.loaded = cuda0, 7 * MB
    legacy.is_dynamic = lambda: False  # type: ignore[attr-defined]
    comfy.current_loaded_models[:] = [StandInLoadedModel(dynamic), StandInLoadedModel(legacy)]
    assert aimdo_active()
    assert aimdo_reclaimable(cuda0) == 5 * MB and aimdo_reclaimable(cuda1) == 0
    memory_management.aimdo_allocator = None  # type: ignore[attr-defined]
    assert not aimdo_active() and aimdo_reclaimable(cuda0) == 0

    # 0.16-0.20 with comfy-aimdo 0.2
    memory_management.aimdo_enabled = True  # type: ignore[attr-defined]
    model_vbar.vbars_analyze = lambda: 2 << 30  # type: ignore[attr-defined]
    assert aimdo_reclaimable(cuda0) == 2 << 30  # aimdo's own figure, not the entries'
    assert aimdo_reclaimable(cuda1) == 0  # aimdo initialized ComfyUI's device only
    comfy.current_loaded_models.clear()


def test_under_aimdo_our_manager_counts_reclaimable_pages_and_spares_dynamic_models(
        aimdo: StandInVbars, manager: ModelManager, comfy: StandIn, devices: DeviceService,
        accounting: ComfyAccounting, monkeypatch: pytest.MonkeyPatch) -> None:
    """The manager counts the pages aimdo gives up on demand as free, so a dynamic diffusion
    model is not detached for us (its pages go only as our allocations need them, and its pinned
    host buffers stay); when ComfyUI is asked, it is with `for_dynamic=True`."""
    diffusion = comfy_model(comfy, devices, 12 * MB)  # its 12 MB are aimdo pages

    def aimdo_allocator(device: torch.device, nbytes: int) -> None:
        """Stand-in for aimdo's allocator hook: a short allocation evicts dynamic pages."""
        short = nbytes - devices.free_bytes(device)
        if short > 0:
            gave = min(short, diffusion.loaded)
            devices.release(CPU, gave)
            diffusion.loaded -= gave

    devices.fault_hook = aimdo_allocator
    monkeypatch.setattr(accounting, "reclaimable_bytes", lambda device: diffusion.loaded)
    tts = manager.register(Stack(6), engine="t", name="talker")
    manager.load([tts])
    assert tts.is_whole and not comfy.free_calls  # nothing detached, nothing asked
    assert 0 < diffusion.loaded < 12 * MB  # evicted page by page, as far as needed
    assert not [e for e in manager.events if e[0] == "yield"]
    accounting.free_for(CPU, MB, [])
    assert comfy.free_calls[-1][2] is True  # for_dynamic: ComfyUI spares its dynamic models


def test_cuda_graphs_are_refused_while_aimdo_is_active(aimdo: StandInVbars, comfy: StandIn) -> None:
    from mizuoto_runtime import Runtime

    try:
        install(Runtime({"compute.simulate_vram_mb": 32}))
        assert "comfy-aimdo" in (graphs.host_refusal() or "")
        sys.modules["comfy.memory_management"].aimdo_enabled = False  # type: ignore[attr-defined]
        install(Runtime({"compute.simulate_vram_mb": 32}))
        assert graphs.host_refusal() is None  # legacy ModelPatcher: capture allowed again
    finally:
        graphs.refuse_capture(None)


# ---- the host: idle and RAM policy where users are (issue 9, item 4) --------------------------
def test_an_engine_reports_its_host_bytes_to_comfyuis_ram_cache(comfy: StandIn) -> None:
    process = joined({"compute.simulate_vram_mb": 32})
    ref = process.engine("demo")
    tensors = ref._comfy_cache_tensors()
    assert sum(t.nbytes for t in tensors) == sum(h.size_bytes for h in ref.engine.handles()) > 0
    assert all(t.device.type == "cpu" for t in tensors)


def test_idle_engines_unload_at_the_next_node(comfy: StandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    """`compute.unload_after_minutes` inside ComfyUI: checked when a Mizuoto node starts."""
    process = joined({"compute.simulate_vram_mb": 32, "compute.unload_after_minutes": 1})
    ref = process.engine("demo")
    handles = ref.engine.handles()
    node = process.around_node(lambda: "ran")
    assert node() == "ran" and not any(h.unloaded for h in handles)
    service = process.runtime().service
    monkeypatch.setattr(service, "_used", {k: v - 61 for k, v in service._used.items()})  # a minute later
    assert node() == "ran" and all(h.unloaded for h in handles)
    assert ref.engine.handles() != handles  # loads again when used


def test_ram_relief_runs_after_every_node(comfy: StandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    """M29 for the phase nodes, not only for `Runtime.say`: after a node, free RAM below
    `compute.ram_reserve_mb` drops host copies of idle whole-loaded components."""
    process = joined({"compute.simulate_vram_mb": 32, "compute.ram_reserve_mb": 1})
    ref = process.engine("demo")
    runtime = ref.runtime
    engine = ref.engine
    voice = engine.voice_prompt(node_request(runtime), None, None, None)
    engine.generate(node_request(runtime, 1), "hi", voice, Sampling(max_new_tokens=8))
    whole = [h for h in engine.handles() if h.is_whole]
    assert whole and all(h.describe()["host_bytes"] == h.size_bytes for h in whole)
    monkeypatch.setattr(runtime.service, "free_ram", lambda: 0)

    def failing() -> None:
        raise ValueError("a node failed")

    with pytest.raises(ValueError):
        process.around_node(failing)()
    assert all(h.describe()["host_bytes"] < h.size_bytes for h in whole)


def test_mizuoto_runtime_reads_a_running_hosts_route(tmp_path: Path) -> None:
    """`mizuoto runtime --url`: the models of a running host, from its read-only route."""
    import http.server
    import json
    import threading

    from mizuoto_runtime.app.cli import main

    report = {"device": {"device": "cuda:0"}, "policy": {}, "models": [{"name": "talker", "loaded_bytes": 7}]}

    class Route(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps(report).encode() if self.path == "/mizuoto/runtime" else b""
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Route)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        done = subprocess.run([sys.executable, "-m", "mizuoto_runtime", "runtime", "--url", url], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"url": url, **report}
        assert main(["runtime", "--url", url + "/nothing-here"]) == 2  # HTTP 404: one clear error
    finally:
        server.shutdown()
        server.server_close()
