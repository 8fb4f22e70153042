"""Decoding the semantic codes as upstream's generate call does: beam-sample, sampling, greedy.

Upstream runs its copy of transformers 4.52's GenerationMixin; the codes are only identical
under a seed if the same random draws happen in the same order, so this follows that order:
- beam (num_beams > 1): log_softmax -> repetition penalty -> + beam scores -> temperature ->
  top-k -> top-p (both keeping at least 2) -> softmax over beams x vocabulary -> one
  multinomial draw of 2 x beams without replacement -> sort; greedy beams take top-k instead.
  Finished hypotheses are scored by their summed log-probabilities (length penalty 0 in
  IndexTTS-2's settings); decoding ends when the best open score cannot beat the worst kept
  hypothesis, or at the length limit;
- one beam: repetition penalty on the raw logits -> temperature -> top-k -> top-p -> softmax ->
  multinomial(1); greedy takes the argmax after the repetition penalty only.
The repetition penalty covers the whole row, the prompt's placeholder ids included.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """IndexTTS-2's defaults (infer_v2 always samples)."""

    do_sample: bool = True
    top_p: float = 0.8
    top_k: int = 30
    temperature: float = 0.8
    num_beams: int = 3
    repetition_penalty: float = 10.0
    length_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.num_beams < 1:
            raise ValueError(f"num_beams must be at least 1, got {self.num_beams}")


class StepModel(Protocol):
    """What decoding needs from the model: logits for the rows after the prompt, after one more
    token per row, and the rows' cache reordered after beams are chosen."""

    def start(self, rows: int) -> torch.Tensor: ...

    def step(self, tokens: torch.Tensor) -> torch.Tensor: ...

    def reorder(self, rows: torch.Tensor) -> None: ...


def repetition_penalty(ids: torch.Tensor, scores: torch.Tensor, penalty: float) -> torch.Tensor:
    picked = torch.gather(scores, 1, ids)
    picked = torch.where(picked < 0, picked * penalty, picked / penalty)
    return scores.scatter(1, ids, picked)


def top_k_filter(scores: torch.Tensor, k: int, keep: int) -> torch.Tensor:
    k = min(max(k, keep), scores.shape[-1])
    return scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], -float("inf"))


def top_p_filter(scores: torch.Tensor, p: float, keep: int) -> torch.Tensor:
    ordered, order = torch.sort(scores, descending=False)
    drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= (1 - p)
    drop[..., -keep:] = False
    return scores.masked_fill(drop.scatter(1, order, drop), -float("inf"))


def process(ids: torch.Tensor, scores: torch.Tensor, s: DecodeSettings) -> torch.Tensor:
    """The logits processors upstream's settings select, in their order."""
    if s.repetition_penalty != 1.0:
        scores = repetition_penalty(ids, scores, s.repetition_penalty)
    if not s.do_sample:
        return scores
    keep = 2 if s.num_beams > 1 else 1
    if s.temperature != 1.0:
        scores = scores / s.temperature
    if s.top_k:
        scores = top_k_filter(scores, s.top_k, keep)
    if s.top_p < 1.0:
        scores = top_p_filter(scores, s.top_p, keep)
    return scores


def generate(model: StepModel, prompt_ids: torch.Tensor, max_new: int, stop: int,
             settings: DecodeSettings) -> torch.Tensor:
    """prompt_ids (1, P) -> the generated codes (1, n) (may end with `stop`)."""
    if settings.num_beams > 1:
        return _beams(model, prompt_ids, max_new, stop, settings)
    return _single(model, prompt_ids, max_new, stop, settings)


