"""The Snake activations of the GAN vocoders and codecs (issue 32): ``x + sin(alpha x)^2 / beta``
with per-channel ``alpha`` (and ``beta = alpha`` for Snake), ``1e-9`` added to the divisor.

- `Snake`: CosyVoice's HiFT (alpha stored ``(C,)``) and Fish Speech's DAC codec (alpha stored as a
  ``(1, C, 1)`` column, `column=True`), both on the linear scale;
- `SnakeBeta`: BigVGAN v2 (IndexTTS-2's vocoder), alpha and beta stored ``(C,)``, on the log scale
  when its config sets ``snake_logscale``.

Parameter names and shapes are the published checkpoints'. One formula for all three, with the
operations in upstream's order: the divisor as a reciprocal (what ``1.0 / t`` computes in torch)
times the squared sine, added to ``x``.
"""
from __future__ import annotations

import torch
from torch import nn

EPSILON = 1e-9


def snake(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """``x + sin(alpha x)^2 / (beta + 1e-9)``; `alpha` and `beta` broadcast over ``x`` ``(B, C, T)``."""
    return x + (beta + EPSILON).reciprocal() * torch.sin(x * alpha).pow(2)


def _per_channel(p: torch.Tensor) -> torch.Tensor:
    """A ``(C,)`` parameter as ``(1, C, 1)``; a stored ``(1, C, 1)`` column as it is."""
    return p if p.ndim == 3 else p[None, :, None]


class Snake(nn.Module):
    """``x + sin(alpha x)^2 / (alpha + 1e-9)``; alpha starts at one (log scale: at zero)."""

    def __init__(self, channels: int, *, logscale: bool = False, column: bool = False) -> None:
        super().__init__()
        self.logscale = logscale
        shape = (1, channels, 1) if column else (channels,)
        self.alpha = nn.Parameter(torch.zeros(shape) if logscale else torch.ones(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = _per_channel(self.alpha)
        if self.logscale:
            alpha = torch.exp(alpha)
        return snake(x, alpha, alpha)


class SnakeBeta(nn.Module):
    """``x + sin(alpha x)^2 / (beta + 1e-9)``: BigVGAN v2's activation, frequency and magnitude
    apart (both start at one; log scale: at zero)."""

    def __init__(self, channels: int, *, logscale: bool = False) -> None:
        super().__init__()
        self.logscale = logscale
        init = torch.zeros if logscale else torch.ones
        self.alpha = nn.Parameter(init(channels))
        self.beta = nn.Parameter(init(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha, beta = _per_channel(self.alpha), _per_channel(self.beta)
        if self.logscale:
            alpha, beta = torch.exp(alpha), torch.exp(beta)
        return snake(x, alpha, beta)
