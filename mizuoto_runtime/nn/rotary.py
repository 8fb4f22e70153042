"""Rotary position embeddings (RoPE) in the "rotate half" layout of Qwen2/Qwen3/Llama.

The angles are computed as transformers does (inverse frequencies from an int64 arange cast to
float32, one float32 product per position and frequency), so cos/sin are bit-equal to its
``Qwen2RotaryEmbedding`` for the default rope type.
"""
from __future__ import annotations

import torch
from torch import nn


def inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """``1 / theta ** (2i / head_dim)`` for ``i < head_dim / 2``, float32."""
    if head_dim % 2:
        raise ValueError(f"rotary: head_dim must be even, got {head_dim}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta ** exponents)


class RotaryEmbedding(nn.Module):
    """cos and sin of shape ``(batch, positions, head_dim)`` for integer `positions`."""

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
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` ``(batch, heads, n, head_dim)`` by cos/sin ``(batch, n, head_dim)``."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (x * cos) + (rotate_half(x) * sin)
