"""The GPT-2 stack of UnifiedVoice v2, with transformers' `Conv1D` leaves (weight [in, out]).

The checkpoint's `gpt.h.N.*` keys are transformers GPT-2 blocks; only the blocks and `ln_f`
are used (token and position embeddings are UnifiedVoice's own). M13: transformers' `Conv1D`
reads its weights only inside its own forward, so `StreamingConv1D` declares `STREAMABLE`;
the plain class would leave every GPT weight in the fixed part.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

LayerCache = tuple[torch.Tensor, torch.Tensor]


@functools.cache
def _streaming_conv1d() -> type[nn.Module]:
    """The class, made on first use: transformers loads when a GPT is built, not when the engine
    table imports this engine (start-up stays free of engine packages)."""
    from transformers.pytorch_utils import Conv1D

    from ...memory.small_weights import CastWeights, is_stored_small

    class StreamingConv1D(CastWeights, Conv1D):  # type: ignore[misc]
        """transformers' GPT-2 `Conv1D`, declared streamable (M13), and able to store its weight
        small (issue 36: `CastWeights`; its output channels are the weight's dimension 1)."""

        STREAMABLE = True
        CHANNEL_DIM = 1

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not is_stored_small(self):
                return super().forward(x)  # as published: transformers' own
            out = torch.addmm(self.cast_bias(x), x.view(-1, x.size(-1)), self.cast_weight(x))
            return out.view(*x.shape[:-1], self.nf)

    return StreamingConv1D


def __getattr__(name: str) -> Any:  # `from .gpt2 import StreamingConv1D` (PEP 562)
    if name == "StreamingConv1D":
        return _streaming_conv1d()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's "gelu_new": the tanh approximation, written as transformers evaluates it."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = _streaming_conv1d()(3 * dim, dim)
        self.c_proj = _streaming_conv1d()(dim, dim)

    def forward(self, x: torch.Tensor, past: LayerCache | None) -> tuple[torch.Tensor, LayerCache]:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        # Causal over the new rows; the cached rows are all visible (no padding: one text per call).
        if t == 1:
            out = F.scaled_dot_product_attention(q, k, v)
        elif k.shape[2] == t:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = torch.ones(t, k.shape[2], dtype=torch.bool, device=x.device).tril(k.shape[2] - t)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(b, t, d)
        return self.c_proj(out), (k, v)


class GPT2MLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.c_fc = _streaming_conv1d()(4 * dim, dim)
        self.c_proj = _streaming_conv1d()(dim, 4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(gelu_tanh(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = GPT2Attention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = GPT2MLP(dim)

    def forward(self, x: torch.Tensor, past: LayerCache | None) -> tuple[torch.Tensor, LayerCache]:
        h, present = self.attn(self.ln_1(x), past)
        x = x + h
        return x + self.mlp(self.ln_2(x)), present


class GPT2Stack(nn.Module):
    """`h` (the blocks) and `ln_f`, fed embeddings; GPT-2's own position embedding is null here."""

    def __init__(self, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.h = nn.ModuleList(GPT2Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor, cache: list[LayerCache] | None = None
                ) -> tuple[torch.Tensor, list[LayerCache]]:
        presents: list[LayerCache] = []
        for i, block in enumerate(self.h):
            x, present = block(x, None if cache is None else cache[i])
            presents.append(present)
        return self.ln_f(x), presents
