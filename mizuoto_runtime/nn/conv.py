"""Padded 1-D convolutions more than one model uses (issue 32).

- `CausalConv1d`: CosyVoice's causal conv (its flow U-Net and its HiFT vocoder): zeros on the
  left so that output ``t`` sees no input after ``t`` (or, `right=True`, on the right: a conv
  that looks ahead), the output as long as the input at stride one.
It is a plain layer: weight norm, where a checkpoint stores it, is folded at load
(`mizuoto_runtime.nn.weight_norm`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def causal_padding(kernel_size: int, dilation: int = 1) -> int:
    """CosyVoice's ``(k*d - d) // 2 * 2 + (k + 1) % 2``: ``(k - 1) * d`` for an odd kernel,
    ``k - 1`` for an even one at dilation one."""
    return int((kernel_size * dilation - dilation) / 2) * 2 + (kernel_size + 1) % 2


class CausalConv1d(nn.Conv1d):
    """A conv with `padding` zeros on the left (on the right with `right=True`); by default
    `causal_padding` of its kernel and dilation, which keeps the length at stride one."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, *,
                 stride: int = 1, right: bool = False, padding: int | None = None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, dilation=dilation)
        self.causal_padding = causal_padding(kernel_size, dilation) if padding is None else padding
        self.right = right

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = (0, self.causal_padding) if self.right else (self.causal_padding, 0)
        return super().forward(F.pad(x, pad, value=0.0))
