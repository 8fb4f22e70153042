"""HiFi-GAN's residual blocks and their BigVGAN form (issue 32): GPT-SoVITS's decoder (leaky
ReLU), CosyVoice's HiFT (Snake, causal convs in CosyVoice 3) and IndexTTS-2's BigVGAN (AMP
blocks: anti-aliased SnakeBeta).

- `ResBlock1`: per dilation ``d``, ``x = conv2(act2(conv1_d(act1(x)))) + x``, both convs
  length-keeping (zero padded, or causal);
- `ResBlock2`: per dilation ``d``, ``x = conv_d(act(x)) + x``;
- `resblock_mean`: the generators' multi-receptive-field fusion, the blocks' sum in order
  divided by their count.

Parameter names are the published checkpoints' (``convs1.{i}``, ``convs2.{i}``). Where the
activations hold weights, HiFT names them ``activations1.{i}`` / ``activations2.{i}`` and
BigVGAN ``activations.{2i}`` / ``activations.{2i+1}`` (`ActivationNames`): both trees are
built as published, in the order their tiny checkpoints draw random weights, so each file
loads unchanged.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .conv import CausalConv1d

LRELU_SLOPE = 0.1  # HiFi-GAN's slope inside the residual blocks

Activation = Callable[[int], nn.Module]  # channels -> an activation module with weights


class ActivationNames(enum.Enum):
    PAIRS = "pairs"  # HiFT: activations1.{i}, activations2.{i}
    INTERLEAVED = "interleaved"  # BigVGAN's AMPBlock1: activations.{2i}, activations.{2i+1}


def same_padding(kernel_size: int, dilation: int = 1) -> int:
    """Zeros on each side that keep the length of an odd-kernel conv."""
    return (kernel_size * dilation - dilation) // 2


def _conv(channels: int, kernel_size: int, dilation: int, causal: bool) -> nn.Conv1d:
    if causal:
        return CausalConv1d(channels, channels, kernel_size, dilation=dilation)
    return nn.Conv1d(channels, channels, kernel_size, 1, dilation=dilation, padding=same_padding(kernel_size, dilation))


def _leaky_relu(x: torch.Tensor) -> torch.Tensor:
    return F.leaky_relu(x, LRELU_SLOPE)


class ResBlock1(nn.Module):
    """Two convs per dilation; `activation` builds the modules between them (each its own
    weights, named by `names`); without one, leaky ReLU (slope 0.1), as HiFi-GAN."""

    def __init__(self, channels: int, kernel_size: int, dilations: Sequence[int], *,
                 activation: Activation | None = None, names: ActivationNames = ActivationNames.PAIRS,
                 causal: bool = False) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(_conv(channels, kernel_size, d, causal) for d in dilations)
        self.convs2 = nn.ModuleList(_conv(channels, kernel_size, 1, causal) for _ in dilations)
        self.names = names if activation is not None else None
        if activation is None:
            return
        if names is ActivationNames.PAIRS:
            self.activations1 = nn.ModuleList(activation(channels) for _ in dilations)
            self.activations2 = nn.ModuleList(activation(channels) for _ in dilations)
        else:
            self.activations = nn.ModuleList(activation(channels) for _ in range(2 * len(dilations)))

    def _activations(self, i: int) -> tuple[Callable[[torch.Tensor], torch.Tensor],
                                            Callable[[torch.Tensor], torch.Tensor]]:
        if self.names is None:
            return _leaky_relu, _leaky_relu
        if self.names is ActivationNames.PAIRS:
            return self.activations1[i], self.activations2[i]
        return self.activations[2 * i], self.activations[2 * i + 1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, (c1, c2) in enumerate(zip(self.convs1, self.convs2)):
            a1, a2 = self._activations(i)
            x = c2(a2(c1(a1(x)))) + x
        return x


class ResBlock2(nn.Module):
    """One conv per dilation after a leaky ReLU (slope 0.1)."""

    def __init__(self, channels: int, kernel_size: int, dilations: Sequence[int]) -> None:
        super().__init__()
        self.convs = nn.ModuleList(_conv(channels, kernel_size, d, False) for d in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c in self.convs:
            x = c(_leaky_relu(x)) + x
        return x


def resblock_mean(blocks: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """The mean of the blocks' outputs on `x`: summed in order, then divided by their count."""
    total = blocks[0](x)
    for block in blocks[1:]:
        total = total + block(x)
    return total / len(blocks)
