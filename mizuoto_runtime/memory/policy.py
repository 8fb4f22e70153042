"""VramPolicy: the one object that reads the `compute.*` settings (M9, M10).

Settings arrive as a flat dict with dotted keys (``{"compute.vram_mode": "low"}``)
or nested (``{"compute": {"vram_mode": "low"}}``). Every key is validated here; a
bad key or value raises one `SettingError` that names the key.
"""
from __future__ import annotations

import dataclasses
import math
import platform
from collections.abc import Mapping
from typing import Any

import psutil

from ..errors import SettingError
from .small_weights import CHOICES, PUBLISHED

MB = 1024 * 1024
GB = 1024 * MB

VRAM_MODES = ("high", "shared", "normal", "low", "none")
HOST_COPIES = ("auto", "on", "off")
KV_CACHES = ("dynamic", "static")
CUDA_ALLOCATORS = ("auto", "native", "async", "expandable")
CPU_ALLOCATORS = ("auto", "hugepages", "no_hugepages")


@dataclasses.dataclass(frozen=True)
class _Setting:
    default: Any
    kind: type | tuple[type, ...]
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    optional: bool = False  # None allowed (means "automatic")


# The M10 list, with defaults. `None` for an optional setting means "computed" (see the properties).
_SETTINGS: dict[str, _Setting] = {
    "vram_mode": _Setting("normal", str, VRAM_MODES),
    "vram_reserve_mb": _Setting(None, (int, float), minimum=0, optional=True),
    "vram_limit_mb": _Setting(None, (int, float), minimum=0, optional=True),
    "gpu_jobs": _Setting(1, int, minimum=1),
    "async_offload": _Setting(1, int, minimum=0),
    "max_pinned_mb": _Setting(None, (int, float), minimum=0, optional=True),
    "host_copies": _Setting("auto", str, HOST_COPIES),
    "ram_reserve_mb": _Setting(None, (int, float), minimum=0, optional=True),
    "max_resident_models": _Setting(0, int, minimum=0),
    "unload_after_minutes": _Setting(0, (int, float), minimum=0),
    "oom_retry": _Setting(True, bool),
    "oom_fallback": _Setting(False, bool),
    "kv_cache": _Setting("dynamic", str, KV_CACHES),
    "cuda_allocator": _Setting("auto", str, CUDA_ALLOCATORS),
    "simulate_vram_mb": _Setting(None, (int, float), minimum=1, optional=True),
    "cpu_allocator": _Setting("auto", str, CPU_ALLOCATORS),
    "weights": _Setting(PUBLISHED, str, CHOICES),  # for engines loaded without a choice of their own
}

# Settings whose non-default values have no behaviour yet, and why: such a value is refused
# rather than silently accepted. A setting leaves this table when its behaviour lands.
_NOT_YET: dict[str, str] = {}  # compute.cpu_allocator left it: training processes apply it (M62)

# ComfyUI's extra reserved VRAM on a real GPU; a simulated device reserves nothing unless told.
_DEFAULT_REAL_RESERVE_MB = 400


def _flatten(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, full + "."))
        else:
            flat[full] = value
    return flat


