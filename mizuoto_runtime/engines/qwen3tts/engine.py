"""Qwen3-TTS (12 Hz, 0.6B / 1.7B; Base, CustomVoice, VoiceDesign) over the official `qwen-tts`
package's model code, run in phases by the memory runtime.

Components and phases (M1), each a handle registered with the manager:

* ``voice prompt`` — ``codec_encoder`` (the speech tokenizer's Mimi encoder) and
  ``speaker_encoder`` (ECAPA-TDNN), both `oneshot`. Base checkpoints only; placed only when a
  voice is not cached (the base class caches voices by key, M4). An x-vector clone (no
  transcript) needs only the speaker encoder; an ICL clone (with a transcript) also the codec
  encoder's reference codes. The two run one after the other, each in its own ``voice prompt``
  phase, so the device needs room for one encoder's minimum working set, not both.
* ``talker`` — the talker LM with its code predictor: `sequence` (M15, M20: one streamed copy,
  no prefetch) and `graphable` (M24). The code predictor is marked `hot` (M15): it runs 15 times
  per frame, the talker's layers once, so when not everything fits the code predictor stays
  resident and the talker's layers stream. Measured on the tiny checkpoint, talker capped
  half-way: 5.9 MB streamed per frame instead of 52 MB (8.8× less); on the real models,
  streaming the code predictor's 5 layers 15 times a frame could not keep up at all.
* ``codec decoder`` — the speech tokenizer's decoder, `oneshot`. It already decodes in chunks
  of 300 frames with 25 of left context, so no tiled fallback (M43: it would change samples).

The talker loop. By default the talker phase runs our lean per-frame loop over the package's
talker and code-predictor modules (`qwen3tts.loop`: no generic ``generate`` machinery, no host
sync per token, the static KV cache of M53 and CUDA Graphs of M24 where they apply), which
gives the same codes as the package's own loop; ``engine.talker_loop = "upstream"`` runs the
package's loop instead (the reference the tests hold it equal to). What ran is named in
``meta.applied``: ``talker_loop``, ``kv_cache``, ``cuda_graphs``.

Exactness (M40, M57). The package samples from torch's global RNG and takes no generator, so
the talker phase seeds it itself inside a `fork_rng`: a retried phase and every placement draw
the same numbers, and the caller's RNG is left as it was. The runtime's hooks swap `param.data`;
the package's code runs unchanged.

Loading (M27). The official folder layout, from any path (ComfyUI's nodes resolve
``models/mizuoto/<name>``). Modules are built with parameters on `meta` in their run precision
(`build_on_meta`) and the memory-mapped safetensors are copied in tensor by tensor
(`load_safetensors`, strict: a missing, unexpected or mis-shaped tensor raises one
`CheckpointError` naming them). Never `from_pretrained` for weights: it random-initializes
missing tensors with only a warning. The talker and speaker encoder run in the engine's dtype;
the speech tokenizer stays float32 as shipped (its convolutions and codebook distances are what
the checkpoint was validated with, and the package's own ``dtype="auto"`` keeps it so).
CustomVoice and VoiceDesign never encode audio: their codec encoder is not read from the file.
"""
from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from ...audio import Audio
from ...errors import CheckpointError, MizuotoError
from ...memory.phases import RequestContext
from ...nn.kv_cache import peak_bytes
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
from ..lora import LoraAdapter
from . import loop as lean_loop
from .checkpoint import check_layout, load_model

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
#: config.json's `tts_model_type` as the model cards name the three checkpoints.
MODEL_LABELS = {"base": "Base", "custom_voice": "CustomVoice", "voice_design": "VoiceDesign"}
# M46: talker frames estimated per text token (capped by max_new_tokens).
FRAMES_PER_TEXT_TOKEN = 16
# The talker prompt (`Qwen3TTSForConditionalGeneration.generate`): the chat role (3 positions),
# the think/language tags (at most 4), the speaker and the codec pad, before the text or the
# reference's codes (which start at the codec bos).
PROMPT_PREFIX = 9
# The chat templates' tokens around the text (`_build_assistant_text`: 3 before, 5 after) and
# around a reference's transcript (`_build_ref_text`: 3 before, 2 after); the package cuts them.
TEXT_TEMPLATE = 8
REF_TEMPLATE = 5
# Talker-phase activations, in hidden-size rows per position unless said; measured on the CPU
# at both published widths (issue 35: 1.7B and 0.6B talkers, 3 s and 10 s references, bf16):
# the prompt as `generate` keeps it for the whole phase (its pieces' concatenation, the padded
# batch's flips and `pad_sequence` copy, the reference's codec part);
PROMPT_COPIES = 6
# the prompt being built: each reference frame's 16 code embeddings, stacked (`generate_icl_prompt`),
# beside the prompt and text embeddings (rows per position of each);
BUILD_COPIES = 2
# a prefill layer: the hidden states, normed input, attention output and the rotary and mask
# tensors beside them (measured 2.3-2.7 rows; hidden size), and the MLP's activation of the
# gate, up and their product (intermediate size). The whole KV cache of the prompt is there too.
PREFILL_HIDDEN_COPIES = 4
PREFILL_MLP_COPIES = 3
# The codec decoder's chunking (`Qwen3TTSTokenizerV2Model.decode`): chunks and left context.
DECODE_CHUNK = 300
DECODE_CONTEXT = 25
# The constants below were fitted to CPU peaks measured on the tiny checkpoint (1-30 s
# references, 3-120 frames), rounded up; on CUDA the M47 calibration corrects them further.
# Live activations of one decoder conv stage (input kept for the residual, SnakeBeta's
# temporaries, the conv output), in units of the stage's output.
DECODER_STAGE_COPIES = 5
# Mimi's full-rate stage: first conv, a resnet block's convs and its residual, per filter. Fitted
# on the tiny codec (16 filters) and the published one (64 filters, random weights, issue 35:
# 3 copies and 64 bytes read 0.89x its CPU peak for a 3 s reference; 4 and 16 read 1.10x).
ENCODER_FULL_RATE_COPIES = 4
# Per 24 kHz sample besides the convs: resampling, feature extraction (float32 values and an
# int64 padding mask) and their tensor copies.
ENCODER_BYTES_PER_SAMPLE = 16
# ECAPA keeps every block's output for the aggregation: activations per mel frame, in channels.
SPEAKER_ACTIVATION_COPIES = 2
# Per 24 kHz sample: the resampled waveform and the STFT's input.
SPEAKER_BYTES_PER_SAMPLE = 16
MEL_HOP = 256
MEL_BINS = 128
TALKER_LOOPS = ("lean", "upstream")


