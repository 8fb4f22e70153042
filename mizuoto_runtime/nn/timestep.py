"""The timestep embedding of flow-matching estimators: a sinusoidal embedding of ``1000 t``
through ``Linear -> SiLU -> Linear``.

Two sinusoids, each computed as its upstream computes it (the numbers differ in the last bits):

* ``"sin_cos"`` (Matcha-TTS / F5-TTS ``SinusPositionEmbedding``; CosyVoice's UNet and DiT):
  ``[sin, cos]`` with frequencies ``exp(-i log(1e4) / (half - 1))`` made per call on t's
  device, cast to t's dtype before the MLP;
* ``"cos_sin"`` (DiT's ``TimestepEmbedder``; IndexTTS-2's s2mel): ``[cos, sin]`` of float32
  ``t`` with frequencies ``exp(-log(1e4) i / half)`` kept as the stored buffer ``freqs``.

Checkpoints place the MLP's Linears three ways; `mlp` names the ``nn.Sequential`` holding them
(``time_mlp.0``, ``mlp.0`` ...), or None puts them on the module itself as diffusers' names
them (``linear_1``, ``linear_2``).
"""
from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Sinusoid = Literal["sin_cos", "cos_sin"]


def sinusoidal_embedding(t: torch.Tensor, dim: int, scale: float = 1000) -> torch.Tensor:
    """Matcha's / F5's ``SinusoidalPosEmb``: ``[sin, cos]`` of ``scale * t * exp(-i log(1e4)/(half-1))``."""
    if t.ndim < 1:
        t = t.unsqueeze(0)
    half = dim // 2
    freq = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
    emb = scale * t.unsqueeze(1) * freq.unsqueeze(0)
    return torch.cat((emb.sin(), emb.cos()), dim=-1)


class TimestepEmbedding(nn.Module):
    """``(batch,)`` times -> ``(batch, dim)``: `sinusoid` of width `freq_dim`, then the MLP."""

    def __init__(self, dim: int, freq_dim: int = 256, *, sinusoid: Sinusoid = "sin_cos",
                 mlp: str | None = "mlp") -> None:
        super().__init__()
        if sinusoid not in ("sin_cos", "cos_sin"):
            raise ValueError(f"timestep embedding: sinusoid must be 'sin_cos' or 'cos_sin', got {sinusoid!r}")
        self.freq_dim, self.sinusoid, self.mlp_name = freq_dim, sinusoid, mlp
        if sinusoid == "cos_sin":
            half = freq_dim // 2
            self.register_buffer("freqs", torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half))
        first, second = nn.Linear(freq_dim, dim), nn.Linear(dim, dim)
        if mlp is None:
            self.linear_1, self.linear_2 = first, second
        else:
            self.add_module(mlp, nn.Sequential(first, nn.SiLU(), second))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        if self.sinusoid == "cos_sin":
            args = 1000 * t[:, None].float() * self.freqs[None]
            emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        else:
            emb = sinusoidal_embedding(t, self.freq_dim).to(t.dtype)
        if self.mlp_name is not None:
            out: torch.Tensor = getattr(self, self.mlp_name)(emb)
            return out
        return self.linear_2(F.silu(self.linear_1(emb)))