def _parse_value(key: str, spec: _Setting, value: Any) -> Any:
    if value is None or value == "":
        if spec.optional:
            return None
        raise SettingError(f"setting 'compute.{key}' needs a value (default {spec.default!r})")
    if isinstance(value, str) and spec.kind is not str:
        value = _coerce_text(key, spec, value)
    kinds = spec.kind if isinstance(spec.kind, tuple) else (spec.kind,)
    # bool is an int subclass; a number setting must not take True/False by accident.
    if isinstance(value, bool) and bool not in kinds:
        raise SettingError(f"setting 'compute.{key}' must be {_kind_name(spec)}, got {value!r}")
    if not isinstance(value, kinds):
        raise SettingError(f"setting 'compute.{key}' must be {_kind_name(spec)}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise SettingError(f"setting 'compute.{key}' must be a finite number, got {value!r}")
    if spec.choices and value not in spec.choices:
        raise SettingError(f"setting 'compute.{key}' must be one of {', '.join(spec.choices)}; got {value!r}")
    # A minimum is declared on number settings only; the isinstance is for the type checker.
    if spec.minimum is not None and isinstance(value, (int, float)) and value < spec.minimum:
        raise SettingError(f"setting 'compute.{key}' must be >= {spec.minimum:g}, got {value!r}")
    if key in _NOT_YET and value != spec.default:
        raise SettingError(f"setting 'compute.{key}' has no effect yet ({_NOT_YET[key]}); "
                           f"leave it at {spec.default!r}")
    return value


def _coerce_text(key: str, spec: _Setting, text: str) -> Any:
    """Values from a CLI `--setting k=v` or a UI field arrive as text."""
    kinds = spec.kind if isinstance(spec.kind, tuple) else (spec.kind,)
    lowered = text.strip().lower()
    if bool in kinds:
        if lowered in ("1", "true", "on", "yes"):
            return True
        if lowered in ("0", "false", "off", "no"):
            return False
    try:
        if int in kinds and lowered.lstrip("-").isdigit():
            return int(lowered)
        if float in kinds:
            return float(lowered)
    except ValueError:
        pass
    raise SettingError(f"setting 'compute.{key}' must be {_kind_name(spec)}, got {text!r}")


def _kind_name(spec: _Setting) -> str:
    kinds = spec.kind if isinstance(spec.kind, tuple) else (spec.kind,)
    names = {bool: "true/false", int: "an integer", float: "a number", str: "text"}
    return " or ".join(dict.fromkeys(names[k] for k in kinds))


class VramPolicy:
    """Every `compute.*` setting with its default and validation (M9–M10).

    >>> VramPolicy({"compute.vram_mode": "low"}).vram_mode
    'low'
    """

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self._values: dict[str, Any] = {k: s.default for k, s in _SETTINGS.items()}
        self._pinned_models: dict[str, tuple[str, ...]] = {}
        for key, value in _flatten(settings or {}).items():
            self._set(key, value)

    def _set(self, key: str, value: Any) -> None:
        parts = key.split(".")
        if parts[0] == "compute" and len(parts) == 2 and parts[1] in _SETTINGS:
            self._values[parts[1]] = _parse_value(parts[1], _SETTINGS[parts[1]], value)
        elif parts[0] == "engines" and len(parts) == 3 and parts[2] == "pinned_models":
            self._pinned_models[parts[1]] = _parse_name_list(key, value)
        else:
            known = ", ".join(f"compute.{k}" for k in _SETTINGS)
            raise SettingError(f"unknown setting {key!r}; known: {known}, engines.<id>.pinned_models")

    def update(self, settings: Mapping[str, Any]) -> None:
        """Change settings in place (every holder sees them); all are validated before any applies."""
        checked = VramPolicy(self.as_dict() | _flatten(settings))
        self._values, self._pinned_models = checked._values, checked._pinned_models

    def as_dict(self) -> dict[str, Any]:
        out = {f"compute.{k}": v for k, v in self._values.items()}
        out.update({f"engines.{e}.pinned_models": list(v) for e, v in self._pinned_models.items()})
        return out

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        raise AttributeError(name)

    def is_pinned(self, engine: str, name: str) -> bool:
        """Whether `engines.<engine>.pinned_models` names this component (M30's second key)."""
        return name in self._pinned_models.get(engine, ())

    def reserve_bytes(self, simulated: bool) -> int:
        mb = self._values["vram_reserve_mb"]
        if mb is None:
            mb = 0 if simulated else _DEFAULT_REAL_RESERVE_MB
        return int(mb * MB)

    def limit_bytes(self) -> int | None:
        mb = self._values["vram_limit_mb"]
        return None if mb is None else int(mb * MB)

    def pinned_budget_bytes(self) -> int:
        """`compute.max_pinned_mb`, else ComfyUI's default formula (M21)."""
        mb = self._values["max_pinned_mb"]
        if mb is not None:
            return int(mb * MB)
        ram = psutil.virtual_memory().total
        if platform.system() == "Windows":
            return int(0.4 * ram)
        return int(max(0.4 * ram, min(0.9 * ram, ram - 4 * GB)))

    def ram_reserve_bytes(self) -> int:
        """`compute.ram_reserve_mb`, else max(2 GB, RAM / 10) (M29)."""
        mb = self._values["ram_reserve_mb"]
        if mb is not None:
            return int(mb * MB)
        return int(max(2 * GB, psutil.virtual_memory().total / 10))

    def copies_in_flight(self) -> int:
        """Live streamer copies for a oneshot handle: the running unit + `async_offload` (M18)."""
        return self._values["async_offload"] + 1

    def describe(self) -> dict[str, Any]:
        """The policy in force, for `mizuoto doctor`'s memory check (M52)."""
        return {
            "mode": self.vram_mode,
            "reserve_mb": self._values["vram_reserve_mb"] if self._values["vram_reserve_mb"] is not None else "auto",
            "limit_mb": self.vram_limit_mb,
            "ram_reserve_mb": round(self.ram_reserve_bytes() / MB),
            "host_copies": self.host_copies,
            "pinned_budget_mb": round(self.pinned_budget_bytes() / MB),
            "copy_streams": self.async_offload,
            "oom_retry": self.oom_retry,
            "oom_fallback": self.oom_fallback,
        }


def _parse_name_list(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise SettingError(f"setting {key!r} must be a list of component names, got {value!r}")
