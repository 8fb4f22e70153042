"""A Qwen2/Qwen3-style decoder: grouped-query attention with RoPE, SwiGLU MLP, RMSNorm, and
the caches its attention writes to.

Numbers follow transformers' ``Qwen2Model`` / ``Qwen3Model`` with the ``sdpa`` attention:
keys and values repeated per query group (``repeat_kv``), then
``scaled_dot_product_attention`` with ``is_causal`` for a prefill from an empty cache and no
mask for one new position (what transformers passes when the attention mask is all ones).
Parameter names are transformers' (``layers.N.self_attn.q_proj`` ...), so a published
state_dict loads as it is. Options: bias on q/k/v (Qwen2: yes; Qwen3: no) and RMSNorm on each
head's queries and keys before RoPE (Qwen3, Fish Speech).

A cache is anything with ``update(key, value, layer_idx) -> (keys, values)`` and
``get_seq_length(layer_idx)``: `KVCache` here (grows by concatenation, as transformers'
``DynamicCache``) or `mizuoto_runtime.nn.kv_cache.BufferCache` (static buffers, M53).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .feed_forward import TRANSFORMERS_NAMES, SwiGLU
from .norm import RMSNorm
from .rotary import RotaryEmbedding, apply_rotary


class Cache(Protocol):
    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def get_seq_length(self, layer_idx: int = 0) -> int: ...


class KVCache:
    """Per-layer keys and values ``(batch, kv_heads, n, head_dim)``, grown by concatenation."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int,
               cache_kwargs: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx > len(self.keys):
            raise ValueError(f"KVCache: layer {layer_idx} updated before layer {len(self.keys)}")
        if layer_idx == len(self.keys):
            self.keys.append(key)
            self.values.append(value)
        else:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], key], dim=-2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], value], dim=-2)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.keys[layer_idx].shape[-2] if layer_idx < len(self.keys) else 0


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """The sizes of a Qwen2/Qwen3 decoder (field names as in its config.json)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = True  # bias on q/k/v (Qwen2); o_proj never has one
    qk_norm: bool = False  # RMSNorm on per-head queries and keys (Qwen3)

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf(cls, config: dict[str, Any], *, qk_norm: bool | None = None) -> DecoderConfig:
        """From a transformers config.json dict (Qwen2 or Qwen3; the model type decides the
        defaults for bias and qk-norm)."""
        qwen3 = str(config.get("model_type", "")).startswith("qwen3")
        missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                               "intermediate_size", "vocab_size") if k not in config]
        if missing:
            raise ValueError(f"decoder config: missing {', '.join(missing)}")
        rope = config.get("rope_theta")
        if rope is None:
            rope = (config.get("rope_parameters") or config.get("rope_scaling") or {}).get("rope_theta", 10000.0)
        return cls(
            hidden_size=int(config["hidden_size"]), num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=int(config["num_attention_heads"]),
            num_key_value_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
            intermediate_size=int(config["intermediate_size"]), vocab_size=int(config["vocab_size"]),
            head_dim=int(config.get("head_dim") or 0), rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope), attention_bias=bool(config.get("attention_bias", not qwen3)),
            qk_norm=qwen3 if qk_norm is None else qk_norm)


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``(b, kv_heads, n, d)`` -> ``(b, kv_heads * groups, n, d)``, each head repeated in place."""
    if groups == 1:
        return x
    b, h, n, d = x.shape
    return x[:, :, None].expand(b, h, groups, n, d).reshape(b, h * groups, n, d)


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        if self.heads % self.kv_heads:
            raise ValueError(f"attention: {self.heads} heads are not a multiple of {self.kv_heads} kv heads")
        self.head_dim = config.dim_head
        self.scaling = self.head_dim ** -0.5
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Cache | None = None) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, -1, self.head_dim)
        k = self.k_proj(x).view(b, n, -1, self.head_dim)
        v = self.v_proj(x).view(b, n, -1, self.head_dim).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # over the heads
        q = apply_rotary(q.transpose(1, 2), cos, sin)
        k = apply_rotary(k.transpose(1, 2), cos, sin)
        past = 0
        if cache is not None:
            past = cache.get_seq_length(self.layer_idx)
            k, v = cache.update(k, v, self.layer_idx)
        groups = self.heads // self.kv_heads
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        mask = None
        if n > 1 and past > 0:  # a chunk after cached positions: causal within, all of the past
            mask = torch.ones(n, past + n, dtype=torch.bool, device=x.device).tril(past)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=self.scaling,
                                             is_causal=n > 1 and past == 0)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP with residuals; one streaming unit of a sequence handle."""

    def __init__(self, config: DecoderConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size, TRANSFORMERS_NAMES)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Cache | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    """Token embedding, the layers and the final norm (transformers' ``model.*`` keys)."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.dim_head, config.rope_theta)

    def forward(self, inputs_embeds: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:
        """The last hidden state (after the final norm) of `inputs_embeds` ``(b, n, hidden)``,
        placed after the positions `cache` holds."""
        past = cache.get_seq_length(0) if cache is not None else 0
        b, n, _ = inputs_embeds.shape
        positions = torch.arange(past, past + n, device=inputs_embeds.device).unsqueeze(0).expand(b, n)
        cos, sin = self.rotary_emb(positions, inputs_embeds.dtype)
        x = inputs_embeds
        for layer in self.layers:
            x = layer(x, cos, sin, cache)
        return self.norm(x)
