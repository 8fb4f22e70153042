"""`tiled_1d`: the decoder fallback of M43 — 256 frames at a time, 32 of overlap, crossfaded."""
from __future__ import annotations

from collections.abc import Callable

import torch

TILE_FRAMES = 256
OVERLAP_FRAMES = 32


def tiled_1d(decode: Callable[[torch.Tensor], torch.Tensor], frames: torch.Tensor,
             tile: int = TILE_FRAMES, overlap: int = OVERLAP_FRAMES) -> torch.Tensor:
    """Decode `frames` (time last) in tiles and crossfade the overlaps linearly (ComfyUI's
    audio-VAE tiling). The output's time axis is last; samples per frame are inferred."""
    if not 0 <= overlap < tile:
        raise ValueError(f"tiled_1d: need 0 <= overlap ({overlap}) < tile ({tile})")
    total = frames.shape[-1]
    if total <= tile:
        return decode(frames)
    out: torch.Tensor | None = None
    hop = tile - overlap
    per_frame = 0
    for start in range(0, total, hop):
        piece = decode(frames[..., start:start + tile])
        if out is None:
            per_frame = piece.shape[-1] // min(tile, total)
            out = piece.new_zeros(*piece.shape[:-1], total * per_frame)
        begin = start * per_frame
        fade = min(overlap * per_frame, piece.shape[-1]) if start else 0
        if fade:
            ramp = torch.linspace(0, 1, fade, dtype=piece.dtype, device=piece.device)
            out[..., begin:begin + fade] = out[..., begin:begin + fade] * (1 - ramp) + piece[..., :fade] * ramp
        out[..., begin + fade:begin + piece.shape[-1]] = piece[..., fade:]
        if start + tile >= total:
            break
    assert out is not None
    return out
