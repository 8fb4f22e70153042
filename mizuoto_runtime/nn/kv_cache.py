"""KV caches of autoregressive LMs: the peak of a growing cache (M46) and the static
`BufferCache` (M53).

`BufferCache` is what ``compute.kv_cache = static`` puts under a Qwen-family LM: per layer one
key and one value buffer, preallocated, written in place at each step and doubled when full
(no per-step concatenation, no temporary copy of the whole cache per step). Attention reads
views of the first `length` positions, with the buffer's strides (M53: some kernels may then
sum in another order; identical on CPU, opt-in on GPU until verified). It speaks the one
method the upstream attention layers call, ``update(key, value, layer_idx, cache_kwargs)``,
plus ``get_seq_length``, so engines pass it where a transformers cache goes.
"""
from __future__ import annotations

from typing import Any, Literal

import torch

Kind = Literal["dynamic", "static"]


def capacity_for(positions: int, minimum: int = 1) -> int:
    """The buffer capacity a static cache has once it holds `positions`: a power of two."""
    capacity = max(1, minimum)
    while capacity < positions:
        capacity *= 2
    return capacity


def peak_bytes(position_bytes: int, layers: int, positions: int, kind: Kind = "dynamic", rows: int = 1) -> int:
    """Peak bytes of a KV cache that grows to `positions` (M46).

    `position_bytes`: bytes one position takes in one layer (keys + values, all heads, in the
    precision the model computes in). `dynamic`: all layers plus one layer's new copy during a
    step's concatenation (each layer's old tensor is freed before the next layer runs).
    `static` (`BufferCache`): every layer's buffer at the final capacity, plus one layer's
    worth more: while a layer doubles, its old buffer (half a buffer) lives beside the new
    one, and while a prefilled cache is moved in (`BufferCache.adopt`), one layer's prefill
    tensors (at most one buffer) live beside its new buffer.
    """
    if min(position_bytes, layers, positions, rows) < 0:
        raise ValueError("peak_bytes: sizes must be >= 0")
    if kind == "dynamic":
        per_layer = position_bytes * positions * rows
        return layers * per_layer + per_layer
    if kind == "static":
        buffer = position_bytes * capacity_for(positions) * rows
        return layers * buffer + buffer
    raise ValueError(f"peak_bytes: kind must be 'dynamic' or 'static', got {kind!r}")


class BufferCache:
    """Per-layer key/value buffers written in place, doubling when full (M53).

    Buffers have shape ``(batch, heads, capacity, head_dim)``; `update` writes the new positions
    at ``[length, length + n)`` and returns views of ``[0, length + n)``. `reset` keeps the
    buffers and forgets their contents (a cache reused for every frame, as the Qwen3-TTS code
    predictor's 16 positions are). `min_capacity` is the first allocation; a buffer that must
    grow doubles until the new positions fit, copies what it held and frees the old one.
    """

    def __init__(self, min_capacity: int = 1) -> None:
        if min_capacity < 1:
            raise ValueError(f"BufferCache: min_capacity must be >= 1, got {min_capacity}")
        self.min_capacity = min_capacity
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths: list[int] = []

    # ---- the cache protocol the upstream attention layers use --------------------------------
    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int,
               cache_kwargs: dict[str, Any] | None = None, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `key`/`value` (``(batch, heads, n, head_dim)``) to layer `layer_idx`; return the
        layer's keys and values so far. (transformers 5.x's own layers pass ``kwargs=``; 4.x's
        and qwen-tts's pass ``cache_kwargs``: neither is needed here.)"""
        if layer_idx > len(self.keys):
            raise ValueError(f"BufferCache: layer {layer_idx} updated before layer {len(self.keys)}")
        n = key.shape[-2]
        if layer_idx == len(self.keys):
            capacity = capacity_for(n, self.min_capacity)
            self.keys.append(self._alloc(key, capacity))
            self.values.append(self._alloc(value, capacity))
            self.lengths.append(0)
        start = self.lengths[layer_idx]
        if start + n > self.keys[layer_idx].shape[-2]:
            self._grow(layer_idx, start + n)
        end = start + n
        self.keys[layer_idx][:, :, start:end].copy_(key)
        self.values[layer_idx][:, :, start:end].copy_(value)
        self.lengths[layer_idx] = end
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.lengths[layer_idx] if layer_idx < len(self.lengths) else 0

    # ---- ours ----------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every position; keep the buffers."""
        self.lengths = [0] * len(self.lengths)

    def adopt(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Take over a prefilled cache, layer by layer: each layer's tensors are copied in and
        the caller's references dropped (the lists are emptied), so at most one layer exists
        twice (what `peak_bytes(kind="static")` allows for)."""
        if len(keys) != len(values):
            raise ValueError(f"BufferCache.adopt: {len(keys)} key layers but {len(values)} value layers")
        if self.keys:
            raise ValueError("BufferCache.adopt: the cache already holds layers")
        for layer in range(len(keys)):
            key, value = keys[layer], values[layer]
            keys[layer] = values[layer] = None  # type: ignore[call-overload]
            self.update(key, value, layer)
            del key, value
        keys.clear()
        values.clear()

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[-2] if self.keys else 0

    @property
    def allocated_bytes(self) -> int:
        """Bytes the buffers take now (what the cache really holds, M46)."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    @staticmethod
    def _alloc(like: torch.Tensor, capacity: int) -> torch.Tensor:
        batch, heads, _, dim = like.shape
        return torch.empty(batch, heads, capacity, dim, dtype=like.dtype, device=like.device)

    def _grow(self, layer_idx: int, needed: int) -> None:
        """Double layer `layer_idx`'s buffers until `needed` positions fit; the old ones are
        freed before the next layer grows."""
        old_k, old_v = self.keys[layer_idx], self.values[layer_idx]
        capacity = capacity_for(needed, old_k.shape[-2])
        length = self.lengths[layer_idx]
        for store, old in ((self.keys, old_k), (self.values, old_v)):
            new = self._alloc(old, capacity)
            new[:, :, :length].copy_(old[:, :, :length])
            store[layer_idx] = new
        del old_k, old_v
