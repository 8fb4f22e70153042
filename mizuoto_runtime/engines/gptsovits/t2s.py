"""GPT-SoVITS's T2S decoder: text phonemes + BERT features + a prompt's semantic tokens → new
semantic tokens, written from reading upstream's `AR/models/t2s_model.py` (MIT).

The module tree and parameter names follow the published `.ckpt` (after its ``model.`` prefix):
``bert_proj``, ``ar_text_embedding.word_embeddings``, ``ar_text_position.alpha``,
``ar_audio_embedding``, ``ar_audio_position``, ``h.layers.N.{self_attn,linear1,linear2,norm1,norm2}``
and ``ar_predict_layer``. The blocks are post-norm: ``x = LN1(x + attn(x)); x = LN2(x + FFN(x))``.

Streaming (M13). Each block's attention keeps q, k and v stacked in one raw ``in_proj_weight``
parameter (plus ``in_proj_bias``), as the checkpoint stores them, not in `nn.Linear` layers.
`T2SAttention` reads them only inside its own forward, so it declares ``STREAMABLE = True``:
the whole block — in_proj, out_proj and both FFN linears — moves as one unit (M11), and only
the LayerNorms stay in the fixed part. `memory_units()` names the blocks (M12) so that a small
model's blocks are units too.

The KV cache per layer is ``[B, T, D]`` before the head split, as upstream keeps it.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from .config import T2SConfig
from .sampling import upstream_sample

PE_ROWS = 4000  # upstream builds its sine table for 4000 positions and extends it on demand


class TokenEmbedding(nn.Module):
    def __init__(self, dim: int, vocab: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.word_embeddings(ids)


def sine_table(rows: int, dim: int) -> torch.Tensor:
    """[1, rows, dim]: sin in even dims, cos in odd, computed as upstream does (float32)."""
    position = torch.arange(0, rows, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * -(math.log(10000.0) / dim))
    pe = torch.zeros(rows, dim)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe.unsqueeze(0)


class SinePositionalEmbedding(nn.Module):
    """``x * 1 + alpha * pe[:, :T]`` (upstream's x_scale is 1: ``scale=False``).

    The sine table stays on the host, outside the module's tensors: only the rows a call reads
    go to the device (upstream keeps a 4000-row table there, 8 MB per embedding at 512 dims)."""

    x_scale = 1.0

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.alpha = nn.Parameter(torch.ones(1))
        self.pe = sine_table(PE_ROWS, dim)

    def rows(self, start: int, stop: int, like: torch.Tensor) -> torch.Tensor:
        if self.pe.shape[1] < stop:  # grown like upstream's extend_pe: one table for all rows
            self.pe = sine_table(stop, self.dim)
        return self.pe[:, start:stop].to(dtype=like.dtype, device=like.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.x_scale + self.alpha * self.rows(0, x.shape[1], x)

    def at(self, x: torch.Tensor, position: int) -> torch.Tensor:
        """One position (the cached decode step): ``x * 1 + alpha * pe[:, position]``."""
        return x * self.x_scale + self.alpha * self.rows(position, position + 1, x)[:, 0]


class T2SAttention(nn.Module):
    """Multi-head self-attention over raw stacked q/k/v weights (upstream's
    ``nn.MultiheadAttention``-shaped parameters). Reads ``in_proj_weight`` / ``in_proj_bias`` only
    in its own forward, hence streamable (M13); ``out_proj`` is a plain `nn.Linear`."""

    STREAMABLE = True

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None,
                mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, D]; `cache` the layer's (k, v) so far (None for the prompt); `mask` bool
        [.., T, S], True = may attend. Returns the output and the updated (k, v)."""
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        if cache is not None:
            k = torch.cat([cache[0], k], dim=1)
            v = torch.cat([cache[1], v], dim=1)
        b, t, _ = q.shape
        s = k.shape[1]
        qh = q.view(b, t, self.heads, -1).transpose(1, 2)
        kh = k.view(b, s, self.heads, -1).transpose(1, 2)
        vh = v.view(b, s, self.heads, -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(qh, kh, vh, mask)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, -1)), k, v


class T2SBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.self_attn = T2SAttention(dim, heads)
        self.linear1 = nn.Linear(dim, 4 * dim)
        self.linear2 = nn.Linear(4 * dim, dim)
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None,
                mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn, k, v = self.self_attn(x, cache, mask)
        x = self.norm1(x + attn)
        x = self.norm2(x + self.linear2(F.relu(self.linear1(x))))
        return x, k, v


