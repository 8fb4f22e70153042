"""The lean talker loop of Qwen3-TTS: our own per-frame loop around the upstream talker and
code-predictor modules, which stay unchanged (issue 13; M24, M40, M53, M57).

Why. The package's ``Qwen3TTSForConditionalGeneration.generate`` builds the talker prompt, then
calls ``talker.generate`` — transformers' generic ``generate`` — whose every step runs the talker,
and inside it a second full ``generate`` of the code predictor for the frame's 15 remaining
codes. On small models most of the time goes to that machinery (input preparation, mask
building, logits-processor lists, stopping checks that read the device), not to the layers.

What. The package still builds the prompt; only its call to ``talker.generate`` is answered by
`LeanLoop` (a per-thread switch on the talker, `loop_in_this_thread`), which runs the same
modules with the same shapes: the prefill through the talker's own ``forward``, then per frame
the code predictor's decoder layers (2 positions, then 14 single ones), its heads and
embeddings, and the talker's decoder layers, norm and codec head, called as modules (so the
runtime's streaming hooks see every unit, M17). Same kernels on the same shapes give the same
numbers: codes and audio are `torch.equal` to the upstream loop (tested in every voice mode,
sampling on).

Sampling (`Sampler`): the logits processors ``generate`` builds for these settings, in its
order — repetition penalty, minimum length, suppressed tokens, then temperature, top-k and
top-p (transformers' own warper classes) — in fixed-shape forms, and ``torch.multinomial``'s
own algorithm for one sample (``argmax(p / q)``, ``q ~ Exp(1)`` drawn by ``exponential_``):
the same random draws, in the same order, from the same generator, with no host
synchronisation (``multinomial`` checks its input with two ``.item()`` calls). The end of
speech is checked one frame late on accelerators (`_StopCheck`), so the host never waits for
the frame it just queued; frames after the stop are dropped.

KV caches (M53). ``compute.kv_cache = dynamic``: transformers' ``DynamicCache``, as upstream.
``static``: `BufferCache` — the talker's prefilled cache moves into doubling buffers, the code
predictor's 16 positions reuse one buffer every frame.

CUDA Graphs (M24). On a CUDA device, when the request context's `graph_capture` allows it (the
talker resident, or graphable with pinned streamed units; not under cudaMallocAsync; not while
a host such as ComfyUI's dynamic VRAM refuses capture), the code predictor's 15 steps of a
frame, with their sampling, are captured once per request and replayed every frame: fixed
shapes, same kernels, same random numbers (the warm-up's draws are undone before capture, and
a graph's RNG ops draw from the generator's offset at replay as eager ops would). The talker's
own step stays eager: its attention length grows every frame, and a padded, masked attention
would sum in another order. Capture refused (another request holds the device,
`compute.gpu_jobs` > 1) or failed: eager, with the same codes — a failed capture puts the
device generator back as it was — and `meta.applied.cuda_graphs` says why; a failure is
logged once.

Settings the lean loop does not reproduce (a batch of several prompts, an attention other
than ``sdpa``, a generation config that asks for other logits processors) make it hand the call
to the upstream loop; `meta.applied.talker_loop` names the reason.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from ...nn.kv_cache import BufferCache, Kind

log = logging.getLogger(__name__)

ATTENTION = "sdpa"  # the attention whose masks the loop reproduces (None for one unpadded row)
# Generation-config fields whose non-default values make transformers add logits processors,
# warpers or stopping rules the lean loop does not reproduce.
UNSUPPORTED_GENERATION = (
    "num_beams", "num_beam_groups", "num_return_sequences", "penalty_alpha", "guidance_scale",
    "sequence_bias", "encoder_repetition_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "begin_suppress_tokens", "min_p", "typical_p",
    "epsilon_cutoff", "eta_cutoff", "watermarking_config", "renormalize_logits", "max_time",
    "stop_strings", "min_length", "prefix_allowed_tokens_fn", "constraints", "force_words_ids",
)


#: `RequestContext.graph_capture`: (handle, fn, *, what, keep_rng) -> (a graph to replay, or
#: None, and why not).
GraphCapture = Callable[..., tuple[Any, str]]


class Unsupported(Exception):
    """The lean loop cannot reproduce this call exactly; the upstream loop runs instead."""


# ---- sampling --------------------------------------------------------------------------------
class Sampler:
    """What ``generate`` does with one head's logits for these settings, without host syncs.

    Processors in transformers' order (`GenerationMixin._get_logits_processor`): repetition
    penalty over the tokens drawn so far (as a mask over the vocabulary instead of a
    gather/scatter over a growing history: the same elementwise values, fixed shapes), the end
    token masked while fewer than `min_tokens` were drawn (its ``MinLength`` and
    ``MinNewTokens`` processors), suppressed tokens, then the sampling warpers. `step` is the
    number of tokens drawn before this one.
    """

    def __init__(self, vocab: int, device: torch.device, *, do_sample: bool, temperature: float | None,
                 top_k: int | None, top_p: float | None, repetition_penalty: float | None = None,
                 eos: int | None = None, min_tokens: int = 0, suppress: Sequence[int] = ()) -> None:
        from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        self.do_sample = do_sample
        self.penalty = repetition_penalty if repetition_penalty not in (None, 1.0) else None
        self.seen = torch.zeros(1, vocab, dtype=torch.bool, device=device) if self.penalty else None
        self.min_tokens = min_tokens if eos is not None else 0
        self.eos_mask = self._mask(vocab, device, [eos] if eos is not None else [])
        self.suppress_mask = self._mask(vocab, device, suppress) if suppress else None
        self.warpers: list[Any] = []
        if do_sample:  # `_get_logits_processor` adds warpers only when sampling
            if temperature is not None and temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(temperature))
            if top_k is not None and top_k != 0:
                self.warpers.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
            if top_p is not None and top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))

    @staticmethod
    def _mask(vocab: int, device: torch.device, ids: Sequence[int]) -> torch.Tensor:
        mask = torch.zeros(1, vocab, dtype=torch.bool)
        mask[0, list(ids)] = True
        return mask.to(device)

    def reset(self) -> None:
        if self.seen is not None:
            self.seen.zero_()

    def __call__(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        """One token, ``(1, 1)`` int64, from the last position's logits ``(1, vocab)``."""
        scores = logits.float()  # `generate` reads the logits in float32
        if self.penalty is not None:
            assert self.seen is not None
            penalized = torch.where(scores < 0, scores * self.penalty, scores / self.penalty)
            scores = torch.where(self.seen, penalized, scores)
        if step < self.min_tokens:
            scores = torch.where(self.eos_mask, -float("inf"), scores)
        if self.suppress_mask is not None:
            scores = torch.where(self.suppress_mask, -float("inf"), scores)
        if self.do_sample:
            for warper in self.warpers:
                scores = warper(None, scores)
            token = draw(torch.nn.functional.softmax(scores, dim=-1))
        else:
            token = torch.argmax(scores, dim=-1, keepdim=True)
        if self.seen is not None:
            self.seen.scatter_(1, token, True)
        return token


