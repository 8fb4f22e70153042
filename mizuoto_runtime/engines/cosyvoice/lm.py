"""CosyVoice's speech-token LM: Qwen2LM (CosyVoice 2) and CosyVoice3LM (CosyVoice 3), their RAS
sampling and our token loop (issue 22; M46, M53).

The LM is a Qwen2 decoder (`mizuoto_runtime.nn.decoder`) fed embeddings:
``[sos, embed_tokens(prompt_text ++ text), task_id, speech_embedding(prompt_speech_tokens)]``,
then one speech embedding per drawn token. CosyVoice 2 takes sos/task_id from a 2-row
``llm_embedding`` and has 3 stop ids (``S``, ``S+1``, ``S+2`` for ``S = speech_token_size``);
CosyVoice 3 takes them from ``speech_embedding`` rows ``S`` and ``S+2`` and stops on any of
``S .. S+199``. While fewer than ``min_len`` tokens were drawn, only index ``S`` is masked
(for CosyVoice 3 that is sos, not eos: other stop ids can still end early) — upstream's rule.

RAS sampling (`RasSampler`) makes upstream's random draws in upstream's order from the global
torch generator: ``multinomial`` over the kept nucleus (unnormalised), then, when that id
occurs in the last ``win_size`` tokens often enough, ``multinomial`` over the full softmax with
that id removed (M57: the same seed gives upstream's tokens, in every placement).

Host reads. ``multinomial(1, replacement=True)`` is ``argmax(p / q)`` with ``q`` one
``exponential_`` draw per element of ``p`` — after host checks of ``p`` (finite, non-negative, non-zero
sum). `draw` does that arithmetic without the checks: the same ids from the same random
numbers. The kept count stays on the device (`kept_mask`: upstream's float32 running sum,
added in the same order) and the draw runs over the ``top_k`` head with the dropped
probabilities zeroed, which gives the same id (``q[:kept]`` are the same numbers, and the
zeros never win the argmax). Whether that also leaves the generator where upstream's leaves it
depends on the generator: CUDA's Philox advances by one fixed offset for any tensor this size
(torch's launch policy for random kernels: one block of threads up to 1024 elements, element
*i* from thread *i*), so there nothing is read — taken from torch's kernel, not yet measured on
a GPU; the CPU's Mersenne Twister advances by one number per element, so the
draw must have exactly the kept size and the count is read there — a read of host memory,
which costs no device sync. One read per token is left on every device: the drawn id.
Whether the repetition fallback draws again (and so moves the generator) depends on it, and
the loop must know it to stop; a fallback token reads its second id as well.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ...nn.decoder import Cache, DecoderConfig, DecoderModel


@dataclasses.dataclass(frozen=True)
class RasParams:
    """``cosyvoice.utils.common.ras_sampling``'s settings (the yaml's ``sampling``)."""

    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1


def draw(prob: torch.Tensor) -> torch.Tensor:
    """``prob.multinomial(1, replacement=True)`` of a 1-D `prob` (weights, not necessarily
    normalised), as a 0-dim index on its device: torch's own algorithm for one sample (an
    exponential per element, the argmax of weight / draw), without its host checks."""
    return (prob / torch.empty_like(prob).exponential_(1)).argmax()


def kept_mask(head: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which of the sorted probabilities `head` (descending) upstream's nucleus keeps: the first
    always, each next one while the float32 running sum of those before it is below `top_p`.
    The sum is added element by element, in order, as upstream adds it (a cumsum would round
    differently); on the device, so nothing is read."""
    before = [torch.zeros_like(head[0])]
    for value in head[:-1]:
        before.append(before[-1] + value)
    return torch.stack(before) < top_p


class RasSampler:
    """Repetition-aware sampling as upstream draws it."""

    def __init__(self, params: RasParams) -> None:
        self.params = params
        self.fallbacks: list[bool] = []

    def nucleus(self, scores: torch.Tensor) -> torch.Tensor:
        """The nucleus draw's id, on the device (module docstring: host reads)."""
        sorted_value, sorted_idx = scores.softmax(dim=0).sort(descending=True, stable=True)
        head = sorted_value[: self.params.top_k]
        keep = kept_mask(head, self.params.top_p)
        if head.device.type == "cpu":  # one random number per element: exactly the kept ones
            prob = head[: int(keep.sum())]
        else:
            prob = torch.where(keep, head, torch.zeros_like(head))
        return sorted_idx[draw(prob)]

    def __call__(self, scores: torch.Tensor, decoded: Sequence[int]) -> int:
        """One token from log-probabilities `scores` (1-D; changed in place on a fallback, as upstream)."""
        p = self.params
        top = int(self.nucleus(scores))  # the one read per token
        window = decoded[-p.win_size:] if p.win_size > 0 else []
        fallback = sum(1 for t in window if t == top) >= p.win_size * p.tau_r
        if fallback:
            scores[top] = -float("inf")
            top = int(draw(scores.softmax(dim=0)))
        self.fallbacks.append(fallback)
        return top


