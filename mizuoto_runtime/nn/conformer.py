"""Conformer pieces in ESPnet/WeNet form (CosyVoice 2's flow encoder, IndexTTS-2's conditioning
encoders): relative positional encoding and the attention that uses it, the position-wise
feed-forward, the convolution module and the encoder layer around them (its LayerNorms' eps a
parameter: WeNet's 1e-12, IndexTTS-2's 1e-5); the 2x conv2d subsampling with its stored
absolute position table and the encoder stack IndexTTS-2 builds from them.

Parameter names are WeNet's (``linear_q``, ``pos_bias_u``, ``feed_forward.w_1`` ...), so
upstream state_dicts load unchanged. Inference only (no dropout, no streaming caches).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

#: An activation: a module (registered: an entry in the saved state dict's metadata, as WeNet's
#: modules have) or a plain function such as ``F.silu`` (none: IndexTTS-2's encoders, whose
#: saved files never had one); the numbers are the same.
Activation = nn.Module | Callable[[torch.Tensor], torch.Tensor]


class EspnetRelPositionalEncoding(nn.Module):
    """ESPnet's "new" relative positional encoding (Transformer-XL appendix B): scales the input
    by ``sqrt(d_model)`` and returns the encodings of relative positions ``n-1 .. -(n-1)``."""

    def __init__(self, d_model: int, max_len: int = 5000) -> None:
        super().__init__()
        self.d_model = d_model
        self.xscale = math.sqrt(d_model)
        self.max_len = max_len
        # Made once here, as upstream does, and a buffer: the runtime counts and places it with
        # the weights (M45: made inside a phase it was device memory no estimate or handle held).
        self.register_buffer("pe", self._make(max_len), persistent=False)

    def _make(self, length: int) -> torch.Tensor:
        position = torch.arange(0, length, dtype=torch.float32).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, self.d_model, 2, dtype=torch.float32)
                             * -(math.log(10000.0) / self.d_model))
        positive = torch.zeros(length, self.d_model)
        negative = torch.zeros(length, self.d_model)
        positive[:, 0::2] = torch.sin(position * div_term)
        positive[:, 1::2] = torch.cos(position * div_term)
        negative[:, 0::2] = torch.sin(-1 * position * div_term)
        negative[:, 1::2] = torch.cos(-1 * position * div_term)
        return torch.cat([torch.flip(positive, [0]).unsqueeze(0), negative[1:].unsqueeze(0)], dim=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        size = x.size(1)
        # Longer than the table (upstream extends it): this call's own table, not kept.
        pe = self.pe if size <= self.max_len else self._make(size).to(x.device)
        middle = pe.size(1) // 2
        return x * self.xscale, pe[:, middle - size + 1: middle + size].to(x.dtype)

def sinusoid_table(dim: int, rows: int = 5000) -> torch.Tensor:
    """WeNet's absolute ``PositionalEncoding`` table ``(1, rows, dim)``: sin at even, cos at odd."""
    position = torch.arange(0, rows).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2) * -(math.log(10000.0) / dim))
    table = torch.zeros(rows, dim)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div)
    return table.unsqueeze(0)


class PositionTable(nn.Module):
    """The absolute table as a stored buffer (``pos_enc.pe``): loaded from the checkpoint."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("pe", sinusoid_table(dim))


class Conv2dSubsampling2(nn.Module):
    """WeNet's ``Conv2dSubsampling2``: Conv2d(1, d, 3, stride 2) + ReLU, then a Linear over
    (channels x reduced features), scaled by ``sqrt(d)``; the table's first rows as positions.

    The positions go to `RelPositionMultiHeadedAttention` as they are (one per frame, so no
    relative shift), as IndexTTS-2's encoders read them."""

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


