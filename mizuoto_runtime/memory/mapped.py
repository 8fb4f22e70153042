"""Host tensors that are a checkpoint file's own pages (M27; issue 34: VibeVoice-7B beside its
device copy in 24 GB of RAM).

`nn.loading` keeps a tensor that needs no conversion as a view of its memory-mapped checkpoint
(a private, copy-on-write mapping): its pages are the page cache's, read when first used and
given back by the kernel under memory pressure, so a model's host copies cost RAM only while
they are read. A write goes to a private copy of the page; the file never changes.

Such memory is used in place only where a fresh allocation would be aligned the same:
`ALIGNMENT` bytes, the CPU allocator's own (c10's `gAlignment`). A CPU kernel may choose its path
by a pointer's alignment (MKL documents alignment as a condition of reproducible results), so a
tensor computed on where it lies in the file must not be aligned differently from a copy.

The pinner must not register this memory in place: neighbouring tensors share pages, so their
registrations would overlap, and locking a private file mapping copies every page anyway.
`file_backed` tells it which host tensors these are.
"""
from __future__ import annotations

import ctypes
import mmap
import threading
import weakref

import torch

ALIGNMENT = 64
_lock = threading.Lock()
_maps: dict[int, tuple[int, int]] = {}  # id of a live mapping -> (first address, length)


def track(mapping: mmap.mmap) -> int:
    """Remember a writable mapping's address range for as long as it lives; returns its address."""
    probe = ctypes.c_char.from_buffer(mapping)  # an export: dropped at once so the map can close
    start = ctypes.addressof(probe)
    del probe
    key = id(mapping)
    with _lock:
        _maps[key] = (start, len(mapping))
    weakref.finalize(mapping, _forget, key)
    return start


def _forget(key: int) -> None:
    with _lock:
        _maps.pop(key, None)


def file_backed(tensor: torch.Tensor) -> bool:
    """Whether `tensor`'s memory lies in a tracked checkpoint mapping."""
    if tensor.device.type != "cpu":
        return False
    ptr = tensor.untyped_storage().data_ptr()
    with _lock:
        return any(start <= ptr < start + length for start, length in _maps.values())
