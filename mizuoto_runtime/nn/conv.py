"""Padded 1-D convolutions more than one model uses (issue 32).

- `CausalConv1d`: CosyVoice's causal conv (its flow U-Net, its DiT's position embedding and its
  HiFT vocoder): zeros on the left so that output ``t`` sees no input after ``t`` (or,
  `right=True`, on the right: a conv that looks ahead), the output as long as the input at
  stride one.
- `ReflectConv1d`: a conv padded by reflection to keep the length (IndexTTS-2's s2mel WaveNet;
  upstream's ``SConv1d``, whose ``conv.conv`` key path it keeps).

Both are plain layers: weight norm, where a checkpoint stores it, is folded at load
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
                 stride: int = 1, groups: int = 1, right: bool = False, padding: int | None = None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, dilation=dilation, groups=groups)
        self.causal_padding = causal_padding(kernel_size, dilation) if padding is None else padding
        self.right = right

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = (0, self.causal_padding) if self.right else (self.causal_padding, 0)
        return super().forward(F.pad(x, pad, value=0.0))


class _Holder(nn.Module):
    """Upstream's ``NormConv1d`` (weight norm folded): the conv under ``conv``."""

    def __init__(self, conv: nn.Conv1d) -> None:
        super().__init__()
        self.conv = conv


class ReflectConv1d(nn.Module):
    """A stride-one conv padded by reflection to keep the length: ``(k - 1) * d`` samples, the
    odd one on the left. Inputs shorter than the padding are zero-extended on the right first
    (reflection needs more samples than it pads), and the extension is cut off again. The conv's
    key path is upstream's ``SConv1d`` > ``NormConv1d`` > ``Conv1d``: ``conv.conv``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1) -> None:
        super().__init__()
        self.conv = _Holder(nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation))
        total = (kernel_size - 1) * dilation
        self.pad = (total - total // 2, total // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pad != (0, 0):
            extra = max(self.pad) - x.shape[-1] + 1 if x.shape[-1] <= max(self.pad) else 0
            x = F.pad(F.pad(x, (0, extra)), self.pad, mode="reflect")
            x = x[..., :x.shape[-1] - extra]
        return self.conv.conv(x)
