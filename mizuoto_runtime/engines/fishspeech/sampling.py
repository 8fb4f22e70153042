"""Fish Speech's sampling, draw for draw as upstream makes it (same seed, same codes).

`probs`: sort the logits descending; remove ranks whose cumulative softmax (without the
temperature) passes `top_p` or whose rank is `top_k` or more, always keeping rank 0; divide the
kept logits by ``max(temperature, 1e-5)``; softmax. `draw`: ``argmax(probs / -log(q))`` with one
uniform ``q`` per vocabulary entry, the exponential-race form of a multinomial draw that needs
no host sync.

Per frame the generator is used in this order: the slow token (vocabulary-sized uniforms),
the repetition-aware fallback's token (temperature 1.0, top-p 0.9, same top-k; another
vocabulary-sized draw), then one codebook-sized draw for each residual codebook. The slow
token may only be a semantic token or ``<|im_end|>`` (an additive bias of -inf elsewhere).
Repetition-aware sampling: if the slow token is semantic and among the last `RAS_WINDOW` slow
tokens of the decode steps (the window starts as zeros; the prefill frame has none and never
enters it), the fallback token replaces it. Upstream accepts a repetition penalty but no longer
applies it; so neither does this.

The temperature and top-p are tensors in the model's dtype, as upstream makes them (in
bfloat16, top-p 0.9 is 0.8984375).

S1-mini's release code (upstream up to d3df505, Apache-2.0) samples otherwise, and
`S1Sampling` does as it does: no bias on the slow logits and no fallback; a repetition penalty
(logits below zero multiplied, others divided) over a window of the decode frames — the
frames ``max(0, i - 16) ..`` as a 16-column block, zero-padded while fewer exist — where the slow
token is penalized on the block's first column (all ``1 + num_codebooks`` values of that frame,
as that code indexes it) and codebook ``k`` on its own row; top-p only (no top-k); residual
logits cut to the first 1024 entries; each draw ``argmax(probs / E)`` with ``E`` from
`Tensor.exponential_`; temperature, top-p and penalty float32 tensors.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

RAS_WINDOW = 10
RAS_TEMPERATURE = 1.0
RAS_TOP_P = 0.9


def probs(logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: int) -> Tensor:
    """Upstream's `logits_to_probs` on a 1-D row of logits."""
    sorted_logits, order = torch.sort(logits, descending=True)
    cumulative = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    ranks = torch.arange(sorted_logits.shape[-1], device=logits.device)
    remove = (cumulative > top_p) | (ranks >= top_k)
    remove[0] = False
    remove = remove.scatter(dim=-1, index=order, src=remove)
    kept = torch.where(remove, float("-inf"), logits)
    return torch.softmax(kept / torch.clip(temperature, min=1e-5), dim=-1)


def draw(p: Tensor, generator: torch.Generator) -> Tensor:
    """One index ``[1]`` (int32) from `p`, with one uniform per entry from `generator`."""
    q = torch.rand(p.shape, generator=generator, dtype=p.dtype, device=p.device)
    return torch.argmax(p / -torch.log(q), dim=-1, keepdim=True).to(dtype=torch.int)


