"""The perceiver resampler: a fixed number of learnt latents cross-attend to the conditioning.

As upstream reads it: the context is projected to the latent width (when it differs), each
layer attends over [latents; context] with 64-wide heads, masked positions get -max (not
-inf), a GEGLU feed-forward of inner width int(dim * mult * 2 / 3), then an RMS norm scaled
by sqrt(dim).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

HEAD_DIM = 64


class CrossAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, HEAD_DIM * heads, bias=False)
        self.to_kv = nn.Linear(dim, HEAD_DIM * heads * 2, bias=False)
        self.to_out = nn.Linear(HEAD_DIM * heads, dim, bias=False)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.heads, -1).transpose(1, 2)

    def forward(self, latents: torch.Tensor, context: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        context = torch.cat((latents, context), dim=-2)
        q = self._split(self.to_q(latents))
        k, v = (self._split(z) for z in self.to_kv(context).chunk(2, dim=-1))
        sim = torch.einsum("bhid,bhjd->bhij", q, k) * (q.shape[-1] ** -0.5)
        if mask is not None:
            sim = sim.masked_fill(~mask[:, None, None, :], -torch.finfo(sim.dtype).max)
        out = torch.einsum("bhij,bhjd->bhid", sim.softmax(dim=-1), v)
        b, h, n, d = out.shape
        return self.to_out(out.transpose(1, 2).reshape(b, n, h * d))


class GegluFeedForward(nn.Sequential):
    """Keys `0` and `2` as stored: Linear(dim, 2*inner), GEGLU, Linear(inner, dim)."""

    def __init__(self, dim: int, mult: float) -> None:
        inner = int(dim * mult * 2 / 3)
        super().__init__(nn.Linear(dim, inner * 2), Geglu(), nn.Linear(inner, dim))


class Geglu(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, gate = x.chunk(2, dim=-1)
        return F.gelu(gate) * x


class ScaledRMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = dim ** 0.5
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1) * self.scale * self.gamma


class PerceiverResampler(nn.Module):
    def __init__(self, dim: int, dim_context: int, num_latents: int, heads: int, ff_mult: float,
                 depth: int = 2) -> None:
        super().__init__()
        self.proj_context = nn.Linear(dim_context, dim) if dim_context != dim else nn.Identity()
        self.latents = nn.Parameter(torch.zeros(num_latents, dim))
        self.layers = nn.ModuleList(
            nn.ModuleList([CrossAttention(dim, heads), GegluFeedForward(dim, ff_mult)]) for _ in range(depth))
        self.norm = ScaledRMSNorm(dim)

    def forward(self, context: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """context (B, T, dim_context), mask (B, num_latents + T) -> (B, num_latents, dim)."""
        context = self.proj_context(context)
        latents = self.latents.unsqueeze(0).expand(context.shape[0], -1, -1)
        for attn, ff in self.layers:
            latents = attn(latents, context, mask) + latents
            latents = ff(latents) + latents
        return self.norm(latents)
