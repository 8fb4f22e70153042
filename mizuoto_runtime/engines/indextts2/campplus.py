"""CAM++ speaker embedding (the style vector s2mel is conditioned on), from 80-band kaldi fbank.

Read from upstream's CAMPPlus as a specification: a 2-D residual front end (FCM), a strided TDNN,
three densely connected TDNN blocks whose layers gate a local convolution by context-aware
masking (mean over time + 100-frame segment averages), transit layers, mean+std pooling and a
BatchNorm without affine. Widths are read from the stored tensors, so the real file (growth 32,
bottleneck 128, 128 initial channels) and shrunk test files load alike.
"""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from .config import CAMPPlusSizes

BLOCKS = ((12, 3, 1), (24, 3, 2), (16, 3, 2))  # (layers, kernel, dilation) of the three dense blocks


def bn_relu(channels: int) -> nn.Sequential:
    return nn.Sequential(OrderedDict(batchnorm=nn.BatchNorm1d(channels), relu=nn.ReLU()))


class ResBlock2d(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=(stride, 1), padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=(stride, 1), bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + self.shortcut(x))


class FrontEnd(nn.Module):
    def __init__(self, channels: int, feat_dim: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.layer1 = nn.Sequential(ResBlock2d(channels, channels, 2), ResBlock2d(channels, channels, 1))
        self.layer2 = nn.Sequential(ResBlock2d(channels, channels, 2), ResBlock2d(channels, channels, 1))
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.out_channels = channels * (feat_dim // 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x.unsqueeze(1))))
        out = F.relu(self.bn2(self.conv2(self.layer2(self.layer1(out)))))
        b, c, f, t = out.shape
        return out.reshape(b, c * f, t)


class TDNN(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.linear = nn.Conv1d(cin, cout, kernel, stride=stride, padding=(kernel - 1) // 2, bias=False)
        self.nonlinear = bn_relu(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nonlinear(self.linear(x))


class ContextMask(nn.Module):
    def __init__(self, bn_channels: int, cout: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.linear_local = nn.Conv1d(bn_channels, cout, kernel, padding=(kernel - 1) // 2 * dilation,
                                      dilation=dilation, bias=False)
        self.linear1 = nn.Conv1d(bn_channels, bn_channels // 2, 1)
        self.linear2 = nn.Conv1d(bn_channels // 2, cout, 1)

    @staticmethod
    def segments(x: torch.Tensor, seg: int = 100) -> torch.Tensor:
        pooled = F.avg_pool1d(x, kernel_size=seg, stride=seg, ceil_mode=True)
        return pooled.repeat_interleave(seg, dim=-1)[..., :x.shape[-1]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        context = x.mean(-1, keepdim=True) + self.segments(x)
        gate = torch.sigmoid(self.linear2(F.relu(self.linear1(context))))
        return self.linear_local(x) * gate


class DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int, bn_channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.nonlinear1 = bn_relu(cin)
        self.linear1 = nn.Conv1d(cin, bn_channels, 1, bias=False)
        self.nonlinear2 = bn_relu(bn_channels)
        self.cam_layer = ContextMask(bn_channels, growth, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cam_layer(self.nonlinear2(self.linear1(self.nonlinear1(x))))


class DenseBlock(nn.ModuleDict):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.values():
            x = torch.cat([x, layer(x)], dim=1)
        return x


class Transit(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.nonlinear = bn_relu(cin)
        self.linear = nn.Conv1d(cin, cout, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.nonlinear(x))


class StatsPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x.mean(dim=-1), x.std(dim=-1, unbiased=True)], dim=-1)


class Embedding(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.linear = nn.Conv1d(cin, cout, 1, bias=False)
        self.nonlinear = nn.Sequential(OrderedDict(batchnorm=nn.BatchNorm1d(cout, affine=False)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nonlinear(self.linear(x.unsqueeze(-1)).squeeze(-1))


class CAMPPlus(nn.Module):
    def __init__(self, s: CAMPPlusSizes) -> None:
        super().__init__()
        self.head = FrontEnd(s.head_channels, s.feat_dim)
        xvector: dict[str, nn.Module] = {"tdnn": TDNN(self.head.out_channels, s.init_channels, 5, 2)}
        channels = s.init_channels
        for i, (layers, kernel, dilation) in enumerate(BLOCKS, start=1):
            xvector[f"block{i}"] = DenseBlock({
                f"tdnnd{j + 1}": DenseLayer(channels + j * s.growth_rate, s.growth_rate,
                                            s.bn_size * s.growth_rate, kernel, dilation) for j in range(layers)})
            channels += layers * s.growth_rate
            xvector[f"transit{i}"] = Transit(channels, channels // 2)
            channels //= 2
        xvector["out_nonlinear"] = bn_relu(channels)
        xvector["stats"] = StatsPool()
        xvector["dense"] = Embedding(channels * 2, s.embedding_size)
        self.xvector = nn.Sequential(OrderedDict(xvector))

    def forward(self, fbank: torch.Tensor) -> torch.Tensor:
        """fbank (B, T, 80), mean-normalised over time -> (B, embedding_size)."""
        return self.xvector(self.head(fbank.permute(0, 2, 1)))