def draw(probs: torch.Tensor) -> torch.Tensor:
    """``torch.multinomial(probs, 1)`` without its input checks' host syncs: the same algorithm
    (``argmax(p / q)`` with ``q ~ Exp(1)``), so the same random draws and the same token."""
    q = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / q, dim=-1, keepdim=True)


def unsupported(talker: nn.Module) -> str | None:
    """Why the lean loop cannot reproduce this talker's ``generate`` exactly, or None: checked
    from the modules alone, before a request (its estimate depends on the loop that runs)."""
    cp = talker.code_predictor
    for name, cfg in (("talker", talker.config), ("code predictor", cp.config)):
        if cfg._attn_implementation != ATTENTION:
            return f"the {name}'s attention is {cfg._attn_implementation!r}, not {ATTENTION!r}"
    if getattr(cp.model.rotary_emb, "rope_type", "default") != "default":
        return "the code predictor's rotary embedding is not the default one"
    from transformers import GenerationConfig

    defaults = GenerationConfig()
    for name, module in (("talker", talker), ("code predictor", cp)):
        config = module.generation_config
        changed = [f for f in UNSUPPORTED_GENERATION if getattr(config, f, None) != getattr(defaults, f, None)]
        if changed:
            return f"the {name}'s generation config sets {', '.join(changed)}"
    if cp.generation_config.eos_token_id is not None:
        return "the code predictor's generation config has an end token"
    return None


