"""Page-locked host memory for streamed weights and kept host copies (M21, M22).

A copy from page-locked ("pinned") host memory runs asynchronously at full link speed; a
copy from pageable memory is staged by the driver, about half as fast, and blocks the host.
`Pinner` decides, within `compute.max_pinned_mb` (`PinnedBudget`, ComfyUI's default formula in
`VramPolicy.pinned_budget_bytes`; inside ComfyUI also within what ComfyUI's own pinned-memory
accounting has left, `share_budget`), which host tensors become pinned and how:

* ``register`` (NVIDIA): whole storages of at least 1 MB are registered in place with
  `cudaHostRegister` — no data copied (~14 GB/s against ~1.5 GB/s for `Tensor.pin_memory()`).
  Smaller storages share pages with their neighbours and registrations cannot overlap, so
  small *streamed* tensors are copied into pinned memory instead, and so are streamed tensors
  that are a checkpoint file's pages (`memory.mapped`: neighbours share pages there). Host
  copies kept for whole-loaded components (`keep_host`) are registered the same way, never
  copied (file pages stay pageable).
* ``copy`` (ROCm and other CUDA-like devices): streamed tensors are copied into pinned
  memory; kept host copies stay pageable. Such memory comes from torch's caching host
  allocator, which locks each block rounded up to a power of two (`host_block_bytes`) and
  keeps freed blocks cached, still locked: the budget counts the rounded size, and after
  releases the host cache is emptied, so what the budget (and ComfyUI's total) credits back
  is really unlocked (issue 27).
* ``off`` (CPU, the simulated device, XPU, MPS: no page-locked memory to copy from): a no-op.

Beyond the budget, or when a registration fails (the error is cleared so it does not surface
at the next kernel launch), a tensor stays pageable and its copies are synchronous.

**Tying a registration to its storage.** Memory must be unregistered before it is freed,
else a later allocation at the same address would be taken as pinned. Neither the Python
tensor object nor the `UntypedStorage` object marks the storage's death: `param.data = t`
shares `t`'s storage without keeping `t` alive, and a storage's C++ `release_resources` frees
the data before its Python wrapper goes. So a pinned storage S is *re-homed*: a numpy array
(the *anchor*) is made over S's bytes and `torch.from_numpy` builds a new storage S' over the
same bytes whose deleter drops the anchor. The handle's host tensors become views of S'
(same address, same values). When the last view of S' dies, S' drops the anchor and the
anchor's `weakref.finalize` runs: it waits for the device, unregisters, returns the budget —
and only then lets go of the reference to S it holds, so S's memory cannot be freed before
the finalizer has finished, whoever else still holds S. A finalizer that fires while a CUDA
Graph is being captured — on any thread: a device-wide wait during a capture is not safe — is
deferred until `flush`, the memory still held.

**Releases together.** Each release waits for the device (copies may still read the memory).
Storages that die together — a handle dropping or unloading its host copies — are released
in one batch (`released_together`): one device synchronization and one host-cache flush for
all of them, not one per storage.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Literal, Protocol

import numpy as np
import torch

from .mapped import file_backed

log = logging.getLogger(__name__)

REGISTER_MIN_BYTES = 1 << 20  # M22: smaller storages share pages with their neighbours
_CUDA_HOST_REGISTER_PORTABLE = 1  # pinned for every CUDA context (multi-GPU), as ComfyUI does
_MARK = "_mizuoto_pinned"  # set on the views this module hands out: already re-homed

PinMode = Literal["register", "copy", "off"]

_deferring = 0  # blocks deferring releases in this process: CUDA Graph captures, batched releases
_deferring_lock = threading.Lock()


@contextlib.contextmanager
def releases_deferred() -> Iterator[None]:
    """While a CUDA Graph is captured, pinned memory is not released (no synchronization);
    the releases wait for a pinner's `flush`."""
    global _deferring
    with _deferring_lock:
        _deferring += 1
    try:
        yield
    finally:
        with _deferring_lock:
            _deferring -= 1


