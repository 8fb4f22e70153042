"""Fish Speech's dual autoregressive transformer: a slow transformer once per frame, a fast one
once per codebook.

The slow transformer (`SlowTransformer`) reads a frame as one token row plus ``num_codebooks``
code rows: the token embedding plus, at semantic positions only, the sum of every codebook's
embedding (codebook ``i`` reads row ``code + i * codebook_size`` of one shared table), scaled by
``1/sqrt(num_codebooks + 1)`` where the config says so. Its head is tied to the token
embedding. It returns the token logits and the hidden state the fast transformer starts from
(final-normed or not, per config).

The fast transformer (`FastTransformer`) runs ``num_codebooks`` positions per frame: position 0
is the slow hidden state (its logits are not used), position ``i`` the embedding of codebook
``i - 1``'s code, predicting codebook ``i``. Its KV cache holds ``num_codebooks`` positions and
is never cleared between frames: each frame overwrites positions 0.., and the causal mask hides
the rest, as upstream does.

Numbers follow upstream exactly where they can differ: RoPE on interleaved pairs with a table
computed in float32 then rounded to bfloat16, applied in float32; per-head RMSNorm of q and k
before RoPE (slow only); fused ``wqkv`` split ``[q | k | v]`` with GQA by `repeat_interleave`;
RMSNorm in float32 with eps inside the rsqrt; the fast attention written out (scores + an
additive -inf mask, softmax, weighted sum) rather than fused, as upstream runs it.

Weights keep upstream's key names (``layers.N.attention.wqkv.weight``...), so the streamed units
are the slow ``layers`` (M11/M12); embeddings and norms stay fixed (M14).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...nn.feed_forward import SwiGLU
from ...nn.kv_cache import capacity_for
from ...nn.norm import RMSNorm  # float32 mean square, eps inside the rsqrt, cast back, scaled: upstream's order
from ...nn.rotary import apply_pair_table, pair_table
from .config import DualARConfig

ROPE_DTYPE = torch.bfloat16  # upstream rounds its float32 RoPE table to bfloat16


class HeadNorm(nn.Module):
    """Per-head RMSNorm of q or k (torch's `rms_norm`, as upstream's `nn.RMSNorm`)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    """GQA attention with a fused q/k/v projection and optional per-head qk-norm."""

    def __init__(self, dim: int, n_head: int, n_local_heads: int, head_dim: int, *, qkv_bias: bool,
                 o_bias: bool, qk_norm: bool, eps: float, fused: bool) -> None:
        super().__init__()
        self.n_head, self.n_local_heads, self.head_dim = n_head, n_local_heads, head_dim
        self.wqkv = nn.Linear(dim, (n_head + 2 * n_local_heads) * head_dim, bias=qkv_bias)
        self.wo = nn.Linear(n_head * head_dim, dim, bias=o_bias)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = HeadNorm(head_dim, eps)
            self.k_norm = HeadNorm(head_dim, eps)
        self.fused = fused  # the slow transformer uses torch's sdpa, the fast one the written-out form

    def forward(self, x: Tensor, rope: Tensor, mask: Tensor, cache: tuple[Tensor, Tensor] | None,
                start: int | Tensor) -> Tensor:
        """`x` ``[B, S, dim]``; `mask` bool ``[S, K]`` over the keys attended; `cache` (k, v)
        buffers ``[B, H_kv, capacity, D]`` written at ``[start, start + S)``; attention reads
        their first ``K`` positions (without a cache, the S new ones)."""
        b, s, _ = x.shape
        q_size, kv_size = self.n_head * self.head_dim, self.n_local_heads * self.head_dim
        q, k, v = self.wqkv(x).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(b, s, self.n_head, self.head_dim)
        k = k.view(b, s, self.n_local_heads, self.head_dim)
        v = v.view(b, s, self.n_local_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_pair_table(q, rope), apply_pair_table(k, rope)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            keys, values = cache
            keys[:, :, start:start + s] = k
            values[:, :, start:start + s] = v
            k, v = keys[:, :, : mask.shape[-1]], values[:, :, : mask.shape[-1]]
        rep = self.n_head // self.n_local_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None])
        else:
            bias = torch.where(mask.logical_not(), float("-inf"), torch.zeros((), dtype=q.dtype, device=q.device))
            scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.size(-1)))
            scores += bias
            y = torch.softmax(scores, dim=-1) @ v
        return self.wo(y.transpose(1, 2).contiguous().view(b, s, q_size))


