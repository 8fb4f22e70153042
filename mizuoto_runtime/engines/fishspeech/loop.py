"""The dual-AR token loop: our own lean loop over `SlowTransformer` and `FastTransformer`.

One frame: the slow transformer runs the previous frame (the prompt, for the first) and gives
the token logits and a hidden state; the slow token is sampled (`SamplingTensors.slow_token`);
the fast transformer runs the hidden state at position 0 (its logits unused, as upstream), then
codebook 1's code (the slow token minus the first semantic id, clamped) and each later code,
sampling codebook ``i`` from position ``i - 1``'s logits. A frame is ``[1 + num_codebooks]``:
the token id, the semantic code, the residual codes.

Stop: after a decode frame whose token is ``<|im_end|>`` (the prefill frame is never checked,
as upstream's loop does not check it). The loop keeps every value on the device and looks at
the tokens only every `sync_every` frames (one host sync per block, none per frame); frames
computed past the stop are dropped, and so are the draws they made, so the result is the same
for every `sync_every`. The codes returned drop the last frame, as upstream's caller does,
whether or not it was ``<|im_end|>``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from .dual_ar import FastTransformer, KVCache, SlowTransformer
from .sampling import S1Sampling, SamplingTensors

SYNC_EVERY = 8


@dataclasses.dataclass
class Generated:
    """What the loop made: every frame (``[1 + num_codebooks, n]``) and the codes a caller
    keeps (``[num_codebooks, n - 1]``), whether it stopped on ``<|im_end|>``, and how many
    frames it computed (up to ``sync_every - 1`` past the stop)."""

    frames: Tensor
    stopped: bool
    computed: int

    @property
    def codes(self) -> Tensor:
        return self.frames[1:, :-1]


def frame_count(prompt_len: int, max_new_tokens: int, max_seq_len: int) -> int:
    """Upstream's bound on frames: `max_new_tokens` (all the room left when 0), capped by the
    room left in `max_seq_len`."""
    if prompt_len >= max_seq_len:
        raise ValueError(f"the prompt has {prompt_len} positions; the model holds at most {max_seq_len}")
    room = max_seq_len - prompt_len
    return room if max_new_tokens <= 0 else min(max_new_tokens, room)


class FrameSampler:
    """One frame's codes from the slow logits and hidden state (the fast transformer's part)."""

    def __init__(self, fast: FastTransformer, sampling: SamplingTensors | S1Sampling, generator: torch.Generator,
                 device: torch.device | str) -> None:
        cfg = fast.cfg
        self.fast, self.sampling, self.generator = fast, sampling, generator
        self.cache = fast.new_cache(device)
        self.rope, self.masks = fast.rope(device), fast.masks(device)
        self.begin, self.end, self.codebook_size = cfg.semantic_begin_id, cfg.semantic_end_id, cfg.codebook_size

    def __call__(self, logits: Tensor, hidden: Tensor, history: Tensor | None) -> Tensor:
        """The frame after `logits`/`hidden`; `history`: the decode frames before it (None at
        the prefill, whose frame no penalty or fallback looks at)."""
        token = self.sampling.slow_token(logits, self.generator, history, self.begin, self.end)
        fast = self.fast
        fast(fast.fast_project_in(hidden.reshape(1, -1)), 0, self.cache, self.rope, self.masks)
        code = torch.clamp(token - self.begin, min=0, max=self.codebook_size - 1)
        codes = [token, code]
        for i in range(1, fast.cfg.num_codebooks):
            logits = fast(fast.fast_embeddings(code), i, self.cache, self.rope, self.masks)
            code = self.sampling.code(logits, i, self.generator, history)
            codes.append(code)
        return torch.cat(codes).long()


def generate(slow: SlowTransformer, sampler: FrameSampler, prompt: Tensor, frames: int, cache: KVCache,
             im_end_id: int, sync_every: int = SYNC_EVERY, on_frame: Callable[[int], None] | None = None) -> Generated:
    """Up to `frames` frames after `prompt` (``[1 + num_codebooks, T]``) with an empty `cache`;
    `on_frame(n)` after each frame (host side only: progress, cancellation)."""
    t = prompt.shape[1]
    out = torch.empty((prompt.shape[0], frames), dtype=torch.long, device=prompt.device)
    logits, hidden = slow(prompt, 0, cache)
    out[:, 0] = sampler(logits[0, -1], hidden, None)
    if on_frame is not None:
        on_frame(1)
    done = 1
    while done < frames:
        block_end = min(frames, done + sync_every)
        for i in range(done, block_end):
            logits, hidden = slow(out[:, i - 1:i], t + i - 1, cache)
            out[:, i] = sampler(logits[0, -1], hidden, out[:, 1:i])
            if on_frame is not None:
                on_frame(i + 1)
        stops = (out[0, done:block_end] == im_end_id).nonzero()
        if stops.numel():  # the one host sync of the block
            end = done + int(stops[0, 0]) + 1
            return Generated(out[:, :end], True, block_end)
        done = block_end
    return Generated(out[:, :frames], False, frames)