@contextlib.contextmanager
def released_together(pinner: Pinner | None) -> Iterator[None]:
    """Pinned regions whose storages die in the block are released at its end, in one batch
    (one device synchronization, one host-cache flush), not one by one."""
    if pinner is None:
        yield
        return
    try:
        with releases_deferred():
            yield
    finally:
        pinner.flush()


def host_block_bytes(nbytes: int) -> int:
    """The bytes torch's caching host allocator locks for an `nbytes` pinned allocation: the
    next power of two (`CachingHostAllocator::allocate`, torch 2.x; its
    ``pinned_max_round_threshold`` setting, unlimited by default, is not read here)."""
    return 0 if nbytes <= 0 else 1 << (nbytes - 1).bit_length()


class OutsidePins(Protocol):
    """Another pinned-memory accountant in the process (ComfyUI's, `comfy_bridge.ComfyPins`)."""

    def free(self) -> int | None: ...  # bytes it still allows; None: it sets no limit now
    def add(self, nbytes: int) -> None: ...  # count our pins (negative: released) in its total


class PinnedBudget:
    """Bytes of page-locked host memory the process may hold (`compute.max_pinned_mb`, M21).

    With an `outside` accountant (inside ComfyUI), a region is taken only if it fits both our
    limit and what the outside one has left, and every byte we hold is counted in its total
    too, so the two never oversubscribe host RAM together (issue 17, item 2)."""

    def __init__(self, limit: int, outside: OutsidePins | None = None) -> None:
        self.limit = max(0, int(limit))
        self.used = 0
        self.outside = outside
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bool:
        """Reserve `nbytes` if they fit under the limit; False (nothing reserved) otherwise."""
        with self._lock:
            if self.used + nbytes > self.limit:
                return False
            outside = self.outside.free() if self.outside is not None else None
            if outside is not None and nbytes > outside:
                return False
            self.used += nbytes
            if self.outside is not None:
                self.outside.add(nbytes)
            return True

    def give(self, nbytes: int) -> None:
        with self._lock:
            given = min(nbytes, self.used)
            self.used -= given
            if self.outside is not None:
                self.outside.add(-given)

    @property
    def free(self) -> int:
        return max(0, self.limit - self.used)


class Registrar(Protocol):
    """The device side of pinning; `CudaRegistrar` on a GPU, `RecordingRegistrar` in tests."""

    def register(self, ptr: int, nbytes: int) -> bool: ...
    def unregister(self, ptr: int) -> None: ...
    def is_pinned(self, tensor: torch.Tensor) -> bool: ...
    def clear_error(self) -> None: ...
    def synchronize(self) -> None: ...
    def capturing(self) -> bool: ...
    def pinned_empty(self, like: torch.Tensor) -> torch.Tensor: ...
    def empty_host_cache(self) -> None: ...


class CudaRegistrar:
    """`cudaHostRegister` through `torch.cuda.cudart()` (torch binds it; 2.x returns the
    `cudaError` without clearing it), and pinned allocations from torch's host allocator."""

    def __init__(self) -> None:
        self.devices: set[int] = set()  # devices whose copies may read pinned memory
        self._get_last_error = _cudart_get_last_error()

    def register(self, ptr: int, nbytes: int) -> bool:
        err = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, _CUDA_HOST_REGISTER_PORTABLE)
        return int(err) == 0

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        """Page-locked by anyone (e.g. loaded with `pin_memory`): usable as is, not registrable."""
        return tensor.is_pinned()

    def unregister(self, ptr: int) -> None:
        err = torch.cuda.cudart().cudaHostUnregister(ptr)
        if int(err) != 0:
            self.clear_error()
            log.warning("cudaHostUnregister(0x%x) failed with cudaError %d", ptr, int(err))

    def clear_error(self) -> None:
        """Consume the error a failed call left, so torch's next launch check does not raise it."""
        if self._get_last_error is not None:
            self._get_last_error()
            return
        # No handle on the runtime torch uses (static build, Windows): a launch check
        # consumes the pending error; it raises it, and here that is the point.
        try:
            torch.empty(1, device="cuda").add_(1)
            torch.cuda.synchronize()
        except RuntimeError:
            log.debug("cleared a pending CUDA error after a failed registration")

    def synchronize(self) -> None:
        for index in sorted(self.devices) or [torch.cuda.current_device()]:
            torch.cuda.synchronize(index)

    def capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def pinned_empty(self, like: torch.Tensor) -> torch.Tensor:
        return _empty_like_preserving(like, pin_memory=True)

    def empty_host_cache(self) -> None:
        """Unlock the host allocator's cached free blocks (a freed pinned tensor stays locked there)."""
        release = getattr(torch._C, "_host_emptyCache", None)  # absent from CPU-only builds: they pin nothing
        if release is not None:
            release()


