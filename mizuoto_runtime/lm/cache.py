"""KV-cache memory: the peak of a growing cache (M46)."""
from __future__ import annotations

from typing import Literal


def peak_bytes(
    position_bytes: int, layers: int, positions: int, kind: Literal["dynamic", "static"] = "dynamic", rows: int = 1
) -> int:
    """Peak bytes of a KV cache that grows to `positions` (M46).

    `position_bytes`: bytes one position takes in one layer (keys + values, all heads, in the
    precision the model computes in). `dynamic`: all layers plus one layer's new copy during a
    step's concatenation (each layer's old tensor is freed before the next layer runs).
    `static`: the doubled buffer plus one old buffer while it grows.
    """
    if min(position_bytes, layers, positions, rows) < 0:
        raise ValueError("peak_bytes: sizes must be >= 0")
    per_layer = position_bytes * positions * rows
    if kind == "dynamic":
        return layers * per_layer + per_layer
    if kind == "static":
        capacity = 1
        while capacity < positions:
            capacity *= 2
        buffer = position_bytes * capacity * rows
        return layers * buffer + buffer // 2
    raise ValueError(f"peak_bytes: kind must be 'dynamic' or 'static', got {kind!r}")
