"""How a unit's weights get to the device: synchronously, or on a side stream (M19, M21, M23).

`SyncCopyEngine` serves the CPU-simulated device, XPU and MPS (M21: copies there are
synchronous). `CudaCopyEngine` (CUDA and ROCm) copies units ahead on a side stream: the
compute stream waits on each copy's event before use, and a copy's memory is protected from
early reuse without `record_stream`: the copy is allocated on the side stream, and before it
is freed the side stream waits on an event recorded on the compute stream after the copy's
last use, so the caching allocator can only hand the block to work ordered after that use.
Host tensors that are pinned (see `pinning.py`) copy asynchronously; pageable ones are
copied synchronously on the compute stream, where an asynchronous copy would stall the host.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from .devices import DeviceService

if TYPE_CHECKING:
    from .units import Unit


class CopyEngine(Protocol):
    def copy_unit(self, unit: Unit, ahead: bool) -> tuple[list[torch.Tensor], object | None]: ...
    def wait(self, ready: object | None) -> None: ...
    def record_use(self, tensors: list[torch.Tensor]) -> None: ...
    def free(self, tensors: list[torch.Tensor], nbytes: int) -> None: ...


class SyncCopyEngine:
    """Copies on the spot, in the weight's own dtype, counted by the device service."""

    def __init__(self, devices: DeviceService, device: torch.device) -> None:
        self.devices = devices
        self.device = device

    def copy_unit(self, unit: Unit, ahead: bool) -> tuple[list[torch.Tensor], object | None]:
        tensors: list[torch.Tensor] = []
        try:
            for slot in unit.slots:
                tensors.append(self.devices.copy_to(_host_of(slot), self.device))
        except BaseException:
            self.free(tensors, sum(t.numel() * t.element_size() for t in tensors))
            raise
        return tensors, None

    def wait(self, ready: object | None) -> None:
        return None

    def record_use(self, tensors: list[torch.Tensor]) -> None:
        return None

    def free(self, tensors: list[torch.Tensor], nbytes: int) -> None:
        tensors.clear()
        self.devices.release(self.device, nbytes)


class CudaCopyEngine(SyncCopyEngine):
    """Side-stream copies guarded by events (M19); pinned sources copy asynchronously (M21)."""

    def __init__(self, devices: DeviceService, device: torch.device) -> None:
        super().__init__(devices, device)
        self.stream = torch.cuda.Stream(device)
        self._last_use: dict[int, torch.cuda.Event] = {}

    def copy_unit(self, unit: Unit, ahead: bool) -> tuple[list[torch.Tensor], object | None]:
        hosts = [_host_of(s) for s in unit.slots]
        if not ahead or not all(h.is_pinned() for h in hosts):
            return super().copy_unit(unit, ahead)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        tensors: list[torch.Tensor] = []
        with torch.cuda.stream(self.stream):
            try:
                for host in hosts:
                    tensors.append(self.devices.copy_to(host, self.device, non_blocking=True))
            except BaseException:
                self.free(tensors, sum(t.numel() * t.element_size() for t in tensors))
                raise
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return tensors, ready

    def wait(self, ready: object | None) -> None:
        if ready is not None:
            torch.cuda.current_stream(self.device).wait_event(ready)  # type: ignore[arg-type]

    def record_use(self, tensors: list[torch.Tensor]) -> None:
        if tensors:
            used = torch.cuda.Event()
            used.record(torch.cuda.current_stream(self.device))
            self._last_use[id(tensors)] = used

    def free(self, tensors: list[torch.Tensor], nbytes: int) -> None:
        used = self._last_use.pop(id(tensors), None)
        if used is not None:
            # Blocks allocated on the side stream are reused only by work ordered after this wait.
            self.stream.wait_event(used)
        super().free(tensors, nbytes)


def _host_of(slot: object) -> torch.Tensor:
    host = getattr(slot, "host")
    if host is None:
        raise RuntimeError(f"{getattr(slot, 'name', '?')}: a streamed weight has no host copy")
    return host


def make_copy_engine(devices: DeviceService, device: torch.device) -> SyncCopyEngine:
    if device.type == "cuda" and not devices.is_simulated(device):
        return CudaCopyEngine(devices, device)
    return SyncCopyEngine(devices, device)
