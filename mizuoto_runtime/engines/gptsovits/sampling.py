"""GPT-SoVITS's token sampler, written from reading upstream's ``AR/models/utils.py`` (MIT).

The order of operations is the contract (sampled tokens must be identical under a seed):
repetition penalty in place on ``logits`` (the caller's tensor changes, so its EOS check sees
penalised values) → top-p when below 1 → divide by ``max(temperature, 1e-5)`` → keep logits
at or above the k-th largest → softmax → ``argmax(probs / q)`` with ``q ~ Exp(1)`` drawn from
torch's global RNG in the shape of ``probs`` (drawn even for top_k = 1).
"""
from __future__ import annotations

import torch


def penalise_in_place(logits: torch.Tensor, previous: torch.Tensor, penalty: float) -> None:
    """Every token of ``previous`` (prompt included): positive logits divided, negative
    multiplied by ``penalty`` — in place, as upstream's ``scatter_``."""
    if penalty == 1.0:
        return
    index = previous.long()
    score = torch.gather(logits, dim=1, index=index)
    score = torch.where(score < 0, score * penalty, score / penalty)
    logits.scatter_(dim=1, index=index, src=score)


def probabilities(logits: torch.Tensor, previous: torch.Tensor | None, *, top_k: int | None, top_p: float | None,
                  temperature: float, repetition_penalty: float) -> torch.Tensor:
    if previous is not None:
        penalise_in_place(logits, previous, repetition_penalty)
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_index = torch.sort(logits, descending=True)
        cumulative = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
        remove = cumulative > top_p
        remove[:, 0] = False  # keep at least one
        logits = logits.masked_fill(remove.scatter(dim=1, index=sorted_index, src=remove), -float("inf"))
    logits = logits / max(temperature, 1e-5)
    if top_k is not None:
        pivot = torch.topk(logits, min(top_k, logits.shape[-1]))[0][:, -1].unsqueeze(-1)
        logits = torch.where(logits < pivot, -float("inf"), logits)
    return torch.softmax(logits, dim=-1)


def upstream_sample(logits: torch.Tensor, previous: torch.Tensor | None, *, top_k: int | None, top_p: float | None,
                    temperature: float, repetition_penalty: float) -> torch.Tensor:
    """[B, 1] int32 token ids (upstream's dtype), one Exp(1) draw of ``logits``' shape."""
    probs = probabilities(logits, previous, top_k=top_k, top_p=top_p, temperature=temperature,
                          repetition_penalty=repetition_penalty)
    q = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / q, dim=-1, keepdim=True).to(dtype=torch.int)