def _cudart_get_last_error() -> Callable[[], int] | None:
    """`cudaGetLastError` of the CUDA runtime torch loaded (its error state is per library)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    except OSError:
        return None
    # Prefer the runtime torch ships with (wheels: nvidia/cuda_runtime) over another library's.
    for path in sorted(paths, key=lambda p: ("cuda_runtime" not in p and "torch" not in p, p)):
        try:
            func = ctypes.CDLL(path).cudaGetLastError
        except (OSError, AttributeError):
            continue
        func.restype = ctypes.c_int
        return func
    return None


class RecordingRegistrar:
    """A registrar for the simulated device (M55): pins nothing, records every call.

    Lets the CPU run the whole pinning logic — budget, threshold, register vs copy, fallback
    after a failed registration, finalizer order — in tests and `bench/gpu_suite.py --dry-run`.
    """

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail  # registrations fail (M22's fallback to pageable)
        self.capture = False  # pretend a CUDA Graph is being captured
        self.calls: list[tuple[str, ...]] = []

    def register(self, ptr: int, nbytes: int) -> bool:
        self.calls.append(("register", hex(ptr), str(nbytes)))
        return not self.fail

    def unregister(self, ptr: int) -> None:
        self.calls.append(("unregister", hex(ptr)))

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return False  # the CPU has no page-locked memory of its own

    def clear_error(self) -> None:
        self.calls.append(("clear_error",))

    def synchronize(self) -> None:
        self.calls.append(("synchronize",))

    def capturing(self) -> bool:
        return self.capture

    def pinned_empty(self, like: torch.Tensor) -> torch.Tensor:
        self.calls.append(("pinned_empty", str(like.numel() * like.element_size())))
        return _empty_like_preserving(like, pin_memory=False)

    def empty_host_cache(self) -> None:
        self.calls.append(("empty_host_cache",))


def _empty_like_preserving(like: torch.Tensor, pin_memory: bool) -> torch.Tensor:
    """An empty host tensor with the strides `.to(device)` would give `like` (same kernels, M23)."""
    meta = torch.empty_like(like, device="meta")
    with torch.inference_mode(False):
        return torch.empty_strided(meta.size(), meta.stride(), dtype=like.dtype, pin_memory=pin_memory)


@dataclasses.dataclass(eq=False)
class _Pinned:
    """One pinned region: a registered storage, or a pinned copy of one tensor."""

    kind: Literal["registered", "copied"]
    ptr: int
    nbytes: int
    anchor: weakref.ref[np.ndarray]
    released: bool = False


class Pinner:
    """Pins host tensors within a budget and unpins them when their storage dies (M21, M22)."""

    def __init__(self, mode: PinMode, registrar: Registrar | None = None, budget: PinnedBudget | None = None) -> None:
        if mode != "off" and registrar is None:
            raise ValueError(f"pin mode {mode!r} needs a registrar")
        self.mode: PinMode = mode
        self.registrar = registrar
        self.budget = budget or PinnedBudget(0)
        self._pinned: dict[int, _Pinned] = {}  # data_ptr of the region -> its record
        self._deferred: list[tuple[_Pinned, torch.Tensor]] = []
        self._lock = threading.RLock()  # finalizers may run on any thread, even inside a pin call

    # ---- queries -------------------------------------------------------------------------
    def is_pinned(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` lies in page-locked memory: pinned here, or by its owner."""
        if tensor.device.type != "cpu" or self.registrar is None:
            return False
        record = self._pinned.get(tensor.untyped_storage().data_ptr())
        if record is not None:
            return not record.released
        return self.registrar.is_pinned(tensor)

    @property
    def pinned_bytes(self) -> int:
        return self.budget.used

    # ---- pinning -------------------------------------------------------------------------
    def pin_streamed(self, hosts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Host tensors of streamed units: registered in place, or copied into pinned memory.

        Returns one tensor per input, in order: the same tensor where nothing changed, else a
        view of re-homed (pinned) memory with the same values, dtype, shape and strides.
        """
        return self._pin(hosts, copy_rest=True)

    def pin_kept(self, hosts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Host copies kept for whole-loaded components: registered in place on NVIDIA only."""
        if self.mode != "register":
            return list(hosts)
        return self._pin(hosts, copy_rest=False)

    def _pin(self, hosts: Sequence[torch.Tensor], copy_rest: bool) -> list[torch.Tensor]:
        out = list(hosts)
        if self.mode == "off":
            return out
        self.flush()
        groups: dict[int, list[int]] = {}
        for i, t in enumerate(hosts):
            if t.device.type == "cpu" and t.numel() and not getattr(t, _MARK, False) and not self._foreign(t):
                groups.setdefault(t.untyped_storage().data_ptr(), []).append(i)
        with self._lock:
            for ptr, indices in groups.items():
                self._pin_storage(ptr, [hosts[i] for i in indices], copy_rest, out, indices)
        return out

    def _foreign(self, tensor: torch.Tensor) -> bool:
        """Pinned by its owner: usable as is (registering it again would fail)."""
        assert self.registrar is not None
        return tensor.untyped_storage().data_ptr() not in self._pinned and self.registrar.is_pinned(tensor)

    def _pin_storage(self, ptr: int, tensors: list[torch.Tensor], copy_rest: bool,
                     out: list[torch.Tensor], indices: list[int]) -> None:
        nbytes = tensors[0].untyped_storage().nbytes()
        record = self._pinned.get(ptr)
        if record is not None:
            anchor = record.anchor()
            if anchor is not None and not record.released:
                for i, t in zip(indices, tensors):
                    out[i] = _rehome(t, anchor)
            return  # a region being released stays pageable until its finalizer has run
        if self.mode == "register" and nbytes >= REGISTER_MIN_BYTES and not file_backed(tensors[0]):
            anchor = self._register(tensors[0], ptr, nbytes)
            if anchor is not None:
                for i, t in zip(indices, tensors):
                    out[i] = _rehome(t, anchor)
            return  # beyond the budget or refused: pageable, copied synchronously (M21)
        if copy_rest:  # what is not registered: copied
            for i, t in zip(indices, tensors):
                out[i] = self._copy(t)

    def _register(self, tensor: torch.Tensor, ptr: int, nbytes: int) -> np.ndarray | None:
        assert self.registrar is not None
        if not self.budget.take(nbytes):
            return None
        if not self.registrar.register(ptr, nbytes):
            self.registrar.clear_error()
            self.budget.give(nbytes)
            log.info("cudaHostRegister of %.1f MB failed; that storage stays pageable", nbytes / 2**20)
            return None
        return self._anchor(tensor, "registered", ptr, nbytes)

    def _copy(self, tensor: torch.Tensor) -> torch.Tensor:
        assert self.registrar is not None
        nbytes = host_block_bytes(tensor.numel() * tensor.element_size())  # what the allocator locks
        if not self.budget.take(nbytes):
            return tensor
        try:
            pinned = self.registrar.pinned_empty(tensor)
            with torch.inference_mode(False):
                pinned.copy_(tensor)
        except BaseException:
            self.budget.give(nbytes)
            raise
        anchor = self._anchor(pinned, "copied", pinned.untyped_storage().data_ptr(), nbytes)
        return _rehome(pinned, anchor)

    def _anchor(self, tensor: torch.Tensor, kind: Literal["registered", "copied"], ptr: int, nbytes: int) -> np.ndarray:
        """The numpy array whose death marks the end of the pinned region (see the module doc)."""
        with torch.inference_mode(False):
            whole = torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())
        anchor = whole.numpy()
        record = _Pinned(kind, ptr, nbytes, weakref.ref(anchor))
        # The finalizer's arguments hold `whole` (the original storage) until it has run.
        finalizer = weakref.finalize(anchor, self._release, record, whole)
        finalizer.atexit = False  # at exit the process's memory goes anyway; CUDA may be gone
        self._pinned[ptr] = record
        return anchor

    # ---- unpinning -----------------------------------------------------------------------
    def _release(self, record: _Pinned, whole: torch.Tensor) -> None:
        """Finalizer of an anchor: wait for the device, unregister, return the budget."""
        with self._lock:
            record.released = True
            assert self.registrar is not None
            if _deferring or self.registrar.capturing():
                # During capture no synchronization, and in a batch one for all: keep the
                # memory (held by `whole`) until `flush`.
                self._deferred.append((record, whole))
                return
            self._finish([record])

    def _finish(self, records: Sequence[_Pinned]) -> None:
        """Release `records` after one wait for the device; copied blocks leave the host cache."""
        assert self.registrar is not None
        try:
            self.registrar.synchronize()  # copies still reading this memory must end first
            for record in records:
                if record.kind == "registered":
                    self.registrar.unregister(record.ptr)
            if any(r.kind == "copied" for r in records):
                self.registrar.empty_host_cache()  # else the freed blocks stay cached and locked
        finally:
            for record in records:
                self.budget.give(record.nbytes)
                if self._pinned.get(record.ptr) is record:
                    del self._pinned[record.ptr]

    def flush(self) -> None:
        """Finish the releases deferred while a CUDA Graph was being captured, or batched."""
        if not self._deferred or _deferring or (self.registrar is not None and self.registrar.capturing()):
            return
        with self._lock:
            deferred, self._deferred = self._deferred, []
            if deferred:
                self._finish([record for record, _whole in deferred])


