"""Mizuoto's memory runtime: a model runs if its minimum working set fits on the device.

The public API (see the README and ../shared/spec/SPEC.md for the requirement IDs):
`DeviceService` (M5, M14, M55–M56), `VramPolicy` (M9–M10), `ModelHandle` (M15–M17,
M25–M28), `ModelManager` (M6–M8, M30–M33), `RequestContext` (M1–M4, M40–M44), `Runtime`.
This package never imports `comfy`, except in `comfy_bridge`.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app.runtime import Runtime
    from .audio import Audio, read_wav, write_wav
    from .errors import (
        ArgumentError,
        CancelledError,
        CheckpointError,
        DeviceTooSmallError,
        MizuotoError,
        SettingError,
        StrictDeviceError,
    )
    from .memory.devices import DeviceService
    from .memory.handle import ModelHandle
    from .memory.manager import ModelManager
    from .memory.phases import RequestContext
    from .memory.policy import VramPolicy
    from .memory.testing import OomInjector
    from .memory.tiling import tiled_1d
    from .memory.units import plan_units
    from .nn.loading import build_on_meta, load_safetensors

# Each name loads its module on first use, so importing the package does not import torch: the
# command line writes the CUDA allocator's environment before torch loads (`entry`, M54).
_HOMES = {
    "Audio": "audio", "read_wav": "audio", "write_wav": "audio", "DeviceService": "memory.devices",
    "OomInjector": "memory.testing", "ArgumentError": "errors", "CancelledError": "errors", "CheckpointError": "errors",
    "DeviceTooSmallError": "errors", "MizuotoError": "errors", "SettingError": "errors",
    "StrictDeviceError": "errors", "ModelHandle": "memory.handle", "build_on_meta": "nn.loading",
    "load_safetensors": "nn.loading", "ModelManager": "memory.manager", "RequestContext": "memory.phases",
    "VramPolicy": "memory.policy", "Runtime": "app.runtime", "tiled_1d": "memory.tiling", "plan_units": "memory.units",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "ArgumentError", "Audio", "CancelledError", "CheckpointError", "DeviceService", "DeviceTooSmallError",
    "MizuotoError", "ModelHandle", "ModelManager", "OomInjector", "RequestContext", "Runtime", "SettingError",
    "StrictDeviceError", "VramPolicy", "build_on_meta", "load_safetensors", "plan_units", "read_wav", "tiled_1d",
    "write_wav",
]
__version__ = "0.1.0"
