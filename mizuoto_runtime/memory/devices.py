"""DeviceService: the devices, their free memory, copies onto them, and the simulated strict device.

M5: on plain CPU the load device is the offload device, so nothing moves.
M14: `pin_to_cpu(module)` keeps a subtree on the CPU, never streamed nor moved.
M55: ``DeviceService(simulate={"cpu": nbytes})`` makes the CPU act as a GPU of that size:
placement copies tensors and counts their bytes against the simulated size.
M56: with ``strict=True`` every weight not on the device is an `absent` meta tensor that
raises `StrictDeviceError`, naming the tensor, when anything but its metadata is used.
"""
from __future__ import annotations

import logging
import numbers
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import psutil
import torch
from torch import nn

from ..errors import ArgumentError, StrictDeviceError

log = logging.getLogger(__name__)

#: Called before every counted allocation or copy with (device, nbytes); may raise
#: `torch.OutOfMemoryError` (fault injection in tests of M40).
FaultHook = Callable[[torch.device, int], None]

_PIN_ATTR = "_mizuoto_pin_to_cpu"


def _metadata_only(func: Any) -> bool:
    """Tensor functions that read only metadata, allowed on an absent tensor."""
    name = getattr(func, "__name__", "")
    return name in _METADATA_FUNCS


_METADATA_FUNCS = frozenset({
    "__get__", "size", "dim", "numel", "element_size", "is_floating_point", "is_complex",
    "__len__", "nelement", "ndimension", "stride", "is_contiguous", "data_ptr", "__hash__",
    "__format__", "__repr__", "_is_view", "get_device", "__reduce_ex__",
})


def _absent_torch_function(cls: type, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
    if _metadata_only(func):
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))
    names = [a.absent_name for a in _walk(args, kwargs) if isinstance(a, (AbsentParameter, AbsentTensor))]
    shapes = [tuple(a.shape) for a in _walk(args, kwargs) if isinstance(a, (AbsentParameter, AbsentTensor))]
    raise StrictDeviceError(
        f"{', '.join(names)} (shape {', '.join(map(str, shapes))}) is not on the device: "
        f"used by {getattr(func, '__name__', func)!s} outside its placement on the strict simulated device. "
        "Use the component inside a phase (ctx.use / ctx.run) that lists its handle; "
        "a streamed unit's weights exist only during its forward."
    )


def _walk(args: Any, kwargs: Any) -> list[Any]:
    out: list[Any] = []
    for a in list(args) + list((kwargs or {}).values()):
        out.extend(a if isinstance(a, (list, tuple)) else [a])
    return out


class AbsentParameter(nn.Parameter):
    """A parameter that is not on the strict simulated device: metadata only (M56)."""

    absent_name: str = "?"

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return _absent_torch_function(cls, func, types, args, kwargs)

    def __new__(cls, like: torch.Tensor, name: str) -> AbsentParameter:
        meta = torch.empty_like(like, device="meta")
        obj = torch.Tensor._make_subclass(cls, meta, like.requires_grad)
        obj.absent_name = name
        return obj


class AbsentTensor(torch.Tensor):
    """A buffer that is not on the strict simulated device (M56)."""

    absent_name: str = "?"

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return _absent_torch_function(cls, func, types, args, kwargs)

    def __new__(cls, like: torch.Tensor, name: str) -> AbsentTensor:
        obj = torch.Tensor._make_subclass(cls, torch.empty_like(like, device="meta"), False)
        obj.absent_name = name
        return obj


def absent_like(tensor: torch.Tensor, name: str, parameter: bool) -> torch.Tensor:
    """The strict-mode stand-in for a weight that is not placed."""
    return AbsentParameter(tensor, name) if parameter else AbsentTensor(tensor, name)


def _accelerator() -> torch.device | None:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.device("xpu", torch.xpu.current_device())
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return None