def _single(model: StepModel, ids: torch.Tensor, max_new: int, stop: int, s: DecodeSettings) -> torch.Tensor:
    prompt = ids.shape[1]
    logits = model.start(1)
    ids = ids.to(logits.device)  # the ids and scores live where the logits do, as upstream's
    while True:
        scores = process(ids, logits.float(), s)
        if s.do_sample:
            token = torch.multinomial(F.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        else:
            token = torch.argmax(scores, dim=-1)
        ids = torch.cat([ids, token[:, None]], dim=-1)
        if int(token[0]) == stop or ids.shape[1] - prompt >= max_new:
            return ids[:, prompt:]
        logits = model.step(token)


@dataclasses.dataclass
class _Hypotheses:
    """Finished beams, best `size` kept, scored by summed log-probability / length^penalty."""

    size: int
    length_penalty: float
    kept: list[tuple[float, torch.Tensor]] = dataclasses.field(default_factory=list)
    worst: float = 1e9

    def add(self, ids: torch.Tensor, logprob: float, generated: int) -> None:
        score = logprob / (generated ** self.length_penalty)
        if len(self.kept) < self.size or score > self.worst:
            self.kept.append((score, ids))
            if len(self.kept) > self.size:
                ranked = sorted((sc, i) for i, (sc, _) in enumerate(self.kept))
                del self.kept[ranked[0][1]]
                self.worst = ranked[1][0]
            else:
                self.worst = min(score, self.worst)

    def done(self, best_open: float, generated: int) -> bool:
        if len(self.kept) < self.size:
            return False
        return self.worst >= best_open / (generated ** self.length_penalty)

    def best(self) -> torch.Tensor:
        return sorted(self.kept, key=lambda h: h[0])[-1][1]


def _beams(model: StepModel, ids: torch.Tensor, max_new: int, stop: int, s: DecodeSettings) -> torch.Tensor:
    beams, prompt = s.num_beams, ids.shape[1]
    max_len = prompt + max_new
    hyps = _Hypotheses(beams, s.length_penalty)
    finished = False
    logits = model.start(beams)
    device = logits.device  # the ids and beam scores live where the logits do, as upstream's
    ids = ids.to(device).repeat_interleave(beams, dim=0)
    beam_scores = torch.zeros(beams, device=device)
    beam_scores[1:] = -1e9
    while True:
        scores = process(ids, F.log_softmax(logits.float(), dim=-1), s) + beam_scores[:, None]
        vocab = scores.shape[-1]
        flat = scores.view(1, beams * vocab)
        if s.do_sample:
            picks = torch.multinomial(F.softmax(flat, dim=-1), num_samples=2 * beams)
            picked = torch.gather(flat, -1, picks)
            picked, order = torch.sort(picked, descending=True, dim=1)
            picks = torch.gather(picks, -1, order)
        else:
            picked, picks = torch.topk(flat, 2 * beams, dim=1, largest=True, sorted=True)
        sources, tokens = picks[0] // vocab, picks[0] % vocab
        cur = ids.shape[1] + 1  # the length these scores are for
        next_scores = torch.zeros(beams, dtype=picked.dtype, device=device)
        next_tokens = torch.zeros(beams, dtype=tokens.dtype, device=device)
        next_rows = torch.zeros(beams, dtype=sources.dtype, device=device)
        filled = 0
        for rank in range(2 * beams):
            if int(tokens[rank]) == stop:
                if rank < beams:
                    hyps.add(ids[sources[rank]].clone(), picked[0, rank].item(), cur - prompt)
            else:
                next_scores[filled], next_tokens[filled], next_rows[filled] = (picked[0, rank], tokens[rank],
                                                                               sources[rank])
                filled += 1
            if filled == beams:
                break
        finished = finished or hyps.done(picked[0].max().item(), cur - prompt)
        beam_scores = next_scores
        ids = torch.cat([ids[next_rows], next_tokens[:, None]], dim=-1)
        if finished or ids.shape[1] >= max_len:
            break
        model.reorder(next_rows)
        logits = model.step(next_tokens)
    if not finished:
        for row in range(beams):
            hyps.add(ids[row], beam_scores[row].item(), ids.shape[1] - prompt)
    best = hyps.best()
    if best.shape[0] < max_len:
        best = torch.cat([best, best.new_tensor([stop])])
    return best[prompt:].unsqueeze(0)
