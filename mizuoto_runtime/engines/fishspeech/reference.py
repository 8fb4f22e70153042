"""Fish Speech's stages for ``mizuoto check-reference --engine fishspeech DIR``.

DIR is a reference folder made by upstream's code (``../shared/fixtures/fishspeech/<variant>``):
its ``ckpt/`` is loaded with this engine's own loaders, every recorded input is fed to our
code, and every recorded output is compared. Sizes, seeds and settings are read from
``reference.json``, nothing from one fixture: the run precision (``dtype``), the codec's
quantizer-transformer window (``codec_config``, since the official codec file has no config),
the prompt's texts and each generation run's sampling settings.

Stages: the prompt built from the texts (identical ids and codes); the slow transformer over
the whole prompt without a cache, its cached prefill and one cached decode step; the fast
transformer from a recorded hidden state and codes; each recorded generation under its seed
(identical frames and codes); the codec's encoder latent, codes (identical), quantizer decode
and waveform; end to end, our own generated codes through our decoder.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ...nn.dtypes import parse_dtype
from ..reference import Check, Reference, Stage
from . import prompt as chat
from .checkpoint import DEFAULT_CODEC_WINDOW, DualAR, load_codec, load_dual_ar
from .loop import FrameSampler, frame_count
from .loop import generate as run_loop
from .sampling import SamplingTensors


def _dtype(ref: Reference) -> torch.dtype:
    return parse_dtype(str(ref.meta.get("dtype", "float32")), "reference dtype")


# ---- the checkpoint, loaded once per folder by the engine's own loader --------------------------
def _model(ref: Reference) -> DualAR:
    return ref.shared("dual_ar", lambda: load_dual_ar(ref.ckpt, _dtype(ref)))


def _window(ref: Reference) -> int:
    quantizer = ref.meta.get("codec_config", {}).get("quantizer", {})
    module = quantizer.get("post_module") or {}
    return int(module.get("window_size", DEFAULT_CODEC_WINDOW))


def _codec(ref: Reference) -> Any:
    return ref.shared("codec", lambda: load_codec(ref.ckpt, _dtype(ref), _window(ref)))


# ---- the stages ---------------------------------------------------------------------------------
def _prompt_stage(ref: Reference) -> Iterable[Check]:
    m, p = _model(ref), ref.meta["prompt"]
    parts = chat.system_message(p.get("prompt_text"), ref.tensor("codec.out.indices"))
    for batch in chat.batches(p["text"]):
        parts += chat.user_message(batch)
    rows = chat.encode(parts + chat.assistant_turn(), m.tokenizer, m.config.num_codebooks)
    yield Check("prompt.rows", rows, "exact", want=ref.tensor("llm.in.prompt"))
    yield Check("prompt.im_end_id", m.im_end_id, "exact", want=int(p["im_end_id"]))
    yield Check("prompt.semantic_range", [m.config.semantic_begin_id, m.config.semantic_end_id], "exact",
                want=[int(p["semantic_begin_id"]), int(p["semantic_end_id"])])


@torch.inference_mode()
def _slow_stage(ref: Reference) -> Iterable[Check]:
    m, rows = _model(ref), ref.tensor("llm.in.prompt")
    logits, hidden = m.slow(rows, 0, None, all_positions=True)
    yield Check("llm.out.teacher_forced_logits", logits[0])
    yield Check("llm.out.teacher_forced_hidden", hidden[0])
    cache = m.slow.new_cache("cpu")
    logits, hidden = m.slow(rows, 0, cache)
    yield Check("llm.out.prefill_last_logits", logits[0, -1])
    yield Check("llm.out.prefill_last_hidden", hidden[0, -1])
    logits, hidden = m.slow(ref.tensor("llm.in.step_token")[:, None], rows.shape[1], cache)
    yield Check("llm.out.step_logits", logits[0, -1])
    yield Check("llm.out.step_hidden", hidden[0, -1])


@torch.inference_mode()
def _fast_stage(ref: Reference) -> Iterable[Check]:
    fast = _model(ref).fast
    cache, rope, masks = fast.new_cache("cpu"), fast.rope("cpu"), fast.masks("cpu")
    hidden = ref.tensor("fast.in.hidden").to(fast.fast_embeddings.weight.dtype)
    yield Check("fast.out.logits_pos0", fast(fast.fast_project_in(hidden[None]), 0, cache, rope, masks))
    codes = ref.tensor("fast.in.codes")
    rows = [fast(fast.fast_embeddings(codes[i - 1:i]), i, cache, rope, masks)
            for i in range(1, fast.cfg.num_codebooks)]
    yield Check("fast.out.codebook_logits", torch.stack(rows))


@torch.inference_mode()
def generate(ref: Reference, settings: dict[str, Any]) -> torch.Tensor:
    """The frames our loop makes from the recorded prompt with one run's settings and seed."""
    m, rows = _model(ref), ref.tensor("llm.in.prompt")
    cfg = m.config
    sampling = SamplingTensors.build(
        temperature=float(settings["temperature"]), top_p=float(settings["top_p"]), top_k=int(settings["top_k"]),
        vocab_size=cfg.vocab_size, semantic_begin=cfg.semantic_begin_id, semantic_end=cfg.semantic_end_id,
        im_end_id=m.im_end_id, dtype=_dtype(ref), device="cpu")
    sampler = FrameSampler(m.fast, sampling, torch.Generator().manual_seed(int(settings["seed"])), "cpu")
    frames = frame_count(rows.shape[1], int(settings["max_new_tokens"]), cfg.max_seq_len)
    return run_loop(m.slow, sampler, rows, frames, m.slow.new_cache("cpu"), m.im_end_id).frames