class Block(nn.Module):
    """Pre-norm attention + SwiGLU block (one streamed unit of the slow transformer)."""

    def __init__(self, dim: int, n_head: int, n_local_heads: int, head_dim: int, hidden: int, *,
                 qkv_bias: bool, o_bias: bool, qk_norm: bool, eps: float, fused: bool) -> None:
        super().__init__()
        self.attention = Attention(dim, n_head, n_local_heads, head_dim, qkv_bias=qkv_bias, o_bias=o_bias,
                                   qk_norm=qk_norm, eps=eps, fused=fused)
        self.feed_forward = SwiGLU(dim, hidden)
        self.ffn_norm = RMSNorm(dim, eps)
        self.attention_norm = RMSNorm(dim, eps)

    def forward(self, x: Tensor, rope: Tensor, mask: Tensor, cache: tuple[Tensor, Tensor] | None,
                start: int | Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x), rope, mask, cache, start)
        return h + self.feed_forward(self.ffn_norm(h))


class KVCache:
    """Per-layer key/value buffers ``[1, H_kv, capacity, D]`` written in place.

    `reserve` grows them before a step needs more: ``static`` (M53) to the next power of two,
    copying once per doubling; ``dynamic`` to exactly the positions asked for, every step (a
    concatenation's cost and peak, as a growing cache has). Attention reads the first positions.
    """

    def __init__(self, layers: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device | str,
                 kind: str = "static", capacity: int = 0) -> None:
        if kind not in ("static", "dynamic"):
            raise ValueError(f"KVCache: kind must be 'static' or 'dynamic', got {kind!r}")
        self.kind, self.shape = kind, (1, heads, 0, head_dim)
        self.dtype, self.device = dtype, device
        self.capacity = 0
        self.layers: list[tuple[Tensor, Tensor]] = [(self._empty(0), self._empty(0)) for _ in range(layers)]
        self.reserve(capacity)

    def _empty(self, n: int) -> Tensor:
        b, h, _, d = self.shape
        return torch.zeros((b, h, n, d), dtype=self.dtype, device=self.device)

    def reserve(self, positions: int) -> None:
        if positions <= self.capacity:
            return
        capacity = capacity_for(positions) if self.kind == "static" else positions
        # Each layer's new buffers replace its old ones in the list before the next layer grows,
        # so one layer's old and new buffers live at a time (`kv_cache.peak_bytes`); a new list
        # filled beside the old one held every old buffer to the end: a whole second cache.
        for i, (keys, values) in enumerate(self.layers):
            k, v = self._empty(capacity), self._empty(capacity)
            k[:, :, : self.capacity] = keys
            v[:, :, : self.capacity] = values
            self.layers[i] = (k, v)
        self.capacity = capacity

    @staticmethod
    def position_bytes(heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Keys and values of one position in one layer."""
        return 2 * heads * head_dim * torch.empty((), dtype=dtype).element_size()


class SlowTransformer(nn.Module):
    """The per-frame transformer: frame embedding, layers, final norm, tied token head."""

    def __init__(self, cfg: DualARConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.codebook_embeddings = nn.Embedding(cfg.codebook_size * cfg.num_codebooks, cfg.dim)
        self.layers = nn.ModuleList(
            Block(cfg.dim, cfg.n_head, cfg.n_local_heads, cfg.head_dim, cfg.intermediate_size,
                  qkv_bias=cfg.attention_qkv_bias, o_bias=cfg.attention_o_bias, qk_norm=cfg.attention_qk_norm,
                  eps=cfg.norm_eps, fused=True)
            for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        if not cfg.tie_word_embeddings:
            self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def new_cache(self, device: torch.device | str, kind: str = "static", capacity: int = 0) -> KVCache:
        dtype = self.embeddings.weight.dtype
        return KVCache(self.cfg.n_layer, self.cfg.n_local_heads, self.cfg.head_dim, dtype, device, kind, capacity)

    def embed(self, rows: Tensor) -> Tensor:
        """``rows`` ``[1 + num_codebooks, S]`` (one frame per column) -> ``[1, S, dim]``."""
        cfg = self.cfg
        offsets = torch.arange(cfg.num_codebooks, device=rows.device)[:, None] * cfg.codebook_size
        codes = self.codebook_embeddings(rows[1:] + offsets).sum(dim=0)  # [S, dim], summed over codebooks in order
        semantic = (rows[0] >= cfg.semantic_begin_id) & (rows[0] <= cfg.semantic_end_id)
        codes = torch.where(semantic[:, None], codes, torch.zeros((), dtype=codes.dtype, device=codes.device))
        x = self.embeddings(rows[0]) + codes
        if cfg.scale_codebook_embeddings:
            x = torch.where(semantic[:, None], x / math.sqrt(cfg.num_codebooks + 1), x)
        return x[None]

    def forward(self, rows: Tensor, start: int, cache: KVCache | None,
                all_positions: bool = False) -> tuple[Tensor, Tensor]:
        """Run frames ``rows`` at positions ``[start, start + S)``; return (logits, hidden) for
        every position if `all_positions`, else for the last one (``[1, 1, vocab]``, ``[1, 1, dim]``)."""
        s = rows.shape[1]
        if cache is not None:
            cache.reserve(start + s)
        x = self.embed(rows)
        positions = torch.arange(start, start + s, device=rows.device)
        rope = pair_table(positions, self.cfg.head_dim, self.cfg.rope_base, ROPE_DTYPE)
        keys = start + s
        mask = torch.ones(s, keys, dtype=torch.bool, device=rows.device).tril(diagonal=start)
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, mask, cache.layers[i] if cache is not None else None, start)
        if not all_positions:
            x = x[:, -1:]
        normed = self.norm(x)
        head = self.output.weight if not self.cfg.tie_word_embeddings else self.embeddings.weight
        logits = F.linear(normed, head)
        return logits, normed if self.cfg.norm_fastlayer_input else x


class FastTransformer(nn.Module):
    """The per-codebook transformer with its own embeddings, norm and head."""

    def __init__(self, cfg: DualARConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.fast_project_in: nn.Module = (nn.Linear(cfg.dim, cfg.fast_dim) if cfg.fast_dim != cfg.dim
                                           else nn.Identity())
        self.fast_embeddings = nn.Embedding(cfg.codebook_size, cfg.fast_dim)
        self.fast_layers = nn.ModuleList(
            Block(cfg.fast_dim, cfg.fast_n_head, cfg.fast_n_local_heads, cfg.fast_head_dim, cfg.fast_intermediate_size,
                  qkv_bias=cfg.fast_attention_qkv_bias, o_bias=cfg.fast_attention_o_bias,
                  qk_norm=cfg.fast_attention_qk_norm, eps=cfg.norm_eps, fused=False)
            for _ in range(cfg.n_fast_layer))
        self.fast_norm = RMSNorm(cfg.fast_dim, cfg.norm_eps)
        self.fast_output = nn.Linear(cfg.fast_dim, cfg.codebook_size, bias=False)

    def new_cache(self, device: torch.device | str) -> KVCache:
        dtype = self.fast_embeddings.weight.dtype
        return KVCache(self.cfg.n_fast_layer, self.cfg.fast_n_local_heads, self.cfg.fast_head_dim, dtype, device,
                       capacity=self.cfg.num_codebooks)

    def rope(self, device: torch.device | str) -> Tensor:
        """The RoPE rows of every codebook position (one table, sliced per step)."""
        return pair_table(torch.arange(self.cfg.num_codebooks, device=device), self.cfg.fast_head_dim,
                          self.cfg.rope_base, ROPE_DTYPE)

    def masks(self, device: torch.device | str) -> Tensor:
        """Row ``i``: the causal mask of position ``i`` over all ``num_codebooks`` cache positions."""
        n = self.cfg.num_codebooks
        return torch.ones(n, n, dtype=torch.bool, device=device).tril()

    def forward(self, x: Tensor, pos: int, cache: KVCache, rope: Tensor, masks: Tensor) -> Tensor:
        """One position: ``x`` ``[1, fast_dim]`` at codebook position `pos` -> logits ``[codebook_size]``."""
        h = x.view(1, 1, -1)
        for i, layer in enumerate(self.fast_layers):
            h = layer(h, rope[pos:pos + 1], masks[pos:pos + 1], cache.layers[i], pos)
        return self.fast_output(self.fast_norm(h))[0, -1]
