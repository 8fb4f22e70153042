"""comfy-aimdo's compiled library replaced by a stand-in, so the paths ComfyUI takes with dynamic
VRAM on (`comfy.memory_management.aimdo_enabled`) run on a CPU (issue 23; M6.2, M35). Test set-up,
not product code.

STUBBED, AND ONLY THIS: the ctypes library comfy-aimdo loads (`aimdo.so`: CUDA virtual memory,
the page allocator, pinned host buffers), which needs an NVIDIA driver. Everything above it runs
as released: comfy-aimdo's Python package (`control.init_devices`, `control.get_devctx`,
`model_vbar.vbars_analyze`, `host_buffer.HostBuffer`), ComfyUI's code and ours. The stand-in
answers each C call the package makes with what the library would report for an idle device:
device contexts for the devices initialized, no pages resident, host buffers that stay empty,
and `vbars_analyze` = the reclaimable bytes the test gives per device.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

#: comfy-aimdo's modules that bind the library at import (`lib = control.lib`).
BINDING_MODULES = ("comfy_aimdo.control", "comfy_aimdo.model_vbar", "comfy_aimdo.host_buffer",
                   "comfy_aimdo.vram_buffer")
DEVCTX_BASE = 0x1000  # the stand-in's device-context handles: DEVCTX_BASE + device index
HOSTBUF_BASE = 0x100000


class StubbedAimdoLibrary:
    """Stand-in for comfy-aimdo's `aimdo.so` (the C boundary only). `calls` records each call:
    (function name, arguments). The package sets `argtypes`/`restype` on the functions it binds;
    plain function attributes take them."""

    def __init__(self, reclaimable: dict[int, int]) -> None:
        self.reclaimable = dict(reclaimable)
        self.devices: list[int] = []
        self.hostbufs: set[int] = set()
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        for name, answer in self._answers().items():
            setattr(self, name, self._recorded(name, answer))

    def _recorded(self, name: str, answer: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls.append((name, args))
            return answer(*args)

        call.__name__ = name
        return call

    def _answers(self) -> dict[str, Callable[..., Any]]:
        return {
            "plat_init": lambda: True,
            "plat_cleanup": lambda: None,
            "cleanup": lambda: None,
            "init": self._init,
            "get_devctx": lambda device: DEVCTX_BASE + device if device in self.devices else 0,
            "set_log_callback": lambda callback: None,
            "set_simple_vram_headroom": lambda headroom: None,
            "set_nvml_pressure": lambda on: None,
            "get_total_vram_usage": lambda devctx: 0,
            "vbars_analyze": lambda devctx, verbose: self.reclaimable.get(devctx - DEVCTX_BASE, 0),
            "vbars_reset_watermark_limits": lambda devctx: None,
            "hostbuf_allocate": self._hostbuf_allocate,
            "hostbuf_free": self.hostbufs.discard,
            "hostbuf_truncate": lambda hostbuf, size, unregister: hostbuf in self.hostbufs,
            "hostbuf_unregister": lambda hostbuf, offset: hostbuf in self.hostbufs,
        }

    def _init(self, device_array: Any, headroom_array: Any, count: int) -> bool:
        self.devices = [device_array[i] for i in range(count)]
        return True

    def _hostbuf_allocate(self, prewarm: int, max_size: int, mark_cold: bool) -> int:
        handle = HOSTBUF_BASE + len(self.hostbufs) + len(self.calls)
        self.hostbufs.add(handle)
        return handle

    def called(self, name: str) -> list[tuple[Any, ...]]:
        return [args for called, args in self.calls if called == name]


def dynamic_vram_here() -> str | None:
    """Why this ComfyUI and comfy-aimdo do not have the dynamic-VRAM paths in 0.4's shape (the
    `aimdo_enabled` flag, ComfyUI's dynamic patcher and `vbars_analyze(device)`), or None."""
    try:
        memory = importlib.import_module("comfy.memory_management")
        patcher = importlib.import_module("comfy.model_patcher")
        model_vbar = importlib.import_module("comfy_aimdo.model_vbar")
    except ImportError as missing:
        return f"no dynamic VRAM here: {missing}"
    if not hasattr(memory, "aimdo_enabled") or not hasattr(patcher, "ModelPatcherDynamic"):
        return "this ComfyUI has no aimdo_enabled flag or no dynamic patcher"
    if "device" not in inspect.signature(model_vbar.vbars_analyze).parameters:
        return "this comfy-aimdo's vbars_analyze takes no device (before 0.4)"
    if not hasattr(patcher.ModelPatcherDynamic, "register_load_device"):
        return "this ComfyUI's dynamic patcher predates the comfy-aimdo 0.4 host buffers"
    return None


@contextlib.contextmanager
def stubbed_library(reclaimable: dict[int, int]) -> Iterator[StubbedAimdoLibrary]:
    """comfy-aimdo initialized on the devices of `reclaimable` (index -> bytes aimdo would give
    up) through its real `control.init_devices`, over the stand-in library, and ComfyUI's
    `aimdo_enabled` set as its `main.py` sets it after that; everything restored after."""
    import comfy.memory_management as memory
    import comfy_aimdo.control as control

    library = StubbedAimdoLibrary(reclaimable)
    modules = [sys.modules[name] for name in BINDING_MODULES if name in sys.modules]
    saved = [(module, module.lib) for module in modules]
    devctxs, enabled = list(control.devctxs), memory.aimdo_enabled
    for module in modules:
        module.lib = library
    try:
        assert control.init_devices(list(reclaimable)), "comfy-aimdo did not initialize over the stand-in"
        memory.aimdo_enabled = True
        yield library
    finally:
        memory.aimdo_enabled = enabled
        control.devctxs = devctxs
        for module, lib in saved:
            module.lib = lib


def dynamic_patcher(module: Any, device: Any) -> Any:
    """ComfyUI's real dynamic patcher over `module` with `device` as load device. ComfyUI hands a
    CPU load device the legacy patcher instead (`ModelPatcherDynamic.__new__`); this builds the
    dynamic one there, so its paths run on the simulated device."""
    import comfy.model_patcher

    cls = comfy.model_patcher.ModelPatcherDynamic
    patcher = object.__new__(cls)
    patcher.__init__(module, device, device)
    return patcher