class LinearEmbed(nn.Module):
    """WeNet's ``LinearNoSubsampling``: Linear, LayerNorm, then the positional encoding."""

    def __init__(self, idim: int, odim: int) -> None:
        super().__init__()
        self.out = nn.Sequential(nn.Linear(idim, odim), nn.LayerNorm(odim, eps=1e-5))
        self.pos_enc = EspnetRelPositionalEncoding(odim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pos_enc(self.out(x))


class RelPositionMultiHeadedAttention(nn.Module):
    """Multi-head self-attention with relative positions (matrices ac + bd, ``rel_shift``).

    `mask`: ``(batch, 1 or time1, time2)`` bool, True where attention is allowed."""

    def __init__(self, n_head: int, n_feat: int, key_bias: bool = True) -> None:
        super().__init__()
        if n_feat % n_head:
            raise ValueError(f"rel-pos attention: {n_feat} features are not a multiple of {n_head} heads")
        self.d_k = n_feat // n_head
        self.h = n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat, bias=key_bias)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(self.h, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(self.h, self.d_k))

    @staticmethod
    def rel_shift(x: torch.Tensor) -> torch.Tensor:
        b, h, t1, t2 = x.shape
        padded = torch.cat([torch.zeros((b, h, t1, 1), device=x.device, dtype=x.dtype), x], dim=-1)
        padded = padded.view(b, h, t2 + 1, t1)
        return padded[:, :, 1:].view_as(x)[:, :, :, : t2 // 2 + 1]

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pos_emb: torch.Tensor) -> torch.Tensor:
        b = x.size(0)
        q = self.linear_q(x).view(b, -1, self.h, self.d_k)
        k = self.linear_k(x).view(b, -1, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(x).view(b, -1, self.h, self.d_k).transpose(1, 2)
        p = self.linear_pos(pos_emb).view(pos_emb.size(0), -1, self.h, self.d_k).transpose(1, 2)
        q_u = (q + self.pos_bias_u).transpose(1, 2)
        q_v = (q + self.pos_bias_v).transpose(1, 2)
        ac = torch.matmul(q_u, k.transpose(-2, -1))
        bd = torch.matmul(q_v, p.transpose(-2, -1))
        if ac.shape != bd.shape:
            bd = self.rel_shift(bd)
        scores = (ac + bd) / math.sqrt(self.d_k)
        if mask.size(2) > 0:
            blocked = mask.unsqueeze(1).eq(0)[:, :, :, : scores.size(-1)]
            attn = torch.softmax(scores.masked_fill(blocked, -float("inf")), dim=-1).masked_fill(blocked, 0.0)
        else:
            attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).contiguous().view(b, -1, self.h * self.d_k)
        return self.linear_out(out)


class PositionwiseFeedForward(nn.Module):
    """``w_2(activation(w_1(x)))``."""

    def __init__(self, idim: int, hidden_units: int, activation: Activation | None = None) -> None:
        super().__init__()
        self.w_1 = nn.Linear(idim, hidden_units)
        self.activation = activation if activation is not None else nn.ReLU()
        self.w_2 = nn.Linear(hidden_units, idim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.activation(self.w_1(x)))


class ConvolutionModule(nn.Module):
    """Pointwise conv + GLU, depthwise conv (causal: left pad only), norm, activation, pointwise."""

    def __init__(self, channels: int, kernel_size: int = 15, activation: Activation | None = None,
                 norm: str = "batch_norm", causal: bool = False, bias: bool = True) -> None:
        super().__init__()
        self.pointwise_conv1 = nn.Conv1d(channels, 2 * channels, 1, bias=bias)
        if causal:
            self.lorder, padding = kernel_size - 1, 0
        else:
            if (kernel_size - 1) % 2:
                raise ValueError(f"conformer conv: a non-causal kernel must be odd, got {kernel_size}")
            self.lorder, padding = 0, (kernel_size - 1) // 2
        self.depthwise_conv = nn.Conv1d(channels, channels, kernel_size, padding=padding, groups=channels, bias=bias)
        if norm not in ("batch_norm", "layer_norm"):
            raise ValueError(f"conformer conv: norm must be batch_norm or layer_norm, got {norm!r}")
        self.use_layer_norm = norm == "layer_norm"
        self.norm = nn.LayerNorm(channels) if self.use_layer_norm else nn.BatchNorm1d(channels)
        self.pointwise_conv2 = nn.Conv1d(channels, channels, 1, bias=bias)
        self.activation = activation if activation is not None else nn.ReLU()

    def forward(self, x: torch.Tensor, mask_pad: torch.Tensor | None = None) -> torch.Tensor:
        x = x.transpose(1, 2)
        if mask_pad is not None and mask_pad.size(2) > 0:
            x = x.masked_fill(~mask_pad, 0.0)
        if self.lorder > 0:
            x = F.pad(x, (self.lorder, 0), "constant", 0.0)
        x = F.glu(self.pointwise_conv1(x), dim=1)
        x = self.depthwise_conv(x)
        if self.use_layer_norm:
            x = self.norm(x.transpose(1, 2)).transpose(1, 2)
        else:
            x = self.norm(x)
        x = self.pointwise_conv2(self.activation(x))
        if mask_pad is not None and mask_pad.size(2) > 0:
            x = x.masked_fill(~mask_pad, 0.0)
        return x.transpose(1, 2)


