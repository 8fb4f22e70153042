"""CosyVoice 3's flow estimator: upstream's ``DiT`` (F5-TTS style), inference without
streaming. Parameter names follow upstream's state_dict.

Quirks kept: the rotary embedding (x-transformers' interleaved pairs, ``inv_freq`` from the
checkpoint) is applied to the projected queries and keys *before* they are split into heads,
so only the first ``dim_head`` channels (the first head) rotate; adaptive LayerNorm-Zero
modulation per block; the attention output is zeroed at masked frames.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from ...nn.conv import CausalConv1d
from ...nn.rotary import apply_rotary, pair_frequencies
from ...nn.timestep import TimestepEmbedding


def apply_partial_rotary(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    rot = freqs.shape[-1]
    head, rest = t[..., :rot], t[..., rot:]
    head = apply_rotary(head, freqs.cos(), freqs.sin(), "pairs")
    return torch.cat((head, rest), dim=-1).type(t.dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.register_buffer("inv_freq", pair_frequencies(dim, base))

    def forward(self, seq_len: int) -> torch.Tensor:
        t = torch.arange(seq_len, device=self.inv_freq.device).type_as(self.inv_freq)
        freqs = torch.einsum("b i , j -> b i j", t.unsqueeze(0), self.inv_freq)
        return torch.stack((freqs, freqs), dim=-1).flatten(-2)


class CausalConvPositionEmbedding(nn.Module):
    def __init__(self, dim: int, kernel_size: int = 31, groups: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(CausalConv1d(dim, dim, kernel_size, groups=groups), nn.Mish())
        self.conv2 = nn.Sequential(CausalConv1d(dim, dim, kernel_size, groups=groups), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x.permute(0, 2, 1))).permute(0, 2, 1)


class InputEmbedding(nn.Module):
    def __init__(self, mel_dim: int, text_dim: int, out_dim: int, spk_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(mel_dim * 2 + text_dim + spk_dim, out_dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(out_dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, text: torch.Tensor, spks: torch.Tensor) -> torch.Tensor:
        spks = spks.unsqueeze(1).expand(-1, x.shape[1], -1)
        x = self.proj(torch.cat([x, cond, text, spks], dim=-1))
        return self.conv_pos_embed(x) + x


class AdaLayerNormZero(nn.Module):
    def __init__(self, dim: int, chunks: int = 6) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim * chunks)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        self.heads = heads
        inner = heads * dim_head
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        q = apply_partial_rotary(self.to_q(x), rope)
        k = apply_partial_rotary(self.to_k(x), rope)
        v = self.to_v(x)
        head_dim = k.shape[-1] // self.heads
        q, k, v = (t.view(b, -1, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
        out = self.to_out[0](out.transpose(1, 2).reshape(b, -1, self.heads * head_dim).to(q.dtype))
        return out.masked_fill(~mask[:, 0, -1].unsqueeze(-1), 0.0)


class DiTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: int) -> None:
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(dim, heads, dim_head)
        self.ff_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        inner = int(dim * ff_mult)
        self.ff = nn.Module()
        self.ff.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")),
                                   nn.Dropout(0.0), nn.Linear(inner, dim))

    def forward(self, x: torch.Tensor, t: torch.Tensor, mask: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        emb = self.attn_norm.linear(F.silu(t))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = torch.chunk(emb, 6, dim=1)
        norm = self.attn_norm.norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        x = x + gate_msa.unsqueeze(1) * self.attn(norm, mask, rope)
        norm = self.ff_norm(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        return x + gate_mlp.unsqueeze(1) * self.ff.ff(norm)


@dataclasses.dataclass(frozen=True)
class DiTSpec:
    dim: int
    depth: int
    heads: int
    dim_head: int
    ff_mult: int
    mel_dim: int = 80
    mu_dim: int = 80
    spk_dim: int = 80


class DiT(nn.Module):
    def __init__(self, spec: DiTSpec) -> None:
        super().__init__()
        self.spec = spec
        self.time_embed = TimestepEmbedding(spec.dim, mlp="time_mlp")
        self.input_embed = InputEmbedding(spec.mel_dim, spec.mu_dim, spec.dim, spec.spk_dim)
        self.rotary_embed = RotaryEmbedding(spec.dim_head)
        self.transformer_blocks = nn.ModuleList(
            DiTBlock(spec.dim, spec.heads, spec.dim_head, spec.ff_mult) for _ in range(spec.depth))
        self.norm_out = AdaLayerNormZero(spec.dim, chunks=2)
        self.proj_out = nn.Linear(spec.dim, spec.mel_dim)

    def memory_units(self) -> list[nn.Module]:
        return list(self.transformer_blocks)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor,
                spks: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        x, mu, cond = x.transpose(1, 2), mu.transpose(1, 2), cond.transpose(1, 2)
        batch, seq_len = x.shape[0], x.shape[1]
        if t.ndim == 0:
            t = t.repeat(batch)
        t = self.time_embed(t)
        x = self.input_embed(x, cond, mu, spks)
        rope = self.rotary_embed(seq_len)
        attn_mask = mask.bool().repeat(1, seq_len, 1).unsqueeze(1)
        for block in self.transformer_blocks:
            x = block(x, t, attn_mask, rope)
        emb = self.norm_out.linear(F.silu(t))
        scale, shift = torch.chunk(emb, 2, dim=1)
        x = self.norm_out.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]
        return self.proj_out(x).transpose(1, 2)
