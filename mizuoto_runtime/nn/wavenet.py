"""The VITS WaveNet (upstream's ``modules.WN``), issue 32: gated dilated convs with a global
condition, residual and skip outputs. GPT-SoVITS's flow (zero-padded convs, dilation one, the
condition optional) and IndexTTS-2's s2mel (reflect-padded convs, `ReflectConv1d`, whose key
path is ``conv.conv``) use it; `conv` builds each layer, so the parameter names stay the
published ones. Inference only (no dropout).

Per layer ``i`` (dilation ``dilation_rate ** i``): ``a = in_i(x) + cond_i``, gated
``tanh(a[:h]) * sigmoid(a[h:])``, then the 1x1 ``res_skip_i``; all but the last layer add their
first half to ``x`` (masked) and their second half to the output, the last adds all of it.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

ConvFactory = Callable[[int, int, int, int], nn.Module]  # (in, out, kernel, dilation) -> a length-keeping conv


def zero_padded_conv(in_channels: int, out_channels: int, kernel_size: int, dilation: int) -> nn.Module:
    return nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation,
                     padding=(kernel_size * dilation - dilation) // 2)


class WaveNet(nn.Module):
    """`layers` gated layers of width `hidden`; `gin` condition channels (0: no condition)."""

    def __init__(self, hidden: int, kernel_size: int, layers: int, gin: int, *, dilation_rate: int = 1,
                 conv: ConvFactory = zero_padded_conv) -> None:
        super().__init__()
        self.hidden = hidden
        self.cond_layer = conv(gin, 2 * hidden * layers, 1, 1) if gin else None
        self.in_layers = nn.ModuleList(
            conv(hidden, 2 * hidden, kernel_size, dilation_rate ** i) for i in range(layers))
        self.res_skip_layers = nn.ModuleList(
            conv(hidden, 2 * hidden if i < layers - 1 else hidden, 1, 1) for i in range(layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
        h = self.hidden
        out = torch.zeros_like(x)
        cond = self.cond_layer(g) if (g is not None and self.cond_layer is not None) else None
        last = len(self.in_layers) - 1
        for i, (in_layer, res_skip) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            x_in = in_layer(x)
            # Without a condition upstream adds zeros: kept, as it turns a -0.0 into +0.0.
            a = x_in + (cond[:, i * 2 * h:(i + 1) * 2 * h] if cond is not None else torch.zeros_like(x_in))
            acts = res_skip(torch.tanh(a[:, :h]) * torch.sigmoid(a[:, h:]))
            if i < last:
                x = (x + acts[:, :h]) * mask
                out = out + acts[:, h:]
            else:
                out = out + acts
        return out * mask