def _rehome(tensor: torch.Tensor, anchor: np.ndarray) -> torch.Tensor:
    """A view of `tensor` on a new storage over the anchor's bytes (same address and values)."""
    with torch.inference_mode(False):
        base = torch.from_numpy(anchor)
        view = torch.empty(0, dtype=tensor.dtype).set_(
            base.untyped_storage(), tensor.storage_offset(), tensor.size(), tensor.stride()
        )
    setattr(view, _MARK, True)
    return view


_SHARED: dict[str, Pinner] = {}
_SHARED_LOCK = threading.Lock()
_OUTSIDE: list[OutsidePins] = []  # the process's other accountant, once a host shares one


def share_budget(outside: OutsidePins | None) -> None:
    """Make the process-wide pinners share their budget with `outside` (a host calls it once
    it knows another accountant pins in this process; ComfyUI: `comfy_bridge.install`), or
    stop sharing (None). Bytes already pinned move to the new outside total now."""
    with _SHARED_LOCK:
        _OUTSIDE[:] = [] if outside is None else [outside]
        for pinner in _SHARED.values():
            _attach(pinner.budget, outside)


def _attach(budget: PinnedBudget, outside: OutsidePins | None) -> None:
    with budget._lock:
        if budget.outside is outside:
            return
        if budget.outside is not None:
            budget.outside.add(-budget.used)
        budget.outside = outside
        if outside is not None:
            outside.add(budget.used)


def shared_pinner(device: torch.device, simulated: bool) -> Pinner | None:
    """The process-wide pinner for `device`, or None where no copy would use page-locked memory.

    Page-locked memory and registrations are process-wide (two handles over one storage must
    share one registration), so there is one pinner per kind of device, not per handle.
    """
    if device.type != "cuda" or simulated:
        return None  # CPU, simulated device, XPU, MPS (M21)
    mode: PinMode = "copy" if torch.version.hip else "register"
    with _SHARED_LOCK:
        if mode not in _SHARED:
            _SHARED[mode] = Pinner(mode, CudaRegistrar(), PinnedBudget(0, _OUTSIDE[0] if _OUTSIDE else None))
        pinner = _SHARED[mode]
    if isinstance(pinner.registrar, CudaRegistrar):
        pinner.registrar.devices.add(device.index if device.index is not None else torch.cuda.current_device())
    return pinner