class T2SStack(nn.Module):
    def __init__(self, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(T2SBlock(dim, heads) for _ in range(layers))


KVCache = list[tuple[torch.Tensor, torch.Tensor]]


@dataclasses.dataclass
class T2SResult:
    """What one sampled run gives: ``tokens`` = prompt + new tokens (EOS dropped), and ``idx``,
    upstream's step count, which equals the number of new tokens (``tokens[:, -idx:]``)."""

    tokens: torch.Tensor
    idx: int


class Text2Semantic(nn.Module):
    def __init__(self, cfg: T2SConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.embedding_dim
        self.bert_proj = nn.Linear(1024, d)
        self.ar_text_embedding = TokenEmbedding(d, cfg.phoneme_vocab_size)
        self.ar_text_position = SinePositionalEmbedding(d)
        self.ar_audio_embedding = TokenEmbedding(d, cfg.vocab_size)
        self.ar_audio_position = SinePositionalEmbedding(d)
        self.h = T2SStack(cfg.hidden_dim, cfg.head, cfg.n_layer)
        self.ar_predict_layer = nn.Linear(cfg.hidden_dim, cfg.vocab_size, bias=False)

    def memory_units(self) -> list[nn.Module]:
        """M12: the blocks, whatever their size."""
        return list(self.h.layers)

    # -- the pieces the reference checker runs one by one --------------------------------------
    def embed_prompt(self, phones: torch.Tensor, bert: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        """xy_pos [B, Tx+Ty, D]: text embedding + projected BERT features, then each stream's own
        sine positions (the semantic positions restart at 0)."""
        x = self.ar_text_embedding(phones) + self.bert_proj(bert.transpose(1, 2))
        x = self.ar_text_position(x)
        y = self.ar_audio_position(self.ar_audio_embedding(prompt))
        return torch.cat([x, y], dim=1)

    @staticmethod
    def prompt_mask(tx: int, ty: int, device: torch.device) -> torch.Tensor:
        """[Tx+Ty, Tx+Ty] bool, True = blocked: text rows see the text only, semantic rows see
        all of the text and the semantic tokens up to their own."""
        x_rows = F.pad(torch.zeros(tx, tx, dtype=torch.bool, device=device), (0, ty), value=True)
        y_rows = F.pad(torch.triu(torch.ones(ty, ty, dtype=torch.bool, device=device), diagonal=1), (tx, 0),
                       value=False)
        return torch.cat([x_rows, y_rows], dim=0)

    def run_prompt(self, xy_pos: torch.Tensor, blocked: torch.Tensor) -> tuple[torch.Tensor, KVCache]:
        x, cache = xy_pos, []
        allowed = (~blocked)[None, None]
        for layer in self.h.layers:
            x, k, v = layer(x, None, allowed)
            # k and v are views of the layer's q/k/v projection: copied, the projection (q's third
            # with them) is freed, so the cache holds 2 x D per position, as `peak_bytes` counts
            cache.append((k.clone(), v.clone()))
        return x, cache

    def step_embedding(self, token: torch.Tensor, position: int) -> torch.Tensor:
        return self.ar_audio_position.at(self.ar_audio_embedding(token), position)

    def run_step(self, x: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, KVCache]:
        """One position through every layer; each layer's grown cache replaces its old one in
        `cache` as it is made, so the old is freed then (one layer's copy at a time, as
        `nn.kv_cache.peak_bytes` counts), not after the last layer (a whole second cache)."""
        for i, layer in enumerate(self.h.layers):
            x, k, v = layer(x, cache[i], None)
            cache[i] = (k, v)
        return x, cache

    # -- the sampled loop ----------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, phones: torch.Tensor, bert: torch.Tensor, prompt: torch.Tensor, *, top_k: int,
                 top_p: float, temperature: float, repetition_penalty: float, early_stop_num: int = -1,
                 max_steps: int = 1500, on_step: Callable[[int], None] | None = None) -> T2SResult:
        """Upstream's ``infer_panel`` (naive, one sequence), draw for draw: one Exp(1) draw per step
        from torch's global RNG, the EOS column left out for the first 11 steps, the repetition
        penalty over every token so far (prompt included) applied in place before the EOS check."""
        xy_pos = self.embed_prompt(phones, bert, prompt)
        ty = prompt.shape[1]
        y = prompt
        hidden, cache = self.run_prompt(xy_pos, self.prompt_mask(phones.shape[1], ty, xy_pos.device))
        idx = 0
        for idx in range(max_steps):
            logits = self.ar_predict_layer(hidden[:, -1])
            if idx < 11:  # at least 11 tokens before the model may stop
                logits = logits[:, :-1]
            samples = upstream_sample(logits, y, top_k=top_k, top_p=top_p, temperature=temperature,
                                      repetition_penalty=repetition_penalty)
            y = torch.cat([y, samples], dim=1)
            stop = early_stop_num != -1 and (y.shape[1] - ty) > early_stop_num
            if int(torch.argmax(logits, dim=-1)[0]) == self.cfg.eos or int(samples[0, 0]) == self.cfg.eos:
                stop = True
                y = y[:, :-1]
            if on_step is not None:
                on_step(idx)
            if stop or idx == max_steps - 1:
                break
            hidden, cache = self.run_step(self.step_embedding(y[:, -1:], ty + idx), cache)
        if y.shape[1] == 0:
            y = torch.zeros(1, 1, dtype=prompt.dtype, device=prompt.device)
        return T2SResult(y, idx)


def load_state(model: Text2Semantic, weights: dict[str, torch.Tensor], where: str) -> None:
    """Fill `model` from a ``.ckpt``'s ``weight`` dict (keys ``model.<name>``), strictly, naming
    what is missing or unexpected."""
    state = {k.removeprefix("model."): v for k, v in weights.items()}
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{where}: not a GPT-SoVITS T2S state: missing {_few(missing)}, unexpected {_few(unexpected)}")
    for name, tensor in expected.items():
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise ValueError(f"{where}: tensor {name} has shape {tuple(state[name].shape)}, "
                             f"the config gives {tuple(tensor.shape)}")
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)


def _few(names: Sequence[str]) -> str:
    return "none" if not names else ", ".join(names[:4]) + (f" (+{len(names) - 4} more)" if len(names) > 4 else "")
