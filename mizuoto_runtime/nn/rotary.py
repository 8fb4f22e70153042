"""Rotary position embeddings (RoPE) in both layouts.

* "halves" (Qwen2/Qwen3/Llama in transformers): channel ``i`` turns with channel
  ``i + head_dim/2``. `RotaryEmbedding` computes the angles as transformers does (inverse
  frequencies from an int64 arange cast to float32, one float32 product per position and
  frequency), so cos/sin are bit-equal to its ``Qwen2RotaryEmbedding`` for the default rope type.
* "pairs" (Meta's Llama reference, x-transformers): channels ``2i`` and ``2i + 1`` turn
  together, by `pair_frequencies`. `pair_table` is the table as a complex polar per (position,
  pair), rounded to the dtype the upstream model kept it in (Fish Speech: bfloat16; IndexTTS-2's
  DiT: float32), and `apply_pair_table` rotates in float32. CosyVoice 3's DiT (x-transformers)
  instead turns by full-width cos/sin in the run dtype through `apply_rotary`.

`apply_rotary` rotates by full-width cos/sin in either layout, in the inputs' dtypes (one
formula: ``x * cos + rotate(x) * sin``).
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import nn

Layout = Literal["halves", "pairs"]


def inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """``1 / theta ** (2i / head_dim)`` for ``i < head_dim / 2``, float32."""
    if head_dim % 2:
        raise ValueError(f"rotary: head_dim must be even, got {head_dim}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta ** exponents)


class RotaryEmbedding(nn.Module):
    """cos and sin of shape ``(batch, positions, head_dim)`` for integer `positions` ("halves")."""

    def __init__(self, head_dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta
        self.register_buffer("inv_freq", inverse_frequencies(head_dim, theta), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """`positions`: ``(batch, n)`` integer positions."""
        inv = self.inv_freq[None, :, None].to(torch.float32).expand(positions.shape[0], -1, 1)
        pos = positions[:, None, :].to(torch.float32)
        freqs = (inv.to(positions.device) @ pos).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(a, b) -> (-b, a)`` on the two halves of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """``(a, b) -> (-b, a)`` on adjacent pairs of the last dimension (x-transformers' form)."""
    a, b = x.unflatten(-1, (-1, 2)).unbind(dim=-1)
    return torch.stack((-b, a), dim=-1).flatten(-2)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: Layout = "halves") -> torch.Tensor:
    """``x * cos + rotate(x) * sin``; cos/sin full width, broadcastable to `x`."""
    if layout == "halves":
        return (x * cos) + (rotate_half(x) * sin)
    if layout == "pairs":
        return (x * cos) + (rotate_pairs(x) * sin)
    raise ValueError(f"rotary: layout must be 'halves' or 'pairs', got {layout!r}")


def pair_frequencies(head_dim: int, base: float = 10000.0, device: torch.device | None = None) -> torch.Tensor:
    """``1 / base ** (2i / head_dim)`` for ``i < head_dim / 2``, float32, as the pairs layout's
    upstreams compute it (from an int64 arange on `device`)."""
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device)[: head_dim // 2].float() / head_dim))


def pair_table(positions: torch.Tensor, head_dim: int, base: float = 10000.0,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(len(positions), head_dim/2, 2)``: (cos, sin) per position and pair, computed in float32
    (``torch.polar``, as upstream's ``freqs_cis``) on `positions`' device, then cast to `dtype`."""
    freqs = pair_frequencies(head_dim, base, positions.device)
    angles = torch.outer(positions.float(), freqs)
    cis = torch.polar(torch.ones_like(angles), angles)
    return torch.stack([cis.real, cis.imag], dim=-1).to(dtype)


def apply_pair_table(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of `x` ``(B, S, H, D)`` by `table` ``(S, D/2, 2)``, in float32, back
    to `x`'s dtype."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    t = table.view(1, pairs.size(1), 1, pairs.size(3), 2)
    out = torch.stack([pairs[..., 0] * t[..., 0] - pairs[..., 1] * t[..., 1],
                       pairs[..., 1] * t[..., 0] + pairs[..., 0] * t[..., 1]], -1)
    return out.flatten(3).type_as(x)