@dataclasses.dataclass(frozen=True)
class SamplingTensors:
    """The per-request sampling values as device tensors (built once, read every frame)."""

    temperature: Tensor
    top_p: Tensor
    top_k: int
    ras_temperature: Tensor
    ras_top_p: Tensor
    slow_bias: Tensor  # [vocab]: 0 on semantic ids and <|im_end|>, -inf elsewhere

    @staticmethod
    def build(*, temperature: float, top_p: float, top_k: int, vocab_size: int, semantic_begin: int,
              semantic_end: int, im_end_id: int, dtype: torch.dtype, device: torch.device | str) -> SamplingTensors:
        bias = torch.full((vocab_size,), float("-inf"), dtype=dtype, device=device)
        bias[semantic_begin:semantic_end + 1] = 0.0
        bias[im_end_id] = 0.0
        return SamplingTensors(
            temperature=torch.tensor(temperature, dtype=dtype, device=device),
            top_p=torch.tensor(top_p, dtype=dtype, device=device), top_k=top_k,
            ras_temperature=torch.tensor(RAS_TEMPERATURE, dtype=dtype, device=device),
            ras_top_p=torch.tensor(RAS_TOP_P, dtype=dtype, device=device), slow_bias=bias)

    def slow_token(self, logits: Tensor, generator: torch.Generator, history: Tensor | None,
                   semantic_begin: int, semantic_end: int) -> Tensor:
        """The frame's token ``[1]``: the normal draw, then the fallback's draw, then RAS against
        the last `RAS_WINDOW` decode frames' tokens (`history`: the decode frames so far)."""
        biased = logits + self.slow_bias
        normal = draw(probs(biased, self.temperature, self.top_p, self.top_k), generator)
        high = draw(probs(biased, self.ras_temperature, self.ras_top_p, self.top_k), generator)
        if history is None:
            return normal
        # Upstream's window starts as zeros; a zero never matches a semantic token, so the
        # frames there are enough.
        window = history[0, -RAS_WINDOW:]
        repeated = (window == normal).any() & (normal >= semantic_begin) & (normal <= semantic_end)
        return torch.where(repeated, high, normal)

    def code(self, logits: Tensor, k: int, generator: torch.Generator, history: Tensor | None) -> Tensor:
        """Codebook `k`'s code ``[1]`` (no bias, no penalty)."""
        return draw(probs(logits, self.temperature, self.top_p, self.top_k), generator)


S1_PENALTY_WINDOW = 16
S1_RESIDUAL_LOGITS = 1024


def penalized(logits: Tensor, previous: Tensor, penalty: Tensor) -> Tensor:
    """S1's repetition penalty on the ids in `previous` (in place, as upstream's `scatter_`)."""
    index = previous.long()
    score = torch.gather(logits, dim=-1, index=index)
    score = torch.where(score < 0, score * penalty, score / penalty)
    return logits.scatter_(dim=-1, index=index, src=score)


def s1_probs(logits: Tensor, temperature: Tensor, top_p: Tensor) -> Tensor:
    sorted_logits, order = torch.sort(logits, descending=True)
    remove = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1) > top_p
    remove[0] = False
    remove = remove.scatter(dim=-1, index=order, src=remove)
    return torch.softmax(logits.masked_fill(remove, -float("Inf")) / torch.clip(temperature, min=1e-5), dim=-1)


def s1_draw(p: Tensor, generator: torch.Generator) -> Tensor:
    q = torch.empty_like(p).exponential_(1, generator=generator)
    return torch.argmax(p / q, dim=-1, keepdim=True).to(dtype=torch.int)


@dataclasses.dataclass(frozen=True)
class S1Sampling:
    """S1-mini's sampling (see the module docstring)."""

    temperature: Tensor
    top_p: Tensor
    penalty: Tensor

    @staticmethod
    def build(*, temperature: float, top_p: float, repetition_penalty: float,
              device: torch.device | str) -> S1Sampling:
        def value(v: float) -> Tensor:
            return torch.tensor(v, dtype=torch.float, device=device)
        return S1Sampling(value(temperature), value(top_p), value(repetition_penalty))

    @staticmethod
    def window(history: Tensor) -> Tensor:
        """The 16 frames' block upstream penalizes with: from ``max(0, i - 16)``, zero-padded."""
        i = history.shape[1]
        block = history[:, max(0, i - S1_PENALTY_WINDOW):][:, :S1_PENALTY_WINDOW]
        out = torch.zeros((history.shape[0], S1_PENALTY_WINDOW), dtype=history.dtype, device=history.device)
        out[:, : block.shape[1]] = block
        return out

    def _sample(self, logits: Tensor, previous: Tensor | None, generator: torch.Generator) -> Tensor:
        if previous is not None:
            logits = penalized(logits.clone(), previous, self.penalty)
        return s1_draw(s1_probs(logits, self.temperature, self.top_p), generator)

    def slow_token(self, logits: Tensor, generator: torch.Generator, history: Tensor | None,
                   semantic_begin: int, semantic_end: int) -> Tensor:
        previous = None if history is None else self.window(history)[:, 0]
        return self._sample(logits, previous, generator)

    def code(self, logits: Tensor, k: int, generator: torch.Generator, history: Tensor | None) -> Tensor:
        previous = None if history is None else self.window(history)[k + 1]
        return self._sample(logits[:S1_RESIDUAL_LOGITS], previous, generator)