class PromptLayout(NamedTuple):
    """The talker's prompt, as `Qwen3TTSForConditionalGeneration.generate` lays it out (upper
    bounds): `positions` run through the prefill; `text` positions of text are embedded as one
    tensor, which `trailing` (the text fed one position per frame, `trailing_text_hidden`)
    keeps alive as a view."""

    positions: int
    text: int
    trailing: int


def prompt_layout(text_tokens: int, ref_text_tokens: int | None = None, ref_codes: int = 0,
                  instruct_tokens: int = 0, streaming: bool = True) -> PromptLayout:
    """M46: the talker prompt of a request. `text_tokens` and `ref_text_tokens` (an ICL clone's
    transcript; None without one): their tokens without the chat templates; `ref_codes`: the
    reference's codec frames; `instruct_tokens`: the instruction's ids, template included.

    Streaming (`non_streaming_mode=False`, voice cloning's default) prefills the reference's
    codes only (ICL: each added to one text position), or one text position, and feeds the
    rest of the text one position per frame; non-streaming prefills the text too.
    """
    if ref_text_tokens is not None and ref_codes:
        text, codec = ref_text_tokens + text_tokens + 1, ref_codes + 1  # + the text's end; + the codec bos
        positions = codec if streaming else text + codec
        trailing = max(text - codec, 1) if streaming else 1
    else:
        text = text_tokens
        positions = 1 if streaming else text_tokens + 2  # the text, its end and the codec bos
        trailing = text_tokens if streaming else 1
    return PromptLayout(PROMPT_PREFIX + instruct_tokens + positions, text, trailing)


def _upstream_error(exc: Exception) -> MizuotoError:
    """The package validates speakers and languages with ValueError/NotImplementedError."""
    return MizuotoError(f"qwen3tts: {exc}")