def _generate_stage(ref: Reference, name: str, settings: dict[str, Any]) -> Iterable[Check]:
    frames = ref.shared(f"frames.{name}", lambda: generate(ref, settings))
    yield Check(f"gen.out.{name}.raw_frames", frames, "exact")
    yield Check(f"gen.out.{name}.codes", frames[1:, :-1], "exact")


@torch.inference_mode()
def _encode_stage(ref: Reference) -> Iterable[Check]:
    encoder, _ = _codec(ref)
    audio = ref.tensor("codec.in.audio")[None].to(_dtype(ref))
    yield Check("codec.out.encoder_latent", encoder.latent(audio)[0])
    yield Check("codec.out.indices", encoder(audio)[0], "exact")


@torch.inference_mode()
def _decode_stage(ref: Reference) -> Iterable[Check]:
    _, decoder = _codec(ref)
    codes = ref.tensor("codec.out.indices")[None]
    yield Check("codec.out.quantizer_decode_z", decoder.latent(codes)[0])
    yield Check("codec.out.wav", decoder(codes)[0, 0])


@torch.inference_mode()
def _e2e_stage(ref: Reference) -> Iterable[Check]:
    """Our codes of the first recorded run (``default`` when there is one) through our decoder."""
    runs = ref.meta["generate"]["runs"]
    name = "default" if "default" in runs else next(iter(runs))
    frames = ref.shared(f"frames.{name}", lambda: generate(ref, runs[name]))
    _, decoder = _codec(ref)
    yield Check("e2e.out.wav", decoder(frames[1:, :-1][None])[0, 0], "chain")


def stages(ref: Reference) -> Iterator[Stage]:
    """The stages `ref` recorded, in order."""
    yield Stage("prompt", lambda: _prompt_stage(ref))
    yield Stage("slow_ar", lambda: _slow_stage(ref))
    yield Stage("fast_ar", lambda: _fast_stage(ref))
    for name, settings in ref.meta["generate"]["runs"].items():
        yield Stage(f"generate.{name}", lambda name=name, settings=settings: _generate_stage(ref, name, settings))
    yield Stage("codec.encode", lambda: _encode_stage(ref))
    yield Stage("codec.decode", lambda: _decode_stage(ref))
    yield Stage("e2e", lambda: _e2e_stage(ref))
