"""The 1-D ConvNeXt block (Vocos' form), issue 32: IndexTTS-2's semantic codec (a zero-padded
depthwise conv) and Fish Speech's codec quantizer (a causal one, passed in as `dwconv`).

``x + gamma * pwconv2(gelu(pwconv1(LayerNorm(dwconv(x)))))``, the norm and the pointwise layers
over channels last; LayerNorm's eps is 1e-6. Parameter names are Vocos' (``dwconv``, ``norm``,
``pwconv1``, ``pwconv2``, ``gamma``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KERNEL = 7


class ConvNeXtBlock(nn.Module):
    """`dim` channels, `inner` in the pointwise layers; `dwconv` the depthwise conv (default:
    kernel 7 zero-padded to keep the length)."""

    def __init__(self, dim: int, inner: int, dwconv: nn.Module | None = None) -> None:
        super().__init__()
        self.dwconv = dwconv if dwconv is not None else nn.Conv1d(dim, dim, KERNEL, padding=KERNEL // 2, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, inner)
        self.pwconv2 = nn.Linear(inner, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(self.dwconv(x).transpose(1, 2)))))
        return x + (self.gamma * y).transpose(1, 2)