class Qwen3TTSEngine(Engine):
    """Qwen3-TTS in three phases: voice prompt, talker, codec decoder (M1)."""

    id = "qwen3tts"
    title = "Qwen3-TTS"
    REQUIREMENTS = "qwen3tts"
    UPSTREAM = "qwen_tts"
    VERSIONS = ("base", "custom_voice", "voice_design")  # its model types
    PUBLISHED = "published"
    LORA = LoraAdapter(component="talker", checkpoint="model.safetensors", prefix="talker.")
    WEIGHTS = {
        "voice_prompt": SmallWeights(("speaker_encoder", "codec_encoder")),
        "generate": SmallWeights(("talker",)),
        "decode": SmallWeights(("codec_decoder",)),
    }
    PHASED = True
    sample_rate = SAMPLE_RATE

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        """The model type from config.json, its speakers (CustomVoice) and languages, as the
        package lists them (`get_supported_speakers` / `get_supported_languages`: lower case,
        "auto" and no dialects); None for any folder that is not an official 12 Hz layout."""
        try:
            config = check_layout(folder)
        except CheckpointError:
            return None
        label = MODEL_LABELS.get(str(config.get("tts_model_type")))
        talker = config.get("talker_config")
        if label is None or not isinstance(talker, dict):
            return None
        speakers = sorted(str(k).lower() for k in (talker.get("spk_id") or {}))
        languages = sorted(str(k).lower() for k in (talker.get("codec_language_id") or {}) if "dialect" not in str(k))
        return CheckpointInfo(label, speakers, ["auto", *languages])

    def __init__(self, manager: Any, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> None:
        super().__init__(manager, model_dir, dtype, device)
        if self.model_dir is None:
            raise CheckpointError("qwen3tts needs a checkpoint folder (the official Qwen3-TTS-12Hz-* layout)")
        self.tts = load_model(self.model_dir, dtype, self.device)
        model = self.tts.model
        self.model_type: str = model.tts_model_type
        codec = model.speech_tokenizer.model
        self.talker = self.register(model.talker, "talker", kind="sequence", graphable=True)
        self.talker.mark(model.talker.code_predictor, "hot")
        lean_loop.install(model.talker)
        self.talker_loop = "lean"  # or "upstream": the package's own loop (the reference)
        self.cuda_graphs = True  # M24: capture where `graphs.eligible` allows (benchmarks turn it off)
        self.speaker_encoder = None
        self.codec_encoder = None
        if self.model_type == "base":
            self.speaker_encoder = self.register(model.speaker_encoder, "speaker_encoder")
            self.codec_encoder = self.register(codec.encoder, "codec_encoder")
        self.codec_decoder = self.register(codec.decoder, "codec_decoder")

    def handles(self) -> list[Any]:
        found = [self.speaker_encoder, self.codec_encoder, self.talker, self.codec_decoder]
        return [h for h in found if h is not None]

    @property
    def speakers(self) -> list[str]:
        return self.tts.get_supported_speakers() or []

    @property
    def languages(self) -> list[str]:
        return self.tts.get_supported_languages() or []

    # ---- voice prompt ----------------------------------------------------------------------
    def encode_voice(self, ctx: RequestContext, reference: Audio | None, transcript: str | None,
                     speaker: str | None, instruct: str | None = None) -> dict[str, Any]:
        if self.model_type == "base":
            if reference is None:
                raise MizuotoError("qwen3tts Base clones a voice: give reference audio (and its transcript for ICL)")
            if speaker or instruct:
                raise MizuotoError("qwen3tts Base takes no speaker or instruct; "
                                   "use a CustomVoice or VoiceDesign checkpoint")
            return self._clone(ctx, reference, transcript or None)
        if reference is not None:
            raise MizuotoError(f"qwen3tts {self.model_type} has no voice cloning; use a Base checkpoint")
        if self.model_type == "custom_voice":
            return self._named_voice(speaker, instruct)
        if speaker:
            raise MizuotoError("qwen3tts VoiceDesign describes the voice with instruct; it has no speakers")
        return {"instruct": instruct or None}

    def _named_voice(self, speaker: str | None, instruct: str | None) -> dict[str, Any]:
        if not speaker:
            raise MizuotoError(f"qwen3tts CustomVoice needs a speaker, one of: {', '.join(self.speakers)}")
        try:
            self.tts._validate_speakers([speaker])
        except ValueError as exc:
            raise _upstream_error(exc) from exc
        if instruct and self.tts.model.tts_model_size in "0b6":
            # The package's generate_custom_voice drops it for this size (a substring test): do the same.
            log.warning("qwen3tts: the 0.6B CustomVoice model ignores instruct")
            instruct = None
        return {"speaker": speaker, "instruct": instruct or None}

    def _clone(self, ctx: RequestContext, reference: Audio, transcript: str | None) -> dict[str, Any]:
        """Reference codes (ICL only), then the x-vector: one voice-prompt phase each."""
        wav = reference.mono().numpy().astype(np.float32)
        sr = reference.sample_rate
        samples = math.ceil(len(wav) * SAMPLE_RATE / sr)
        codes = None
        if transcript is not None:
            codes = ctx.run("voice prompt", [self.codec_encoder], lambda: self._reference_codes(wav, sr),
                            self.codec_encoder_memory(samples))
        spk = ctx.run("voice prompt", [self.speaker_encoder], lambda: self._speaker_embedding(wav, sr),
                      self.speaker_encoder_memory(samples))
        return {"ref_code": codes, "spk": spk, "ref_text": transcript}

    def _reference_codes(self, wav: np.ndarray, sr: int) -> torch.Tensor:
        """(T_ref, 16) codes of the reference: the package's own resampling and feature extraction."""
        try:
            return self.tts.model.speech_tokenizer.encode(wav, sr=sr).audio_codes[0].cpu()
        finally:
            self._reset_codebook_caches()

    @torch.inference_mode()
    def _speaker_embedding(self, wav: np.ndarray, sr: int) -> torch.Tensor:
        """The x-vector, as `extract_speaker_embedding` computes it, but on our compute device:
        that method sends the mels to the *talker's* device, which is not placed in this phase."""
        import librosa
        from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

        model = self.tts.model
        target = model.speaker_encoder_sample_rate
        if sr != target:
            wav = librosa.resample(y=wav, orig_sr=sr, target_sr=target)
        mels = mel_spectrogram(torch.from_numpy(wav).unsqueeze(0), n_fft=1024, num_mels=MEL_BINS, sampling_rate=target,
                               hop_size=MEL_HOP, win_size=1024, fmin=0, fmax=12000).transpose(1, 2)
        return model.speaker_encoder(mels.to(self.device).to(self.dtype))[0].cpu()

    def _reset_codebook_caches(self) -> None:
        """Mimi caches ``embed_sum / cluster_usage`` in ``_embed`` on first use and never
        invalidates it: after the phase it would pin a device tensor and go stale when the
        encoder moves or streams. Recomputed from the placed codebooks on the next encode."""
        if self.codec_encoder is None:
            return
        for module in self.codec_encoder.module.modules():
            if getattr(module, "_embed", None) is not None:
                module._embed = None

    # ---- talker ----------------------------------------------------------------------------
    def _ids(self, text: str) -> torch.Tensor:
        return self.tts._tokenize_texts([text])[0]

    def _prompt(self, text: str, voice: Voice, language: str) -> dict[str, Any]:
        """`model.generate`'s inputs, as the package's generate_* methods build them."""
        tts, data = self.tts, voice.data
        try:
            tts._validate_languages([language])
        except ValueError as exc:
            raise _upstream_error(exc) from exc
        inputs: dict[str, Any] = {"input_ids": [self._ids(tts._build_assistant_text(text))], "languages": [language]}
        if self.model_type == "base":
            if "spk" not in data:
                raise MizuotoError("qwen3tts Base: the voice has no x-vector; make it with voice_prompt(reference=…)")
            icl = data["ref_code"] is not None
            inputs["voice_clone_prompt"] = {
                "ref_code": [data["ref_code"]], "ref_spk_embedding": [data["spk"]],
                "x_vector_only_mode": [not icl], "icl_mode": [icl],
            }
            inputs["ref_ids"] = [self._ids(tts._build_ref_text(data["ref_text"])) if icl else None]
            inputs["non_streaming_mode"] = False  # generate_voice_clone's default
        else:
            instruct = data.get("instruct")
            inputs["instruct_ids"] = [self._ids(tts._build_instruct_text(instruct)) if instruct else None]
            if self.model_type == "custom_voice":
                inputs["speakers"] = [data["speaker"]]
            inputs["non_streaming_mode"] = True  # generate_custom_voice's / generate_voice_design's default
        return inputs

    def _sampling(self, sampling: Sampling) -> dict[str, Any]:
        """Request settings over generation_config.json over the package's defaults."""
        return self.tts._merge_generate_kwargs(
            do_sample=sampling.do_sample, top_k=sampling.top_k, top_p=sampling.top_p,
            temperature=sampling.temperature, repetition_penalty=sampling.repetition_penalty,
            subtalker_dosample=sampling.subtalker_do_sample, subtalker_top_k=sampling.subtalker_top_k,
            subtalker_top_p=sampling.subtalker_top_p, subtalker_temperature=sampling.subtalker_temperature,
            max_new_tokens=sampling.max_new_tokens,
        )

    def prompt_layout(self, inputs: dict[str, Any]) -> PromptLayout:
        """The talker prompt these `model.generate` inputs make (`prompt_layout`)."""
        text = inputs["input_ids"][0].shape[-1] - TEXT_TEMPLATE
        ref = next((ids for ids in inputs.get("ref_ids", []) if ids is not None), None)
        instruct = sum(ids.shape[-1] for ids in inputs.get("instruct_ids", []) if ids is not None)
        return prompt_layout(max(text, 1), None if ref is None else ref.shape[-1] - REF_TEMPLATE,
                             self.ref_codes(inputs), instruct, not inputs.get("non_streaming_mode", False))

    @staticmethod
    def ref_codes(inputs: dict[str, Any]) -> int:
        """The reference's codec frames in the prompt (voice cloning with a transcript), else 0."""
        prompt = inputs.get("voice_clone_prompt")
        codes = prompt["ref_code"][0] if prompt else None
        return codes.shape[0] if codes is not None else 0

    def frames_for(self, text_tokens: int, sampling: Sampling) -> int:
        """M46: 16 frames per text token, capped by max_new_tokens (N new tokens give N-1 frames)."""
        return max(1, min(FRAMES_PER_TEXT_TOKEN * text_tokens, sampling.max_new_tokens - 1))

    def talker_memory(self, prompt_len: int, frames: int, rows: int = 1, kv_cache: str | None = None,
                      loop: str | None = None, ref_codes: int = 0, text: int = 0, trailing: int = 0) -> int:
        """M45/M46: the talker phase's working memory, from the request's prompt (`prompt_len`
        positions, `text` and `trailing` as `PromptLayout` has them, the reference's
        `ref_codes` codec frames) and `frames`.

        `loop` and `kv_cache`: the talker loop that will run and ``compute.kv_cache`` (None:
        what the engine and the policy say now). The largest of three moments, each with the
        prompt as `generate` keeps it (`PROMPT_COPIES`, the text and its trailing part):
        building the prompt (every code group's embedding of the reference's frames, stacked);
        the prefill's last layer (the prompt's KV cache, that layer's activations); the last
        frame (the KV cache at every position — the static `BufferCache` only under the lean
        loop, at the KV width and precision it computes in — the hidden states kept per step —
        the upstream loop's `generate` keeps every layer's, to read the codes back; the lean
        loop only the last — and the code predictor's per-frame cache of 16 positions).
        Measured: bench/engines.py --peaks (tiny) and the published widths (issue 35).
        """
        loop = loop or self._loop_that_runs()
        kv_cache = kv_cache or self.manager.policy.kv_cache
        tc = self.tts.model.config.talker_config
        cp = tc.code_predictor_config
        elem = element_size(self.dtype)
        row = rows * tc.hidden_size * elem  # one position of hidden size
        held = row * (PROMPT_COPIES * prompt_len + text + trailing)
        build = row * (BUILD_COPIES * (tc.num_code_groups * ref_codes + prompt_len + text))
        position = 2 * tc.num_key_value_heads * tc.head_dim * elem
        kept = 1 if loop == "lean" else tc.num_hidden_layers + 1
        layer = rows * prompt_len * elem * (PREFILL_HIDDEN_COPIES * tc.hidden_size
                                            + PREFILL_MLP_COPIES * tc.intermediate_size)
        prefill = (held + rows * position * tc.num_hidden_layers * prompt_len + layer
                   + kept * prompt_len * row)
        positions = prompt_len + frames
        kind = "static" if kv_cache == "static" and loop == "lean" else "dynamic"
        kv = peak_bytes(position, tc.num_hidden_layers, positions, kind, rows)
        cp_positions = tc.num_code_groups
        cp_kv = peak_bytes(2 * cp.num_key_value_heads * cp.head_dim * elem, cp.num_hidden_layers, cp_positions,
                           kind, rows)
        cp_hidden = rows * (cp.num_hidden_layers + 1) * cp_positions * cp.hidden_size * elem
        last_frame = held + kv + kept * positions * row + cp_kv + cp_hidden
        return max(build, prefill, last_frame)

    def generate(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling) -> Codes:
        inputs = self._prompt(text, voice, sampling.language or "Auto")
        settings = self._sampling(sampling)
        if self.talker_loop not in TALKER_LOOPS:
            raise MizuotoError(f"qwen3tts: talker_loop must be one of {', '.join(TALKER_LOOPS)}, "
                               f"got {self.talker_loop!r}")
        kv_cache = self.manager.policy.kv_cache
        text_tokens = max(1, inputs["input_ids"][0].shape[-1] - TEXT_TEMPLATE)
        layout = self.prompt_layout(inputs)
        memory = self.talker_memory(layout.positions, self.frames_for(text_tokens, sampling), kv_cache=kv_cache,
                                    ref_codes=self.ref_codes(inputs), text=layout.text, trailing=layout.trailing)
        total = int(settings["max_new_tokens"])
        model = self.tts.model
        reports: list[lean_loop.LoopReport] = []

        def talk() -> torch.Tensor:
            tick = self._progress_tick(ctx, total)
            with self.seeded(sampling.seed), self._loop(kv_cache, tick, reports, ctx.graph_capture):
                try:
                    codes, _hidden = model.generate(**inputs, **settings)
                except (ValueError, NotImplementedError) as exc:
                    raise _upstream_error(exc) from exc
            return codes[0].cpu()

        tokens = ctx.run("talker", [self.talker], talk, memory)
        ctx.progress(total, total)
        self._applied(ctx, reports[-1] if reports else None)
        return Codes(tokens, self.id, {"ref_code": voice.data.get("ref_code")})

    def _loop_that_runs(self) -> str:
        """The talker loop that will run: the lean one, unless the package's is asked for or
        the talker has a setting the lean loop does not reproduce."""
        if self.talker_loop == "upstream" or lean_loop.unsupported(self.tts.model.talker) is not None:
            return "upstream"
        return "lean"

    @contextlib.contextmanager
    def _loop(self, kv_cache: str, tick: Any, reports: list[lean_loop.LoopReport],
              capture: lean_loop.GraphCapture) -> Iterator[None]:
        """This thread's talker loop for the block: the lean one, or the package's (the
        progress hook `tick` is then called by the talker's forward). `capture`: the request's
        CUDA Graph capture (M24)."""
        if self.talker_loop == "upstream":
            with lean_loop.forward_ticks(self.tts.model.talker, tick):
                yield
            return
        loop = lean_loop.LeanLoop(self.talker, kv_cache=kv_cache, graphs_wanted=self.cuda_graphs, on_step=tick,
                                  capture=capture)
        reports.append(loop.report)
        with lean_loop.loop_in_this_thread(self.tts.model.talker, loop):
            yield

    def _applied(self, ctx: RequestContext, report: lean_loop.LoopReport | None) -> None:
        """`meta.applied`: which talker loop ran, with which KV cache and CUDA Graphs (M50, M53)."""
        if report is None:
            ctx.applied.update(talker_loop="upstream", kv_cache="dynamic",
                               cuda_graphs="off: the upstream loop runs")
            return
        ctx.applied.update(talker_loop=report.loop, kv_cache=report.kv_cache, cuda_graphs=report.cuda_graphs)

    @staticmethod
    def _progress_tick(ctx: RequestContext, total: int) -> Any:
        """Progress and interrupt once per talker step (prefill, then one per frame): the
        callable the talker loop calls at each step."""
        steps = iter(range(total + 1))

        def tick() -> None:
            ctx.progress(next(steps, total), total)

        return tick

    def typical_phases(self, seconds: float) -> list[PhaseEstimate]:
        """Base: an ICL clone of a 10 s reference (both voice-prompt phases, the reference's
        codes and transcript in the talker's prompt, decoded with the request's frames); the
        other types: a named voice or a description, no voice-prompt phase."""
        rate = SAMPLE_RATE / self.tts.model.speech_tokenizer.model.config.decode_upsample_rate
        frames = math.ceil(seconds * rate)
        phases: list[PhaseEstimate] = []
        ref_codes, ref_tokens = 0, None
        if self.codec_encoder is not None and self.speaker_encoder is not None:
            samples = int(TYPICAL_REFERENCE_SECONDS * SAMPLE_RATE)
            ref_codes = math.ceil(TYPICAL_REFERENCE_SECONDS * rate)
            ref_tokens = typical_tokens(TYPICAL_REFERENCE_SECONDS)
            phases += [PhaseEstimate("voice prompt", (self.codec_encoder,), self.codec_encoder_memory(samples)),
                       PhaseEstimate("voice prompt", (self.speaker_encoder,), self.speaker_encoder_memory(samples))]
        # as `_prompt` asks: voice cloning streams the text, the other types do not
        layout = prompt_layout(typical_tokens(seconds), ref_tokens, ref_codes, streaming=ref_tokens is not None)
        talker = self.talker_memory(layout.positions, frames, ref_codes=ref_codes, text=layout.text,
                                    trailing=layout.trailing)
        return phases + [
            PhaseEstimate("talker", (self.talker,), talker),
            PhaseEstimate("codec decoder", (self.codec_decoder,), self.codec_decoder_memory(ref_codes + frames)),
        ]

    # ---- codec decoder ---------------------------------------------------------------------
    def codec_decoder_memory(self, frames: int) -> int:
        """M45: the decoder's working memory for one chunk (at most 300 + 25 frames), from its
        geometry: the widest stage of the upsampling convs, plus the waveform being assembled
        (the chunks' outputs, their concatenation and its clamped copy)."""
        cfg = self.tts.model.speech_tokenizer.model.config.decoder_config
        elem = 4  # float32, as shipped
        chunk = min(frames, DECODE_CHUNK) + (DECODE_CONTEXT if frames > DECODE_CHUNK else 0)
        length = chunk * math.prod(cfg.upsampling_ratios)
        widest = length * max(cfg.hidden_size, cfg.latent_dim, cfg.decoder_dim)
        channels = cfg.decoder_dim
        for rate in cfg.upsample_rates:
            channels //= 2
            length *= rate
            widest = max(widest, channels * length)
        samples = frames * math.prod(cfg.upsampling_ratios) * math.prod(cfg.upsample_rates)
        return elem * (DECODER_STAGE_COPIES * widest + 4 * samples)

    def speaker_encoder_memory(self, samples: int) -> int:
        """M45: the speaker encoder's working memory, from the reference length (24 kHz
        samples): its activations per mel frame (every block's output is kept)."""
        cfg = self.tts.model.config.speaker_encoder_config
        frames = samples // MEL_HOP + 1
        channels = MEL_BINS + sum(cfg.enc_channels) + 3 * cfg.enc_channels[-1]
        activations = SPEAKER_ACTIVATION_COPIES * frames * channels * element_size(self.dtype)
        return activations + SPEAKER_BYTES_PER_SAMPLE * samples

    def codec_encoder_memory(self, samples: int) -> int:
        """M45: the codec encoder's working memory, from the reference length (24 kHz samples):
        its full-rate stage (float32, as shipped), which later stages only shrink."""
        cfg = self.tts.model.speech_tokenizer.model.config.encoder_config
        return samples * (ENCODER_BYTES_PER_SAMPLE + 4 * ENCODER_FULL_RATE_COPIES * cfg.num_filters)

    def decode(self, ctx: RequestContext, codes: Codes, allow_fallback: bool | None = None) -> Audio:
        ref = codes.extra.get("ref_code")
        full = codes.tokens if ref is None else torch.cat([ref, codes.tokens], dim=0)
        if full.shape[0] == 0:
            return Audio(torch.zeros(1, 0), self.sample_rate)  # EOS at once: nothing to decode
        codec = self.tts.model.speech_tokenizer.model

        @torch.inference_mode()
        def run() -> torch.Tensor:
            wav = codec.decode(full.unsqueeze(0).to(self.device), return_dict=True).audio_values[0]
            return wav.to(torch.float32).cpu()

        # No fallback: the decoder already works in chunks, and other chunks change samples (M43).
        wav = ctx.run("codec decoder", [self.codec_decoder], run, self.codec_decoder_memory(full.shape[0]))
        if ref is not None:
            # ICL decodes the reference's codes too, for context; cut their share, as the package does.
            wav = wav[int(ref.shape[0] / max(full.shape[0], 1) * wav.shape[0]):]
        return Audio(wav, self.sample_rate)