class ConformerEncoderLayer(nn.Module):
    """WeNet's ``ConformerEncoderLayer`` with pre-norm (``normalize_before=True``): optional
    macaron feed-forward (half step), attention, optional conv module, feed-forward, and a
    final norm when the conv module exists."""

    def __init__(self, size: int, self_attn: RelPositionMultiHeadedAttention, feed_forward: PositionwiseFeedForward,
                 feed_forward_macaron: PositionwiseFeedForward | None = None,
                 conv_module: ConvolutionModule | None = None, *, eps: float = 1e-12) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.feed_forward_macaron = feed_forward_macaron
        self.conv_module = conv_module
        self.norm_ff = nn.LayerNorm(size, eps=eps)
        self.norm_mha = nn.LayerNorm(size, eps=eps)
        self.ff_scale = 1.0
        if feed_forward_macaron is not None:
            self.norm_ff_macaron = nn.LayerNorm(size, eps=eps)
            self.ff_scale = 0.5
        if conv_module is not None:
            self.norm_conv = nn.LayerNorm(size, eps=eps)
            self.norm_final = nn.LayerNorm(size, eps=eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pos_emb: torch.Tensor,
                mask_pad: torch.Tensor | None = None) -> torch.Tensor:
        if self.feed_forward_macaron is not None:
            x = x + self.ff_scale * self.feed_forward_macaron(self.norm_ff_macaron(x))
        x = x + self.self_attn(self.norm_mha(x), mask, pos_emb)
        if self.conv_module is not None:
            x = x + self.conv_module(self.norm_conv(x), mask_pad)
        x = x + self.ff_scale * self.feed_forward(self.norm_ff(x))
        if self.conv_module is not None:
            x = self.norm_final(x)
        return x


def valid_mask(lengths: torch.Tensor, frames: int) -> torch.Tensor:
    """(B, 1, T): True at frames below each length."""
    return (torch.arange(frames, device=lengths.device)[None, :] < lengths[:, None]).unsqueeze(1)


class ConformerEncoder(nn.Module):
    """WeNet's ``ConformerEncoder`` as IndexTTS-2 configures it: "conv2d2" subsampling, pre-norm
    layers without macaron (SiLU feed-forward, conv module with LayerNorm and SiLU, kernel 15),
    LayerNorms with eps 1e-5, a final norm."""

    def __init__(self, input_size: int, output_size: int, linear_units: int, attention_heads: int,
                 num_blocks: int, input_layer: str = "conv2d2") -> None:
        super().__init__()
        if input_layer != "conv2d2":
            raise ValueError(f"conformer input_layer {input_layer!r}: IndexTTS-2 uses 'conv2d2' only")
        self.embed = Conv2dSubsampling2(input_size, output_size)
        self.encoders = nn.ModuleList(
            ConformerEncoderLayer(output_size, RelPositionMultiHeadedAttention(attention_heads, output_size),
                                  PositionwiseFeedForward(output_size, linear_units, F.silu),
                                  conv_module=ConvolutionModule(output_size, 15, F.silu, norm="layer_norm"),
                                  eps=1e-5)
            for _ in range(num_blocks))
        self.after_norm = nn.LayerNorm(output_size, eps=1e-5)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, features), lengths (B,) -> (B, T', d) and the subsampled mask (B, 1, T')."""
        x, pos, mask = self.embed(x, valid_mask(lengths, x.shape[1]))
        for layer in self.encoders:
            x = layer(x, mask, pos, mask)
        return self.after_norm(x), mask