# ---- the per-thread switch on the talker -----------------------------------------------------
class _Dispatch:
    """Installed as ``talker.generate``: the lean loop for a thread that asked for it, else the
    upstream ``generate`` (other threads, and the reference runs)."""

    def __init__(self, talker: nn.Module) -> None:
        self._talker = weakref.ref(talker)  # no cycle: the talker owns this object
        self.local = threading.local()

    def upstream(self, *args: Any, **kwargs: Any) -> Any:
        talker = self._talker()
        assert talker is not None
        return type(talker).generate(talker, *args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        loop: LeanLoop | None = getattr(self.local, "loop", None)
        if loop is None or args:
            return self.upstream(*args, **kwargs)
        return loop.generate(self, **kwargs)


def install(talker: nn.Module) -> _Dispatch:
    """Make ``talker.generate`` switchable per thread (once per talker)."""
    current = talker.__dict__.get("generate")
    if isinstance(current, _Dispatch):
        return current
    dispatch = _Dispatch(talker)
    talker.generate = dispatch  # an instance attribute: the class and its code are unchanged
    return dispatch


@contextlib.contextmanager
def forward_ticks(talker: nn.Module, tick: Callable[[], None]) -> Iterator[None]:
    """The upstream loop runs the talker's forward once per step: call `tick` there. The hook
    sits on the shared module, so it reports only the calling thread's steps."""
    thread = threading.get_ident()

    def pre(_module: nn.Module, _args: Any) -> None:
        if threading.get_ident() == thread:
            tick()

    hook = talker.register_forward_pre_hook(pre)
    try:
        yield
    finally:
        hook.remove()


@contextlib.contextmanager
def loop_in_this_thread(talker: nn.Module, loop: LeanLoop) -> Iterator[LeanLoop]:
    """Within the block, this thread's ``talker.generate`` calls run `loop`."""
    dispatch = install(talker)
    previous = getattr(dispatch.local, "loop", None)
    dispatch.local.loop = loop
    try:
        yield loop
    finally:
        dispatch.local.loop = previous


# ---- the loop --------------------------------------------------------------------------------
@dataclasses.dataclass
class TalkerOutput:
    """What the package reads from ``talker.generate``'s result: per step, the last hidden
    state and the frame's 16 codes (None for the prefill)."""

    hidden_states: list[tuple[tuple[torch.Tensor], torch.Tensor | None]]


@dataclasses.dataclass
class LoopReport:
    """What ran, for `meta.applied` (M50)."""

    loop: str = "lean"
    kv_cache: Kind = "dynamic"
    cuda_graphs: str = "off"
    frames: int = 0


class _StopCheck:
    """Whether the end token was drawn, read without making the host wait for the device.

    On CPU the flag is read at once. On an accelerator each frame's flag is copied to pinned
    memory behind that frame's work, and the loop reads the flag of the frame before the last
    one queued: the device always has a frame of work while the host waits, and at most one
    frame runs past the end (dropped by `_until_stop`).
    """

    def __init__(self, device: torch.device) -> None:
        self.lagged = device.type != "cpu"
        pin = self.lagged and torch.cuda.is_available()
        self.flags = [torch.zeros(1, dtype=torch.bool, pin_memory=pin) for _ in range(2)]
        self.events: list[Any] = [None, None]
        self.pushed = 0

    def push(self, stopped: torch.Tensor) -> None:
        slot = self.pushed % 2
        self.flags[slot].copy_(stopped.reshape(1), non_blocking=self.lagged)
        if self.lagged and stopped.device.type == "cuda":
            self.events[slot] = torch.cuda.Event()
            self.events[slot].record()
        self.pushed += 1

    def stopped(self) -> bool:
        """The last flag pushed (CPU), or the one before it (accelerators)."""
        back = 2 if self.lagged else 1
        if self.pushed < back:
            return False
        slot = (self.pushed - back) % 2
        if self.events[slot] is not None:
            self.events[slot].synchronize()
        return bool(self.flags[slot][0])


class LeanLoop:
    """Answers the package's ``talker.generate(inputs_embeds=..., ...)`` call for one request."""

    def __init__(self, talker_handle: Any, kv_cache: Kind = "dynamic", graphs_wanted: bool = True,
                 on_step: Callable[[], None] | None = None, capture: GraphCapture | None = None) -> None:
        self.handle = talker_handle
        self.capture = capture  # the request's: no capture while another request holds the device
        self.talker: nn.Module = talker_handle.module
        self.kv_cache: Kind = kv_cache
        self.graphs_wanted = graphs_wanted
        self.on_step = on_step or (lambda: None)
        self.report = LoopReport(kv_cache=kv_cache)

    # -- checks ---------------------------------------------------------------------------
    def _check(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
        if inputs_embeds.shape[0] != 1:
            raise Unsupported(f"a batch of {inputs_embeds.shape[0]} prompts")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise Unsupported("a padded prompt")
        reason = unsupported(self.talker)
        if reason is not None:
            raise Unsupported(reason)

    # -- the call -------------------------------------------------------------------------
    def generate(self, dispatch: _Dispatch, **kwargs: Any) -> Any:
        try:
            self._check(kwargs["inputs_embeds"], kwargs.get("attention_mask"))
            samplers = self._samplers(kwargs)
        except Unsupported as why:
            log.info("qwen3tts: the upstream talker loop runs (%s)", why)
            self.report.loop = f"upstream ({why})"
            self.report.kv_cache = "dynamic"
            self.report.cuda_graphs = "off: the upstream loop runs"
            with forward_ticks(self.talker, self.on_step):
                return dispatch.upstream(**kwargs)
        with torch.inference_mode():
            return self._run(samplers, **kwargs)

    def _samplers(self, kw: dict[str, Any]) -> tuple[Sampler, Sampler, int | None]:
        talker, cp = self.talker, self.talker.code_predictor
        tcfg, ccfg = talker.generation_config, cp.generation_config
        device = kw["inputs_embeds"].device
        eos = kw.get("eos_token_id")
        eos = tcfg.eos_token_id if eos is None else eos
        if isinstance(eos, (list, tuple)):
            if len(eos) != 1:
                raise Unsupported(f"{len(eos)} end tokens")
            eos = eos[0]
        talker_sampler = Sampler(
            talker.config.vocab_size, device, do_sample=kw.get("do_sample", tcfg.do_sample),
            temperature=kw.get("temperature", tcfg.temperature), top_k=kw.get("top_k", tcfg.top_k),
            top_p=kw.get("top_p", tcfg.top_p), repetition_penalty=kw.get("repetition_penalty", tcfg.repetition_penalty),
            eos=eos, min_tokens=int(kw.get("min_new_tokens") or 0), suppress=kw.get("suppress_tokens") or (),
        )
        cp_sampler = Sampler(
            cp.config.vocab_size, device, do_sample=kw.get("subtalker_dosample", ccfg.do_sample),
            temperature=kw.get("subtalker_temperature", ccfg.temperature), top_k=kw.get("subtalker_top_k", ccfg.top_k),
            top_p=kw.get("subtalker_top_p", ccfg.top_p), repetition_penalty=ccfg.repetition_penalty,
        )
        return talker_sampler, cp_sampler, eos

    def _run(self, samplers: tuple[Sampler, Sampler, int | None], *, inputs_embeds: torch.Tensor,
             attention_mask: torch.Tensor | None, trailing_text_hidden: torch.Tensor, tts_pad_embed: torch.Tensor,
             max_new_tokens: int, **_settings: Any) -> TalkerOutput:
        """``generate``'s sampling loop for one unpadded prompt (the settings are in `samplers`)."""
        from transformers.cache_utils import DynamicCache

        talker = self.talker
        talker_sampler, cp_sampler, eos = samplers
        device = inputs_embeds.device
        prompt = inputs_embeds.shape[1]

        # Prefill: the talker's own forward, as `generate` calls it.
        self.on_step()
        cache = DynamicCache()
        out = talker(inputs_embeds=inputs_embeds, attention_mask=attention_mask, past_key_values=cache,
                     use_cache=True, cache_position=torch.arange(prompt, device=device),
                     trailing_text_hidden=trailing_text_hidden, tts_pad_embed=tts_pad_embed)
        # Set by that forward from the mask (M-RoPE offsets); read before anyone else runs it.
        rope_deltas = talker.rope_deltas if attention_mask is not None else None
        steps: list[tuple[tuple[torch.Tensor], torch.Tensor | None]] = [((out.past_hidden,), None)]
        token = talker_sampler(out.logits[:, -1, :], 0)
        past_hidden = out.past_hidden
        del out
        talker_cache: Any = cache
        if self.kv_cache == "static":
            talker_cache = _adopt(cache)
        del cache

        predictor = _Predictor(talker, cp_sampler, self.kv_cache, device, past_hidden.dtype)
        step_fn: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] = predictor.frame
        captured = self._capture(predictor, past_hidden, token)
        if captured is not None:
            step_fn = captured
            self.report.cuda_graphs = "on: the code predictor's steps"

        position = torch.full((3, 1, 1), float(prompt), device=device)
        if rope_deltas is not None:
            position = position + rope_deltas.to(device).reshape(1, -1, 1)
        stop = _StopCheck(device)
        if eos is not None:
            stop.push(token == eos)
        frames: list[torch.Tensor] = []
        hiddens: list[torch.Tensor] = []
        for step in range(1, max_new_tokens):
            if eos is not None and stop.stopped():
                break
            self.on_step()
            codes, embeds = step_fn(past_hidden, token)
            frames.append(torch.cat((token, codes), dim=-1))
            generation_step = step - 1
            if generation_step < trailing_text_hidden.shape[1]:
                embeds = embeds + trailing_text_hidden[:, generation_step].unsqueeze(1)
            else:
                embeds = embeds + tts_pad_embed
            past_hidden, logits = self._talker_step(embeds, position, talker_cache)
            hiddens.append(past_hidden)
            position += 1
            token = talker_sampler(logits[:, -1, :], step)
            if eos is not None:
                stop.push(token == eos)
        steps += [((h,), f) for h, f in zip(hiddens, _until_stop(frames, eos))]
        self.report.frames = len(steps) - 1
        return TalkerOutput(steps)

    def _talker_step(self, embeds: torch.Tensor, position: torch.Tensor,
                     cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step of ``Qwen3TTSTalkerModel.forward`` (one row, no padding: no mask)
        and the codec head."""
        model = self.talker.model
        position_embeddings = model.rotary_emb(embeds, position)
        hidden = embeds
        for layer in model.layers:
            hidden = layer(hidden, attention_mask=None, past_key_values=cache, use_cache=True,
                           position_embeddings=position_embeddings)[0]
        hidden = model.norm(hidden)
        return hidden, self.talker.codec_head(hidden)

    def _capture(self, predictor: _Predictor, past_hidden: torch.Tensor, token: torch.Tensor) -> Any:
        """The code predictor's frame as a CUDA Graph, or None with the reason recorded."""
        if not self.graphs_wanted or self.capture is None:
            self.report.cuda_graphs = "off: not requested"
            return None
        step = _PredictorGraph(predictor, past_hidden, token)
        step.graph, reason = self.capture(self.handle, step.frame, what="qwen3tts code predictor", keep_rng=True)
        if step.graph is None:
            self.report.cuda_graphs = f"off: {reason}"
            return None
        return step


def _until_stop(frames: list[torch.Tensor], eos: int | None) -> list[torch.Tensor]:
    """The frames upstream would have made: none after the one whose token ended speech (on
    accelerators the loop may have run one frame on before it knew)."""
    if eos is None or not frames:
        return frames
    firsts = torch.cat([f[:, :1] for f in frames], dim=0).reshape(-1).cpu()
    stops = (firsts == eos).nonzero()
    return frames if stops.numel() == 0 else frames[: int(stops[0, 0])]


def _adopt(cache: Any) -> BufferCache:
    """A prefilled transformers cache moved into a `BufferCache` (M53), layer by layer."""
    if hasattr(cache, "layers"):  # transformers >= 4.56
        keys = [layer.keys for layer in cache.layers]
        values = [layer.values for layer in cache.layers]
        cache.layers.clear()
    else:
        keys, values = list(cache.key_cache), list(cache.value_cache)
        cache.key_cache.clear()
        cache.value_cache.clear()
    buffers = BufferCache()
    buffers.adopt(keys, values)
    return buffers


class _Predictor:
    """The code predictor's 15 steps of one frame, as ``code_predictor.generate`` runs them:
    a 2-position prefill (the talker's hidden state and the frame's first code), then one
    position per code, each through its own head and embedding."""

    def __init__(self, talker: nn.Module, sampler: Sampler, kv_cache: Kind, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.talker = talker
        self.cp = talker.code_predictor
        self.sampler = sampler
        self.groups = talker.config.num_code_groups
        self.buffers = BufferCache(min_capacity=self.groups) if kv_cache == "static" else None
        # The rotary embeddings of positions 0-1 and 2..15: the same every frame.
        rotary, like = self.cp.model.rotary_emb, torch.empty(0, dtype=dtype, device=device)
        positions = [torch.arange(2, device=device).unsqueeze(0)]
        positions += [torch.tensor([[i]], device=device) for i in range(2, self.groups)]
        self.rope = [rotary(like, p) for p in positions]

    def _cache(self) -> Any:
        if self.buffers is not None:
            self.buffers.reset()
            return self.buffers
        from transformers.cache_utils import DynamicCache

        return DynamicCache()

    def _forward(self, embeds: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: Any,
                 head: int) -> torch.Tensor:
        hidden = self.cp.small_to_mtp_projection(embeds)
        for layer in self.cp.model.layers:
            hidden = layer(hidden, attention_mask=None, past_key_values=cache, use_cache=True,
                           position_embeddings=rope)[0]
        hidden = self.cp.model.norm(hidden)
        return self.cp.lm_head[head](hidden)[:, -1, :]

    def frame(self, past_hidden: torch.Tensor, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The frame's 15 codes ``(1, 15)`` and the talker's next input: the sum of the 16
        codes' embeddings ``(1, 1, hidden)``."""
        embeddings = self.cp.model.codec_embedding
        first = self.talker.model.codec_embedding(token)
        cache = self._cache()
        self.sampler.reset()
        code = self.sampler(self._forward(torch.cat((past_hidden, first), dim=1), self.rope[0], cache, 0), 0)
        codes, embedded = [code], [first]
        for i in range(1, self.groups - 1):
            embedded.append(embeddings[i - 1](code))
            code = self.sampler(self._forward(embedded[-1], self.rope[i], cache, i), i)
            codes.append(code)
        embedded.append(embeddings[self.groups - 2](code))
        return torch.cat(codes, dim=-1), torch.cat(embedded, dim=1).sum(1, keepdim=True)


class _PredictorGraph:
    """`_Predictor.frame` captured as one CUDA Graph over static inputs (M24)."""

    def __init__(self, predictor: _Predictor, past_hidden: torch.Tensor, token: torch.Tensor) -> None:
        self.predictor = predictor
        self.hidden = past_hidden.clone()
        self.token = token.clone()
        self.graph: Any = None  # set once `frame` is captured

    def frame(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What the graph records: the frame over the static inputs."""
        return self.predictor.frame(self.hidden, self.token)

    def __call__(self, past_hidden: torch.Tensor, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.hidden.copy_(past_hidden)
        self.token.copy_(token)
        codes, embeds = self.graph.replay()
        return codes.clone(), embeds.clone()  # the graph's outputs are overwritten by the next replay