class Qwen2Encoder(nn.Module):
    """Upstream's wrapper names: ``llm.model.model.*`` is the decoder (its ``lm_head`` is unused)."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.model = DecoderModel(config)


@dataclasses.dataclass(frozen=True)
class LMSpec:
    version: int  # 2 or 3
    llm_input_size: int
    llm_output_size: int
    speech_token_size: int
    decoder: DecoderConfig
    sampling: RasParams


class CosyVoiceLM(nn.Module):
    """``Qwen2LM`` (version 2) or ``CosyVoice3LM`` (version 3), inference only."""

    def __init__(self, spec: LMSpec) -> None:
        super().__init__()
        self.spec = spec
        s, d = spec.speech_token_size, spec.llm_input_size
        self.llm = Qwen2Encoder(spec.decoder)
        if spec.version == 2:
            self.sos, self.task_id, self.eos_token = 0, 1, s
            self.stop_token_ids = [s + i for i in range(3)]
            self.llm_embedding = nn.Embedding(2, d)
            self.llm_decoder = nn.Linear(spec.llm_output_size, s + 3)
            self.speech_embedding = nn.Embedding(s + 3, d)
        elif spec.version == 3:
            self.sos, self.eos_token, self.task_id = s, s + 1, s + 2
            self.stop_token_ids = [s + i for i in range(200)]
            self.llm_decoder = nn.Linear(spec.llm_output_size, s + 200, bias=False)
            self.speech_embedding = nn.Embedding(s + 200, d)
        else:
            raise ValueError(f"CosyVoice LM: version must be 2 or 3, got {spec.version}")
        self.first_stop = s

    def memory_units(self) -> list[nn.Module]:
        """M11/M12: one unit per decoder layer (24 in the real model)."""
        return list(self.backbone.layers)

    @property
    def backbone(self) -> DecoderModel:
        return self.llm.model.model

    def _special(self, index: int, device: torch.device) -> torch.Tensor:
        table = self.llm_embedding if self.spec.version == 2 else self.speech_embedding
        return self.embed(table, index, device)

    @staticmethod
    def embed(table: nn.Embedding, index: int, device: torch.device) -> torch.Tensor:
        """Row `index` of `table` as ``(1, 1, D)``: upstream's ``weight[index]``, called as the
        module so a streamed or placed table is where the runtime put it."""
        return table(torch.tensor([[index]], device=device))

    def prefill_input(self, text: torch.Tensor, prompt_text: torch.Tensor,
                      prompt_speech_token: torch.Tensor) -> torch.Tensor:
        """``[sos, text embeddings, task_id, prompt speech embeddings]`` ``(1, L, D)``."""
        text_emb = self.backbone.embed_tokens(torch.cat([prompt_text, text], dim=1))
        if prompt_speech_token.shape[1]:
            speech = self.speech_embedding(prompt_speech_token)
        else:
            speech = text_emb.new_zeros(1, 0, self.spec.llm_input_size)
        device = text.device
        return torch.cat([self._special(self.sos, device), text_emb, self._special(self.task_id, device), speech],
                         dim=1)

    def logits(self, x: torch.Tensor, cache: Cache | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states of `x` after the cache, and the decoder logits of its last position."""
        hidden = self.backbone(x, cache)
        return hidden, self.llm_decoder(hidden[:, -1])

    def is_stop(self, token: int) -> bool:
        return token >= self.first_stop


def length_bounds(text_len: int, min_ratio: float = 2, max_ratio: float = 20) -> tuple[int, int]:
    """Upstream's ``min_len``/``max_len`` from the number of text tokens (without the prompt text)."""
    return int(text_len * min_ratio), int(text_len * max_ratio)


@dataclasses.dataclass
class Generation:
    tokens: list[int]
    stop_token: int | None
    fallbacks: list[bool]
    step_logits: list[torch.Tensor]


def generate(lm: CosyVoiceLM, lm_input: torch.Tensor, min_len: int, max_len: int, sampler: RasSampler,
             cache: Cache, *, keep_logits: bool = False,
             on_token: Callable[[int], Any] | None = None) -> Generation:
    """Upstream's ``inference_wrapper`` loop (non-vllm): prefill, then one position per token
    until a stop id or `max_len` tokens; draws from the global torch generator."""
    tokens: list[int] = []
    kept: list[torch.Tensor] = []
    stop: int | None = None
    x = lm_input
    for step in range(max_len):
        _, logits = lm.logits(x, cache)
        if keep_logits:
            kept.append(logits[0].detach().clone())
        scores = logits.log_softmax(dim=-1).squeeze(0)
        if step < min_len:
            scores[lm.first_stop] = -float("inf")
        token = sampler(scores, tokens)
        if lm.is_stop(token):
            stop = token
            break
        tokens.append(token)
        if on_token is not None:
            on_token(token)
        x = lm.embed(lm.speech_embedding, token, lm_input.device)
    return Generation(tokens, stop, list(sampler.fallbacks), kept)
