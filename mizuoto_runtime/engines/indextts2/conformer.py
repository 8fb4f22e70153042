"""The conformer that encodes w2v-BERT features for the speaker and emotion conditioning.

As upstream's encoder reads (WeNet-style, pre-norm): a 2x conv2d subsampling ("conv2d2") scaled
by sqrt(d), relative-position attention WITHOUT the relative shift, a conformer convolution
module (GLU, depthwise k=15, LayerNorm, SiLU), SiLU feed-forward, no macaron. The position
table `embed.pos_enc.pe` is a stored buffer and is loaded from the checkpoint.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def valid_mask(lengths: torch.Tensor, frames: int) -> torch.Tensor:
    """(B, 1, T): True at frames below each length."""
    return (torch.arange(frames, device=lengths.device)[None, :] < lengths[:, None]).unsqueeze(1)


def sinusoid_table(dim: int, rows: int = 5000) -> torch.Tensor:
    position = torch.arange(0, rows).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2) * -(math.log(10000.0) / dim))
    table = torch.zeros(rows, dim)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div)
    return table.unsqueeze(0)


class PositionTable(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("pe", sinusoid_table(dim))


class Subsample2(nn.Module):
    """Conv2d(1, d, 3, stride 2) + ReLU, then Linear over (channels x reduced features)."""

    def __init__(self, idim: int, odim: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, odim, 3, 2), nn.ReLU())
        self.out = nn.Sequential(nn.Linear(odim * ((idim - 1) // 2), odim))
        self.pos_enc = PositionTable(odim)
        self.scale = math.sqrt(odim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.conv(x.unsqueeze(1))
        b, c, t, f = x.shape
        x = self.out(x.transpose(1, 2).reshape(b, t, c * f)) * self.scale
        return x, self.pos_enc.pe[:, :t], mask[:, :, 2::2]


class RelPosAttention(nn.Module):
    def __init__(self, heads: int, dim: int) -> None:
        super().__init__()
        self.h, self.d_k = heads, dim // heads
        self.linear_q = nn.Linear(dim, dim)
        self.linear_k = nn.Linear(dim, dim)
        self.linear_v = nn.Linear(dim, dim)
        self.linear_out = nn.Linear(dim, dim)
        self.linear_pos = nn.Linear(dim, dim, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(heads, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(heads, self.d_k))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], -1, self.h, self.d_k)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        q = self._heads(self.linear_q(x))                     # (B, T, H, dk)
        k = self._heads(self.linear_k(x)).transpose(1, 2)     # (B, H, T, dk)
        v = self._heads(self.linear_v(x)).transpose(1, 2)
        p = self._heads(self.linear_pos(pos)).transpose(1, 2)  # (1, H, T, dk)
        ac = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
        bd = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))
        scores = (ac + bd) / math.sqrt(self.d_k)
        hidden = ~mask.unsqueeze(1)[..., :scores.shape[-1]]   # (B, 1, 1, T)
        attn = torch.softmax(scores.masked_fill(hidden, -float("inf")), dim=-1).masked_fill(hidden, 0.0)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, -1, self.h * self.d_k)
        return self.linear_out(out)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w_1 = nn.Linear(dim, hidden)
        self.w_2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(nn.functional.silu(self.w_1(x)))


class ConvModule(nn.Module):
    def __init__(self, dim: int, kernel: int = 15) -> None:
        super().__init__()
        self.pointwise_conv1 = nn.Conv1d(dim, 2 * dim, 1)
        self.depthwise_conv = nn.Conv1d(dim, dim, kernel, padding=(kernel - 1) // 2, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pointwise_conv2 = nn.Conv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2).masked_fill(~mask, 0.0)
        x = self.depthwise_conv(nn.functional.glu(self.pointwise_conv1(x), dim=1))
        x = nn.functional.silu(self.norm(x.transpose(1, 2))).transpose(1, 2)
        return self.pointwise_conv2(x).masked_fill(~mask, 0.0).transpose(1, 2)


class ConformerLayer(nn.Module):
    def __init__(self, dim: int, hidden: int, heads: int) -> None:
        super().__init__()
        self.self_attn = RelPosAttention(heads, dim)
        self.feed_forward = FeedForward(dim, hidden)
        self.conv_module = ConvModule(dim)
        self.norm_ff = nn.LayerNorm(dim, eps=1e-5)
        self.norm_mha = nn.LayerNorm(dim, eps=1e-5)
        self.norm_conv = nn.LayerNorm(dim, eps=1e-5)
        self.norm_final = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.norm_mha(x), mask, pos)
        x = x + self.conv_module(self.norm_conv(x), mask)
        x = x + self.feed_forward(self.norm_ff(x))
        return self.norm_final(x)


class ConformerEncoder(nn.Module):
    def __init__(self, input_size: int, output_size: int, linear_units: int, attention_heads: int,
                 num_blocks: int, input_layer: str = "conv2d2") -> None:
        super().__init__()
        if input_layer != "conv2d2":
            raise ValueError(f"conformer input_layer {input_layer!r}: IndexTTS-2 uses 'conv2d2' only")
        self.embed = Subsample2(input_size, output_size)
        self.encoders = nn.ModuleList(
            ConformerLayer(output_size, linear_units, attention_heads) for _ in range(num_blocks))
        self.after_norm = nn.LayerNorm(output_size, eps=1e-5)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, 1024), lengths (B,) -> (B, T', d) and the subsampled mask (B, 1, T')."""
        x, pos, mask = self.embed(x, valid_mask(lengths, x.shape[1]))
        for layer in self.encoders:
            x = layer(x, mask, pos)
        return self.after_norm(x), mask
