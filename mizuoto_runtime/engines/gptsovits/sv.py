"""ERes2NetV2, the speaker-verification network v2Pro / v2ProPlus condition SoVITS on, written from
reading upstream's ``eres2net/ERes2NetV2.py``, ``fusion.py`` and ``sv.py`` (MIT).

Only ``forward3`` runs (what upstream's ``SV.compute_embedding3`` calls): the fused stage-3/4
feature map flattened over channels x frequency and averaged over time — 20480 values for the
published ``pretrained_eres2netv2w24s4ep4.ckpt`` (baseWidth 24, scale 4, expansion 4, m_channels
64, blocks [3, 4, 6, 3]). The pooling and embedding layers of the checkpoint (``seg_1``) are
not used by that path; they are read and kept so the file loads strictly.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .config import SVConfig


def _relu20(x: torch.Tensor) -> torch.Tensor:
    """Upstream's ``ReLU`` is a Hardtanh(0, 20)."""
    return F.hardtanh(x, 0.0, 20.0)


class AFF(nn.Module):
    """Attentional feature fusion of two maps of the same shape."""

    def __init__(self, channels: int, r: int = 4) -> None:
        super().__init__()
        inter = channels // r
        self.local_att = nn.Sequential(
            nn.Conv2d(channels * 2, inter, 1), nn.BatchNorm2d(inter), nn.SiLU(),
            nn.Conv2d(inter, channels, 1), nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor, ds_y: torch.Tensor) -> torch.Tensor:
        att = 1.0 + torch.tanh(self.local_att(torch.cat((x, ds_y), dim=1)))
        return torch.mul(x, att) + torch.mul(ds_y, 2.0 - att)


class Block(nn.Module):
    """Res2Net-style block; with `fuse`, the scales are joined by AFF instead of a sum."""

    def __init__(self, in_planes: int, planes: int, stride: int, cfg: SVConfig, fuse: bool) -> None:
        super().__init__()
        width = int(math.floor(planes * (cfg.base_width / 64.0)))
        self.width = width
        self.conv1 = nn.Conv2d(in_planes, width * cfg.scale, 1, stride=stride, bias=False)
        self.bn1 = nn.BatchNorm2d(width * cfg.scale)
        self.convs = nn.ModuleList(nn.Conv2d(width, width, 3, padding=1, bias=False) for _ in range(cfg.scale))
        self.bns = nn.ModuleList(nn.BatchNorm2d(width) for _ in range(cfg.scale))
        if fuse:
            self.fuse_models = nn.ModuleList(AFF(width, 4) for _ in range(cfg.scale - 1))
        self.fuse = fuse
        out = planes * cfg.expansion
        self.conv3 = nn.Conv2d(width * cfg.scale, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != out:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spx = torch.split(_relu20(self.bn1(self.conv1(x))), self.width, 1)
        parts = []
        sp = spx[0]
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns)):
            if i > 0:
                sp = self.fuse_models[i - 1](sp, spx[i]) if self.fuse else sp + spx[i]
            sp = _relu20(bn(conv(sp)))
            parts.append(sp)
        out = self.bn3(self.conv3(torch.cat(parts, 1)))
        return _relu20(out + self.shortcut(x))


class ERes2NetV2(nn.Module):
    def __init__(self, cfg: SVConfig) -> None:
        super().__init__()
        self.cfg = cfg
        m = cfg.m_channels
        self.conv1 = nn.Conv2d(1, m, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(m)
        planes_in = [m]

        def stage(planes: int, blocks: int, stride: int, fuse: bool) -> nn.Sequential:
            layers = []
            for s in [stride] + [1] * (blocks - 1):
                layers.append(Block(planes_in[0], planes, s, cfg, fuse))
                planes_in[0] = planes * cfg.expansion
            return nn.Sequential(*layers)

        self.layer1 = stage(m, cfg.num_blocks[0], 1, False)
        self.layer2 = stage(m * 2, cfg.num_blocks[1], 2, False)
        self.layer3 = stage(m * 4, cfg.num_blocks[2], 2, True)
        self.layer4 = stage(m * 8, cfg.num_blocks[3], 2, True)
        self.layer3_ds = nn.Conv2d(m * 4 * cfg.expansion, m * 8 * cfg.expansion, 3, padding=1, stride=2, bias=False)
        self.fuse34 = AFF(m * 8 * cfg.expansion, 4)
        stats = int(cfg.feat_dim / 8) * m * 8 * cfg.expansion * 2
        self.seg_1 = nn.Linear(stats, cfg.embedding_size)

    def memory_units(self) -> list[nn.Module]:
        """M12: the residual blocks."""
        return [b for layer in (self.layer1, self.layer2, self.layer3, self.layer4) for b in layer]

    def forward(self, fbank: torch.Tensor) -> torch.Tensor:
        """fbank [B, T, 80] → the embedding upstream's ``forward3`` gives [B, output_dim]."""
        x = fbank.permute(0, 2, 1).unsqueeze(1)
        out = F.relu(self.bn1(self.conv1(x)))
        out3 = self.layer3(self.layer2(self.layer1(out)))
        fused = self.fuse34(self.layer4(out3), self.layer3_ds(out3))
        return fused.flatten(start_dim=1, end_dim=2).mean(-1)
