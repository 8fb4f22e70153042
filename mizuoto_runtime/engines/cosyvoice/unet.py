"""CosyVoice 2's flow estimator: upstream's ``CausalConditionalDecoder``, a 1-D U-Net of causal
ResNet blocks and transformer blocks (Matcha-TTS's decoder with causal convolutions), inference
without streaming (full attention). Parameter names follow upstream's state_dict.

The transformer blocks are diffusers' ``BasicTransformerBlock`` as Matcha uses it: LayerNorm,
self-attention without q/k/v bias through ``scaled_dot_product_attention`` with upstream's
additive mask (0 where allowed, -1e10 elsewhere, one copy per head as diffusers expands it),
LayerNorm, GELU feed-forward (x4).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from ...nn.conv import CausalConv1d
from ...nn.timestep import TimestepEmbedding


class Transpose(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2)


class CausalBlock1D(nn.Module):
    def __init__(self, dim: int, dim_out: int) -> None:
        super().__init__()
        self.block = nn.Sequential(CausalConv1d(dim, dim_out, 3), Transpose(), nn.LayerNorm(dim_out), Transpose(),
                                   nn.Mish())

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.block(x * mask) * mask


class CausalResnetBlock1D(nn.Module):
    def __init__(self, dim: int, dim_out: int, time_emb_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim, dim_out))
        self.block1 = CausalBlock1D(dim, dim_out)
        self.block2 = CausalBlock1D(dim_out, dim_out)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, time_emb: torch.Tensor) -> torch.Tensor:
        h = self.block1(x, mask)
        h += self.mlp(time_emb).unsqueeze(-1)
        h = self.block2(h, mask)
        return h + self.res_conv(x * mask)


class GELUProj(nn.Module):
    """diffusers' ``GELU``: a projection, then exact GELU."""

    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x))


class SelfAttention(nn.Module):
    """diffusers' ``Attention`` (processor ``AttnProcessor2_0``) for self-attention."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        self.heads = heads
        inner = heads * dim_head
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        head_dim = k.shape[-1] // self.heads
        q, k, v = (t.view(b, -1, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).reshape(b, -1, self.heads * head_dim).to(q.dtype)
        return self.to_out[0](out)


class TransformerBlock(nn.Module):
    """diffusers' ``BasicTransformerBlock`` as Matcha builds it (self-attention only, GELU)."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = SelfAttention(dim, heads, dim_head)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = nn.Module()
        self.ff.net = nn.ModuleList([GELUProj(dim, dim * 4), nn.Dropout(0.0), nn.Linear(dim * 4, dim)])

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = self.attn1(self.norm1(x), bias) + x
        h = self.norm3(x)
        for module in self.ff.net:
            h = module(h)
        return h + x


@dataclasses.dataclass(frozen=True)
class UNetSpec:
    in_channels: int
    out_channels: int
    channels: tuple[int, ...]
    attention_head_dim: int
    n_blocks: int
    num_mid_blocks: int
    num_heads: int


def attention_bias(mask: torch.Tensor, heads: int, dtype: torch.dtype) -> torch.Tensor:
    """Upstream's mask for frames `mask` ``(b, 1, t)``: each query row sees the valid frames,
    as an additive bias ``(1 - m) * -1e10``, one copy per head ``(b, heads, t, t)``."""
    b, _, t = mask.shape
    rows = mask.bool().repeat(1, t, 1).to(dtype)
    bias = (1.0 - rows) * -1.0e10
    return bias.repeat_interleave(heads, dim=0).view(b, heads, t, t)


class CausalConditionalDecoder(nn.Module):
    def __init__(self, spec: UNetSpec) -> None:
        super().__init__()
        self.spec = spec
        channels = tuple(spec.channels)
        time_dim = channels[0] * 4
        self.time_mlp = TimestepEmbedding(time_dim, spec.in_channels, mlp=None)
        blocks = lambda dim: nn.ModuleList(  # noqa: E731
            TransformerBlock(dim, spec.num_heads, spec.attention_head_dim) for _ in range(spec.n_blocks))
        self.down_blocks = nn.ModuleList()
        output = spec.in_channels
        for i, ch in enumerate(channels):
            inp, output = output, ch
            last = i == len(channels) - 1
            down: nn.Module = CausalConv1d(output, output, 3) if last else nn.Conv1d(output, output, 3, 2, 1)
            self.down_blocks.append(nn.ModuleList([CausalResnetBlock1D(inp, output, time_dim), blocks(output), down]))
        self.mid_blocks = nn.ModuleList(
            nn.ModuleList([CausalResnetBlock1D(channels[-1], output, time_dim), blocks(output)])
            for _ in range(spec.num_mid_blocks))
        ups = channels[::-1] + (channels[0],)
        self.up_blocks = nn.ModuleList()
        for i in range(len(ups) - 1):
            inp, output = ups[i] * 2, ups[i + 1]
            last = i == len(ups) - 2
            up: nn.Module = CausalConv1d(output, output, 3) if last else nn.ConvTranspose1d(output, output, 4, 2, 1)
            self.up_blocks.append(nn.ModuleList([CausalResnetBlock1D(inp, output, time_dim), blocks(output), up]))
        self.final_block = CausalBlock1D(ups[-1], ups[-1])
        self.final_proj = nn.Conv1d(ups[-1], spec.out_channels, 1)

    def memory_units(self) -> list[nn.Module]:
        """Each level's resnet block and transformer blocks, with its resampling conv."""
        return [*self.down_blocks, *self.mid_blocks, *self.up_blocks]

    def _transformers(self, x: torch.Tensor, mask: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        x = x.transpose(1, 2).contiguous()
        bias = attention_bias(mask, self.spec.num_heads, x.dtype)
        for block in blocks:
            x = block(x, bias)
        return x.transpose(1, 2).contiguous()

    def forward(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor,
                spks: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        t = self.time_mlp(t)
        x = torch.cat([x, mu, spks.unsqueeze(-1).expand(-1, -1, x.shape[-1]), cond], dim=1)
        hiddens, masks = [], [mask]
        for resnet, blocks, downsample in self.down_blocks:
            mask_down = masks[-1]
            x = self._transformers(resnet(x, mask_down, t), mask_down, blocks)
            hiddens.append(x)
            x = downsample(x * mask_down)
            masks.append(mask_down[:, :, ::2])
        masks = masks[:-1]
        mask_mid = masks[-1]
        for resnet, blocks in self.mid_blocks:
            x = self._transformers(resnet(x, mask_mid, t), mask_mid, blocks)
        mask_up = mask
        for resnet, blocks, upsample in self.up_blocks:
            mask_up = masks.pop()
            skip = hiddens.pop()
            x = torch.cat([x[:, :, : skip.shape[-1]], skip], dim=1)
            x = self._transformers(resnet(x, mask_up, t), mask_up, blocks)
            x = upsample(x * mask_up)
        x = self.final_block(x, mask_up)
        return self.final_proj(x * mask_up) * mask
