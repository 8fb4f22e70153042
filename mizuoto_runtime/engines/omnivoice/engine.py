"""OmniVoice over the official `omnivoice` package's model code, run in phases by the memory
runtime (issue 11). Needs transformers >= 5.3 (its codec, Higgs Audio v2's tokenizer, is part of
transformers); Qwen3-TTS runs on that same transformers (`qwen3tts.compat`).

Components and phases (M1), each a handle registered with the manager:

* ``voice prompt`` — ``audio_encoder`` (the codec's HuBERT semantic model, semantic and DAC
  acoustic encoders, and their fusion) and ``quantizer`` (the residual codebooks), `oneshot`:
  the reference audio becomes codec tokens, with upstream's own prompt preparation (resampling,
  loudness, silence trimming, the transcript's punctuation). Only for a cloned voice: voice
  design (``instruct``) and the auto voice encode nothing. Cached by the base class (M4).
* ``llm`` — the OmniVoice model (Qwen3 LLM, audio embeddings and heads), `oneshot`: masked
  diffusion runs the LLM over the whole sequence once per step (32 by default), the
  conditional and unconditional CFG rows in one batch. On CUDA the next layers copy on a side
  stream while one computes (M19; M20: a one-shot model's compute hides its copies).
* ``codec decoder`` — ``quantizer`` and ``audio_decoder`` (the codec's projection and DAC
  decoder), `oneshot`; then upstream's post-processing (silence trimming, loudness, fades).
  Fallback after OOM (M42, M43): `tiled_1d` over the token frames, valid because the DAC
  decoder is a stack of convolutions and Snake activations — local in time, no time-global
  statistics, no state carried along — whose receptive field (about 8 frames each side) is
  inside the 32-frame overlap.

Exactness (M40, M57). Position and token sampling draw from torch's global RNG (Gumbel noise):
the llm phase runs inside a `fork_rng` seeded with the request's seed.

Loading (M27). The published layout (``k2-fsa/OmniVoice``): ``config.json``,
``model.safetensors``, the text tokenizer (``tokenizer.json``, ``tokenizer_config.json``), and
``audio_tokenizer/`` (``config.json``, ``model.safetensors``, ``preprocessor_config.json``).
Both models are built on meta — the LLM in the engine's dtype, the codec float32 as upstream
loads it — and the memory-mapped safetensors copied in; never ``from_pretrained`` for weights.
The codec is kept outside the OmniVoice module (upstream assigns it as a submodule, which
would make it part of the llm component).
"""
from __future__ import annotations

import functools
import importlib.util
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...audio import Audio
from ...errors import CheckpointError, MizuotoError
from ...memory.phases import RequestContext
from ...memory.tiling import tiled_1d
from ..base import (
    TYPICAL_REFERENCE_SECONDS,
    CheckpointInfo,
    Codes,
    Engine,
    PhaseEstimate,
    Sampling,
    SmallWeights,
    Voice,
    element_size,
    typical_tokens,
)
from ..higgs_codec import decoder_memory, register_codec
from .checkpoint import check_layout, load_model

log = logging.getLogger(__name__)

DEFAULT_STEPS = 32
# The constants below were fitted to CPU peaks measured on the tiny checkpoint (bench/engines.py
# --peaks: 1 and 3 s references) to land 1.0-1.3x above them (M45: never under, not much over); on
# CUDA the M47 calibration corrects them further.
# Live activations of one Qwen3 layer per CFG row and position, in units of the hidden size
# (residual, norm, q/k/v/o), besides the gated MLP's two intermediate-wide tensors alive at once.
LLM_LAYER_COPIES = 4
# The voice prompt's peak is a Snake activation of DAC's full-rate encoder stage (encoder_hidden_size
# channels x samples): its input, alpha x input, the sine, its square and the product alive at once
# (measured at the tiny and the published width; issue 35: the published one read 0.91x when four
# were counted and the fifth hid in the per-sample constant at the tiny width).
ENCODER_STAGE_COPIES = 5
# Per 24 kHz reference sample besides: the waveform, its 16 kHz resampling, upstream's numpy prompt
# preparation.
ENCODER_BYTES_PER_SAMPLE = 48