def _simulated_sizes(simulate: object) -> dict[str, int]:
    """`simulate` checked: {"cpu": a whole number of bytes > 0}, else an error naming it (M55)."""
    if simulate is None:
        return {}
    if not isinstance(simulate, Mapping):
        raise ArgumentError(f"simulate must map a device to its size in bytes, e.g. {{'cpu': 64 << 20}}; "
                            f"got {simulate!r}")
    sizes: dict[str, int] = {}
    for name, nbytes in simulate.items():
        try:
            device = torch.device(name)
        except (RuntimeError, TypeError) as exc:
            raise ArgumentError(f"simulate: {name!r} is not a device name ({exc})") from exc
        if device.type != "cpu":
            raise ArgumentError(f"simulate: only the CPU can act as a GPU, got device {name!r}")
        if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral):
            raise ArgumentError(f"simulate: size of {name!r} must be a whole number of bytes, got {nbytes!r}")
        if nbytes <= 0:
            raise ArgumentError(f"simulate: size of {name!r} must be > 0 bytes, got {nbytes!r}")
        sizes["cpu"] = int(nbytes)
    return sizes


class DeviceService:
    """Devices, free memory, counted copies, `pin_to_cpu`, simulation and strict mode."""

    def __init__(self, simulate: Mapping[str, int] | None = None, strict: bool = False) -> None:
        self._simulated: dict[str, int] = _simulated_sizes(simulate)
        self.strict = bool(strict and self._simulated)
        self.fault_hook: FaultHook | None = None
        self._counted: dict[str, int] = {}
        self._peak: dict[str, int] = {}
        self._lock = threading.Lock()

    # ---- which devices -------------------------------------------------------------------
    def compute_device(self) -> torch.device:
        """Where models run: the simulated CPU, else the first accelerator, else the CPU."""
        if self._simulated:
            return torch.device("cpu")
        return _accelerator() or torch.device("cpu")

    @property
    def offload_device(self) -> torch.device:
        return torch.device("cpu")

    def devices(self) -> list[torch.device]:
        found = [self.compute_device()]
        if found[0].type != "cpu":
            found.append(torch.device("cpu"))
        return found

    def is_simulated(self, device: torch.device) -> bool:
        return device.type == "cpu" and "cpu" in self._simulated

    def moves(self, device: torch.device) -> bool:
        """Whether placing on `device` moves anything: false on plain CPU (M5)."""
        return device.type != "cpu" or self.is_simulated(device)

    # ---- memory --------------------------------------------------------------------------
    def total_bytes(self, device: torch.device) -> int:
        if self.is_simulated(device):
            return self._simulated["cpu"]
        if device.type == "cuda":
            return torch.cuda.mem_get_info(device)[1]
        if device.type == "xpu":
            return torch.xpu.get_device_properties(device).total_memory
        return psutil.virtual_memory().total

    def free_bytes(self, device: torch.device) -> int:
        """Driver-free memory plus what torch's caching allocator holds unused (M6), less what
        live CUDA Graphs' private pools hold unused (no other allocation can take it)."""
        if self.is_simulated(device):
            return self._simulated["cpu"] - self._counted.get("cpu", 0)
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            stats = torch.cuda.memory_stats(device)
            cached = stats.get("reserved_bytes.all.current", 0) - stats.get("allocated_bytes.all.current", 0)
            return free + cached - _graph_pools_unused(device)  # a live graph's pool serves only it
        if device.type == "xpu":
            stats = torch.xpu.memory_stats(device)
            total = torch.xpu.get_device_properties(device).total_memory
            return total - stats.get("allocated_bytes.all.current", 0)
        if device.type == "mps":
            return torch.mps.recommended_max_memory() - torch.mps.current_allocated_memory()
        return psutil.virtual_memory().available

    def process_bytes(self, device: torch.device) -> int:
        """What this process holds on the device (for `compute.vram_limit_mb`)."""
        if self.is_simulated(device):
            return self._counted.get("cpu", 0)
        if device.type == "cuda":
            return torch.cuda.memory_reserved(device)
        if device.type == "xpu":
            return torch.xpu.memory_reserved(device)
        if device.type == "mps":
            return torch.mps.driver_allocated_memory()
        return 0

    def counted_bytes(self, device: torch.device) -> int:
        """Bytes placed on a simulated device (tests read it)."""
        return self._counted.get(device.type, 0)

    def peak_counted_bytes(self, device: torch.device) -> int:
        return self._peak.get(device.type, 0)

    def reset_peak(self, device: torch.device) -> None:
        self._peak[device.type] = self._counted.get(device.type, 0)

    # ---- copies --------------------------------------------------------------------------
    def allocate(self, device: torch.device, nbytes: int) -> None:
        """Count `nbytes` against a simulated device; raise OOM if it does not fit (M55)."""
        if self.fault_hook is not None:
            self.fault_hook(device, nbytes)
        if not self.is_simulated(device):
            return
        with self._lock:
            used = self._counted.get("cpu", 0) + nbytes
            if used > self._simulated["cpu"]:
                raise torch.OutOfMemoryError(
                    f"simulated device cpu: tried to place {nbytes / 2**20:.2f} MiB with "
                    f"{(self._simulated['cpu'] - used + nbytes) / 2**20:.2f} MiB free "
                    f"of {self._simulated['cpu'] / 2**20:.2f} MiB"
                )
            self._counted["cpu"] = used
            self._peak["cpu"] = max(self._peak.get("cpu", 0), used)

    def release(self, device: torch.device, nbytes: int) -> None:
        if self.is_simulated(device):
            with self._lock:
                self._counted["cpu"] = self._counted.get("cpu", 0) - nbytes

    def copy_to(self, tensor: torch.Tensor, device: torch.device, non_blocking: bool = False) -> torch.Tensor:
        """A counted device copy of `tensor` in its own dtype, outside inference mode (M23)."""
        nbytes = tensor.numel() * tensor.element_size()
        self.allocate(device, nbytes)
        try:
            with torch.inference_mode(False):
                if self.is_simulated(device):
                    return tensor.detach().clone()
                return tensor.detach().to(device, non_blocking=non_blocking)
        except BaseException:
            self.release(device, nbytes)
            raise

    def empty_cache(self, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        elif device.type == "xpu":
            torch.xpu.empty_cache()
        elif device.type == "mps":
            torch.mps.empty_cache()

    def synchronize(self, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elif device.type == "xpu":
            torch.xpu.synchronize(device)

    # ---- pin_to_cpu (M14) ----------------------------------------------------------------
    @staticmethod
    def pin_to_cpu(module: nn.Module) -> nn.Module:
        """Keep `module`'s whole subtree on the CPU: never streamed, never moved (M14)."""
        setattr(module, _PIN_ATTR, True)
        return module

    @staticmethod
    def is_pinned_to_cpu(module: nn.Module) -> bool:
        return bool(getattr(module, _PIN_ATTR, False))

    def describe(self) -> dict[str, Any]:
        dev = self.compute_device()
        return {
            "device": str(dev),
            "simulated": self.is_simulated(dev),
            "strict": self.strict,
            "total_mb": round(self.total_bytes(dev) / 2**20, 1),
            "free_mb": round(self.free_bytes(dev) / 2**20, 1),
        }


# ---- CUDA Graphs' private pools ---------------------------------------------------------------
#: Live CUDA Graphs (`graphs.CapturedGraph`) -> (device index, private pool id). A graph's
#: pool keeps its free blocks for that graph's replays: no other allocation can use them.
_GRAPH_POOLS: weakref.WeakKeyDictionary[object, tuple[int, tuple[int, ...]]] = weakref.WeakKeyDictionary()


def track_graph_pool(graph: object, device: torch.device, pool: tuple[int, ...]) -> None:
    """Count `graph`'s private pool out of the device's free memory while the graph lives."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    _GRAPH_POOLS[graph] = (index, pool)


def _graph_pools_unused(device: torch.device) -> int:
    """Bytes reserved in live graphs' private pools but not allocated there (issue 27)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    pools = {pool for i, pool in list(_GRAPH_POOLS.values()) if i == index}
    if not pools:
        return 0
    return sum(segment["total_size"] - segment["allocated_size"] for segment in torch.cuda.memory_snapshot()
               if segment.get("device") == index and tuple(segment.get("segment_pool_id", ())) in pools)


def device_anchors(root: nn.Module) -> set[int]:
    """The parameters code finds a model's device and dtype from, which stay fixed (M14) and as
    published (issue 36): the model's first parameter, and that of every submodule whose class
    looks them up the same way (a `device` or `dtype` property, as Hugging Face models have),
    e.g. a code predictor inside a talker."""
    anchors: set[int] = set()
    for module in root.modules():
        if module is root or any(isinstance(getattr(type(module), a, None), property) for a in ("device", "dtype")):
            first = next(iter(module.parameters()), None)
            if first is not None:
                anchors.add(id(first))
    return anchors
