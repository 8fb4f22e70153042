"""`tiled_1d` (M43) and the KV-cache peak (M46)."""
from __future__ import annotations

import pytest
import torch

from mizuoto_runtime import tiled_1d
from mizuoto_runtime.nn.kv_cache import peak_bytes


def upsample(x: torch.Tensor) -> torch.Tensor:
    return x.repeat_interleave(4, dim=-1)


def test_tiled_equals_whole_for_a_pointwise_decoder() -> None:
    frames = torch.randn(1, 3, 700)
    assert torch.allclose(tiled_1d(upsample, frames), upsample(frames), atol=1e-6)


def test_tiles_are_256_frames_with_32_overlap() -> None:
    seen: list[int] = []

    def decode(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[-1])
        return upsample(x)

    out = tiled_1d(decode, torch.randn(1, 1, 600))
    assert seen[0] == 256 and out.shape[-1] == 2400
    assert len(seen) == 3  # starts 0, 224, 448


def test_short_input_is_decoded_whole_and_bad_overlap_rejected() -> None:
    assert tiled_1d(upsample, torch.ones(1, 1, 10)).shape[-1] == 40
    with pytest.raises(ValueError, match="overlap"):
        tiled_1d(upsample, torch.ones(1, 1, 10), tile=8, overlap=8)


def test_peak_bytes_dynamic_and_static() -> None:
    # dynamic: all layers plus one layer's new copy during concatenation, not twice the cache
    assert peak_bytes(100, layers=4, positions=10) == 4 * 1000 + 1000
    # static: buffers doubled to 16 positions, plus one layer's worth while one grows or moves in
    assert peak_bytes(100, layers=4, positions=10, kind="static") == 4 * 1600 + 1600
    assert peak_bytes(100, layers=2, positions=5, rows=2) == 3 * 1000
    with pytest.raises(ValueError, match="kind"):
        peak_bytes(1, 1, 1, kind="paged")  # type: ignore[arg-type]