@functools.cache
def package_languages() -> tuple[str, ...]:
    """The language names the package resolves (`omnivoice.utils.lang_map.LANG_NAMES`, lower
    case; what the loaded model's `supported_language_names()` returns), read from that file
    without importing the package: its `__init__` imports the model code and transformers,
    while the map is a data module that imports nothing. Empty where the package is not
    installed."""
    spec = importlib.util.find_spec("omnivoice")
    if spec is None or not spec.submodule_search_locations:
        return ()
    path = Path(list(spec.submodule_search_locations)[0]) / "utils" / "lang_map.py"
    lang_map = importlib.util.spec_from_file_location("mizuoto_omnivoice_lang_map", path) if path.is_file() else None
    if lang_map is None or lang_map.loader is None:
        return ()
    module = importlib.util.module_from_spec(lang_map)
    lang_map.loader.exec_module(module)
    return tuple(sorted(module.LANG_NAMES))


def _upstream_error(exc: Exception) -> MizuotoError:
    """The package validates instructs and languages with ValueError."""
    return MizuotoError(f"omnivoice: {exc}")


class OmniVoiceEngine(Engine):
    """OmniVoice in three phases: voice prompt, llm, codec decoder (M1)."""

    id = "omnivoice"
    title = "OmniVoice"
    REQUIREMENTS = "omnivoice"
    UPSTREAM = "omnivoice"
    WEIGHTS = {
        "voice_prompt": SmallWeights(("audio_encoder",)),
        "generate": SmallWeights(("llm",)),
        "decode": SmallWeights(("audio_decoder",)),
    }
    PHASED = True
    # Its voice prompt is upstream's VoiceClonePrompt object: kept in memory only, never
    # pickled to disk.
    PROMPT_ON_DISK = False
    PUBLISHED = "published"
    sample_rate = 24000
    steps = DEFAULT_STEPS  # masked-diffusion steps (upstream's num_step); tests and benches set fewer

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        """A k2-fsa/OmniVoice folder (both configs' model types); None otherwise. No built-in
        speakers; the languages the package resolves by name, "auto" (it detects) first."""
        try:
            check_layout(folder)
        except CheckpointError:
            return None
        return CheckpointInfo("OmniVoice", [], ["auto", *package_languages()])

    def __init__(self, manager: Any, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> None:
        super().__init__(manager, model_dir, dtype, device)
        if self.model_dir is None:
            raise CheckpointError("omnivoice needs a checkpoint folder (the k2-fsa/OmniVoice layout)")
        self.model, self.codec = load_model(self.model_dir, dtype)
        self.sample_rate = int(self.model.sampling_rate)
        parts = register_codec(self, self.codec)
        self.audio_encoder, self.quantizer, self.audio_decoder = parts.encoder, parts.quantizer, parts.decoder
        self.llm = self.register(self.model, "llm")

    def handles(self) -> list[Any]:
        return [self.audio_encoder, self.quantizer, self.llm, self.audio_decoder]

    @property
    def languages(self) -> list[str]:
        return sorted(self.model.supported_language_names())

    def generation_config(self) -> Any:
        from omnivoice import OmniVoiceGenerationConfig

        return OmniVoiceGenerationConfig(num_step=self.steps)

    # ---- voice prompt ----------------------------------------------------------------------
    def encode_voice(self, ctx: RequestContext, reference: Audio | None, transcript: str | None,
                     speaker: str | None, instruct: str | None = None) -> dict[str, Any]:
        if speaker:
            raise MizuotoError("omnivoice has no built-in speakers: clone a reference, describe the voice with "
                               "instruct, or give neither for its own voice")
        if instruct:
            from omnivoice.models.omnivoice import _resolve_instruct

            try:
                _resolve_instruct(instruct)
            except ValueError as exc:
                raise _upstream_error(exc) from exc
        if reference is None:
            return {"prompt": None, "instruct": instruct or None}
        if not (transcript or "").strip():
            raise MizuotoError("omnivoice: give the reference audio's transcript (no speech recognition here)")
        wav = reference.mono().unsqueeze(0)
        samples = int(wav.shape[-1] * self.sample_rate / reference.sample_rate)

        @torch.inference_mode()
        def encode() -> Any:
            try:
                prompt = self.model.create_voice_clone_prompt(ref_audio=(wav, reference.sample_rate),
                                                              ref_text=transcript, preprocess_prompt=True)
            except ValueError as exc:
                raise _upstream_error(exc) from exc
            prompt.ref_audio_tokens = prompt.ref_audio_tokens.cpu()
            return prompt

        prompt = ctx.run("voice prompt", [self.audio_encoder, self.quantizer], encode,
                         self.voice_prompt_memory(samples))
        return {"prompt": prompt, "instruct": instruct or None}

    def voice_prompt_memory(self, samples: int) -> int:
        """M45: the codec encoder's working memory, from the reference length (24 kHz samples):
        the DAC encoder's full-rate stage (float32, `ENCODER_STAGE_COPIES` of it), HuBERT's
        output and the per-sample front-end temporaries."""
        acoustic = self.codec.config.acoustic_model_config
        frames = samples // self.codec.config.hop_length + 1
        stage = 4 * samples * acoustic.encoder_hidden_size * ENCODER_STAGE_COPIES
        semantic = 4 * frames * 2 * self.codec.config.semantic_model_config.hidden_size * 8
        return stage + semantic + ENCODER_BYTES_PER_SAMPLE * samples

    # ---- llm -------------------------------------------------------------------------------
    def _task(self, text: str, voice: Voice, sampling: Sampling) -> Any:
        data = voice.data
        try:
            return self.model._preprocess_all(text=text, language=sampling.language, voice_clone_prompt=data["prompt"],
                                              instruct=data["instruct"], preprocess_prompt=True)
        except ValueError as exc:
            raise _upstream_error(exc) from exc

    def sequence_length(self, task: Any) -> int:
        """Upper bound of the LLM's positions for this request: style and text tokens (counted
        as upstream builds them), reference tokens and the target length."""
        text = task.texts[0] if not task.ref_texts[0] else f"{task.ref_texts[0]} {task.texts[0]}"
        words = len(self.model.text_tokenizer(text, add_special_tokens=False).input_ids)
        style = 16 + (len(self.model.text_tokenizer(task.instructs[0]).input_ids) if task.instructs[0] else 0)
        ref = task.ref_audio_tokens[0].shape[-1] if task.ref_audio_tokens[0] is not None else 0
        return style + words + ref + task.target_lens[0]

    def llm_memory(self, positions: int, rows: int = 1) -> int:
        """M45: the llm phase's working memory, from the request: 2 CFG rows per request row
        through one Qwen3 layer at a time, the (2 rows, positions, positions) boolean mask and one
        head's attention scores at a time, the logits over every codebook, and the keys and
        values of every layer: upstream calls its LLM with transformers' default ``use_cache``,
        so each call builds a cache of all of them, alive until its logits are made (issue 35:
        at the published depth, 28 layers, this read 0.37x without them)."""
        cfg = self.model.config
        llm = cfg.llm_config
        elem = element_size(self.dtype)
        cfg_rows = 2 * rows
        head_dim = getattr(llm, "head_dim", None) or llm.hidden_size // llm.num_attention_heads
        cache = cfg_rows * positions * llm.num_hidden_layers * 2 * llm.num_key_value_heads * head_dim * elem
        cache *= bool(getattr(llm, "use_cache", True))
        layer = cfg_rows * positions * elem * (LLM_LAYER_COPIES * llm.hidden_size + 2 * llm.intermediate_size)
        scores = cfg_rows * positions * positions * (1 + elem)
        logits = cfg_rows * positions * cfg.num_audio_codebook * cfg.audio_vocab_size * elem
        embeds = cfg_rows * positions * (cfg.num_audio_codebook + 2) * llm.hidden_size * elem
        return layer + scores + logits + embeds + cache

    def generate(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling) -> Codes:
        task = self._task(text, voice, sampling)
        config = self.generation_config()
        memory = self.llm_memory(self.sequence_length(task))
        steps = config.num_step
        long_text = bool(task.get_indices(config, self.codec.config.frame_rate)[1])

        @torch.inference_mode()
        def diffuse() -> list[torch.Tensor]:
            with self.progress_per_call(ctx, self.model.llm, steps), self.seeded(sampling.seed):
                if long_text:  # upstream's own chunking past audio_chunk_threshold (30 s)
                    return [t.cpu() for t in self.model._generate_chunked(task, config)[0]]
                return [self.model._generate_iterative(task, config)[0].cpu()]

        chunks = ctx.run("llm", [self.llm], diffuse, memory)
        ctx.progress(steps, steps)
        prompt = voice.data["prompt"]
        return Codes(chunks[0], self.id, {"chunks": chunks, "ref_rms": prompt.ref_rms if prompt else None})

    def typical_phases(self, seconds: float) -> list[PhaseEstimate]:
        """A clone of a 10 s reference with its transcript: the LLM sees the style tokens, both
        texts, the reference's tokens and the target's (`sequence_length`'s terms)."""
        rate = self.codec.config.frame_rate
        samples = int(TYPICAL_REFERENCE_SECONDS * self.sample_rate)
        ref, frames = int(TYPICAL_REFERENCE_SECONDS * rate), int(seconds * rate)
        positions = 16 + typical_tokens(TYPICAL_REFERENCE_SECONDS + seconds) + ref + frames
        return [PhaseEstimate("voice prompt", (self.audio_encoder, self.quantizer), self.voice_prompt_memory(samples)),
                PhaseEstimate("llm", (self.llm,), self.llm_memory(positions)),
                PhaseEstimate("codec decoder", (self.quantizer, self.audio_decoder), self.codec_decoder_memory(frames))]

    # ---- codec decoder ---------------------------------------------------------------------
    def codec_decoder_memory(self, frames: int) -> int:
        """M45: the DAC decoder's working memory for `frames` token frames (float32)."""
        return decoder_memory(self.codec, frames)

    def decode(self, ctx: RequestContext, codes: Codes, allow_fallback: bool | None = None) -> Audio:
        from omnivoice.utils.audio import cross_fade_chunks

        chunks: list[torch.Tensor] = codes.extra.get("chunks") or [codes.tokens]
        if sum(c.shape[-1] for c in chunks) == 0:
            return Audio(torch.zeros(1, 0), self.sample_rate)

        def vocode(tokens: torch.Tensor) -> torch.Tensor:
            return self.codec.decode(tokens.to(self.device)).audio_values  # (1, 1, samples)

        def run(decoder: Any) -> list[np.ndarray]:
            with torch.inference_mode():
                return [decoder(c.unsqueeze(0))[0].float().cpu().numpy() for c in chunks]

        pieces = ctx.run("codec decoder", [self.quantizer, self.audio_decoder], lambda: run(vocode),
                         self.codec_decoder_memory(max(c.shape[-1] for c in chunks)),
                         fallback=("tiled_1d", lambda: run(lambda t: tiled_1d(vocode, t))),
                         allow_fallback=allow_fallback)
        wav = pieces[0] if len(pieces) == 1 else cross_fade_chunks(pieces, self.sample_rate)
        wav = self.model._post_process_audio(wav, ref_rms=codes.extra.get("ref_rms"),
                                             gen_config=self.generation_config())
        return Audio(torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32)), self.sample_rate)
