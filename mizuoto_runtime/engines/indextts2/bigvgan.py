"""BigVGAN v2 generator (nvidia/bigvgan_v2_22khz_80band_256x): mel (B, 80, T) -> wave (B, 1, 256 T).

Our own module rather than the `bigvgan` package. Checked on its latest release (2.4.1, the
wheel downloaded and read, Dec 2026): its `BigVGAN.from_pretrained(folder)` would load the
published generator (config.json + bigvgan_generator.pt, weight_g/weight_v keys), but the
package does not fit the one environment. `import bigvgan` runs its `utils` module, which imports
matplotlib (not installed: the import fails), and its meldataset (librosa, tqdm); its declared
requirements add auraloss, matplotlib, ninja, nnaudio, pesq (published only as source, a C
build) and tensorboard, none of which the environment has or needs. Read from upstream's
copy as a specification: weight-normed convolutions (folded when loading, as upstream removes
weight norm before inference), transposed-conv upsampling, AMP residual blocks whose SnakeBeta
activations run at twice the rate between stored low-pass filters (replicate padding), and a
final SnakeBeta + conv clamped to [-1, 1] (or tanh when the config asks).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ...nn.hifigan import ActivationNames, ResBlock1, resblock_mean
from ...nn.snake import SnakeBeta
from .config import BigVGANConfig

FILTER_TAPS = 12  # the anti-aliasing filters of a 2x resampler


class Upsample2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("filter", torch.zeros(1, 1, FILTER_TAPS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = FILTER_TAPS // 2 - 1
        crop_left = pad * 2 + (FILTER_TAPS - 2) // 2
        crop_right = pad * 2 + (FILTER_TAPS - 2 + 1) // 2
        y = 2 * F.conv_transpose1d(F.pad(x, (pad, pad), mode="replicate"),
                                   self.filter.expand(x.shape[1], -1, -1), stride=2, groups=x.shape[1])
        return y[..., crop_left:-crop_right]


class LowPass(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("filter", torch.zeros(1, 1, FILTER_TAPS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, (FILTER_TAPS // 2 - 1, FILTER_TAPS // 2), mode="replicate")
        return F.conv1d(x, self.filter.expand(x.shape[1], -1, -1), stride=2, groups=x.shape[1])


class Downsample2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lowpass = LowPass()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lowpass(x)


class AntiAliasedSnake(nn.Module):
    def __init__(self, channels: int, logscale: bool) -> None:
        super().__init__()
        self.act = SnakeBeta(channels, logscale=logscale)
        self.upsample = Upsample2()
        self.downsample = Downsample2()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.downsample(self.act(self.upsample(x)))


def _amp_block(channels: int, kernel: int, dilations: tuple[int, ...], logscale: bool) -> ResBlock1:
    """BigVGAN's ``AMPBlock1``: HiFi-GAN's resblock 1 with anti-aliased SnakeBeta activations."""
    return ResBlock1(channels, kernel, dilations, activation=functools.partial(AntiAliasedSnake, logscale=logscale),
                     names=ActivationNames.INTERLEAVED)


class BigVGAN(nn.Module):
    def __init__(self, h: BigVGANConfig) -> None:
        super().__init__()
        self.h = h
        ch = h.upsample_initial_channel
        self.conv_pre = nn.Conv1d(h.num_mels, ch, 7, 1, padding=3)
        self.ups = nn.ModuleList(
            nn.ModuleList([nn.ConvTranspose1d(ch // 2 ** i, ch // 2 ** (i + 1), k, u, padding=(k - u) // 2)])
            for i, (u, k) in enumerate(zip(h.upsample_rates, h.upsample_kernel_sizes)))
        self.resblocks = nn.ModuleList(
            _amp_block(ch // 2 ** (i + 1), k, d, h.snake_logscale)
            for i in range(len(h.upsample_rates))
            for k, d in zip(h.resblock_kernel_sizes, h.resblock_dilation_sizes))
        last = ch // 2 ** len(h.upsample_rates)
        self.activation_post = AntiAliasedSnake(last, h.snake_logscale)
        self.conv_post = nn.Conv1d(last, 1, 7, 1, padding=3, bias=h.use_bias_at_final)

    def memory_units(self) -> list[nn.Module]:
        """M11: each upsampling conv and each AMP block moves on its own."""
        return [*self.ups, *self.resblocks]

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.conv_pre(mel)
        kernels = len(self.h.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            x = up[0](x)
            x = resblock_mean(self.resblocks[i * kernels:(i + 1) * kernels], x)
        x = self.conv_post(self.activation_post(x))
        return torch.tanh(x) if self.h.use_tanh_at_final else torch.clamp(x, min=-1.0, max=1.0)
