"""Higgs Audio v2 (Boson AI; 3B generation base) over transformers' `higgs_audio_v2` and
`higgs_audio_v2_tokenizer`, run in phases by the memory runtime (issue 34).

Components and phases (M1), each a handle registered with the manager:

* ``voice prompt`` — ``audio_encoder`` (the audio tokenizer's DAC acoustic encoder, HuBERT
  semantic model, semantic encoder and their fusion) and ``quantizer`` (its residual codebooks),
  `oneshot`: each reference becomes 8 codebooks of codes at 25 Hz, as the processor encodes
  audio in a conversation (its feature extractor, then the tokenizer's ``encode``). Only for a
  cloned voice. Cached per reference by the base class (M4).
* ``talker`` — the LLM (`HiggsAudioV2ForConditionalGeneration`: Llama-3.2-3B with a second,
  audio FFN in every layer), `sequence` (M15, M20: one streamed copy, no prefetch): its
  decoder layers are the units, each with both FFNs (the dual FFN: text positions through one,
  audio positions through the other), so a streamed layer is one copy for both. It runs
  transformers' own ``generate`` (delay-pattern logits processor, repetition-aware sampling),
  so the codes are upstream's by construction; tests hold it equal anyway.
* ``decoder`` — ``quantizer`` and ``audio_decoder`` (the tokenizer's projection and DAC
  decoder), `oneshot`, through the processor's own ``decode`` (the delay pattern reverted, the
  stream's BOS/EOS cut). No fallback: M43 asks for one only where it gives the same samples.

The prompt (the published chat format, rendered by the folder's chat template): a system text,
a scene (its description, then per speaker ``SPEAKERn:`` and its reference audio, or
``SPEAKERn: <description>`` for a described voice), then the text, with ``[SPEAKERn]`` tags
where a speaker is named. A reference with its transcript clones the published zero-shot way
instead: the transcript as a user turn and the reference as the assistant's audio before the
text. Reference codes join the prompt as the processor puts them there (framed by the
stream's BOS and EOS, in the delay pattern, one ``<|AUDIO_OUT|>`` per frame).

Multi-speaker in one pass (`generate_dialogue`): a script's lines as ``[SPEAKERn] text`` lines
of one user turn, speaker n's reference audio (or description) in the scene. The format has no
fixed limit of speakers, but Boson's examples, its evaluation (two-speaker WER) and the
transformers documentation use two, and quality drops past that: `VOICES_PER_PASS` is 2.

Sampling. Request settings override the folder's ``generation_config.json`` (temperature,
top-k, top-p, sampling on or off, max new tokens); the repetition penalty does not apply (the
model's generate refuses a text-style penalty: it uses repetition-aware sampling, configured
in that file). The talker phase seeds torch's global RNG inside a `fork_rng` (M40, M57).

Loading (M27): see `checkpoint`. The LLM runs in the engine's dtype; the audio tokenizer stays
float32 as published.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    Turn,
    Voice,
    element_size,
    typical_tokens,
)
from ..higgs_codec import decoder_memory, register_codec
from .checkpoint import check_layout, load_models
from .config import SCENE, SYSTEM_PROMPT

# M46: audio frames estimated per text token of the request (25 frames a second), plus the
# delay pattern's frames; capped by max_new_tokens.
FRAMES_PER_TEXT_TOKEN = 8
# The constants below were fitted to CPU peaks measured on the tiny checkpoint (bench/engines.py
# --peaks), rounded up; on CUDA the M47 calibration corrects them further.
# Live activations of one decoder layer per prompt position, in hidden sizes (residual, norms,
# q/k/v/o and the masked scatter of the dual FFN's two halves) besides the MLP's intermediates.
LAYER_COPIES = 4
MLP_COPIES = 3  # gate, up and their product, intermediate-wide
# Per 24 kHz reference sample: the input and its 16 kHz resampling.
ENCODER_BYTES_PER_SAMPLE = 24
# The DAC encoder's full-rate stage, in copies of its width (encoder_hidden_size) per sample: the
# stage's input, and in a residual unit the Snake activation's temporaries, the dilated conv's
# output and the residual sum. Measured 5.1 at the tiny and the published width alike (the peak
# of the whole encode; HuBERT's conv front end, 512 wide at a fifth of 16 kHz, peaks lower and
# before it); the hidden-state and per-sample terms cover the rest.
ACOUSTIC_COPIES = 5
# Prompt tokens of the chat format besides the texts and the reference's audio tokens (a typical
# request, `typical_phases`): the system prompt, the scene, the turns' headers, the audio stream's
# begin and end tokens; rounded up.
PROMPT_OVERHEAD = 48


def _speaker(index: int) -> str:
    return f"SPEAKER{index}"


class HiggsAudioEngine(Engine):
    """Higgs Audio v2 in three phases: voice prompt, talker, decoder (M1)."""

    id = "higgsaudio"
    title = "Higgs Audio v2"
    REQUIREMENTS = "higgsaudio"
    UPSTREAM = "transformers.models.higgs_audio_v2"
    PUBLISHED = "published"
    PHASED = True
    VOICES_PER_PASS = 2
    # The LLM is where the bytes are; the audio tokenizer's DAC layers are weight-normed and stay
    # as published (issue 36).
    WEIGHTS = {"generate": SmallWeights(("talker",))}
    sample_rate = 24000

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        """A Higgs Audio v2 folder (both configs' model types); None otherwise. No built-in
        speakers; "auto" its one language: it speaks the language of the text, no setting."""
        try:
            check_layout(folder)
        except CheckpointError:
            return None
        return CheckpointInfo("Higgs Audio v2", [], ["auto"])

    def __init__(self, manager: Any, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> None:
        super().__init__(manager, model_dir, dtype, device)
        if self.model_dir is None:
            raise CheckpointError("higgsaudio needs a checkpoint folder (bosonai/higgs-audio-v2-generation-3B-base "
                                  "with its audio tokenizer in audio_tokenizer/)")
        loaded = load_models(self.model_dir, dtype)
        self.model, self.codec, self.processor = loaded.model, loaded.codec, loaded.processor
        self.model.generation_config = loaded.generation
        self.sample_rate = int(self.codec.config.sample_rate)
        parts = register_codec(self, self.codec)
        self.audio_encoder, self.quantizer, self.audio_decoder = parts.encoder, parts.quantizer, parts.decoder
        self.talker = self.register(self.model, "talker", kind="sequence")

    def handles(self) -> list[Any]:
        return [self.audio_encoder, self.quantizer, self.talker, self.audio_decoder]

    # ---- voice prompt ----------------------------------------------------------------------
    def encode_voice(self, ctx: RequestContext, reference: Audio | None, transcript: str | None,
                     speaker: str | None, instruct: str | None = None) -> dict[str, Any]:
        """Reference codes (8, frames) and the transcript; or a description of the voice
        (`instruct`); or neither: the model picks a voice."""
        if speaker:
            raise MizuotoError("higgsaudio has no built-in speakers: clone a reference, describe the voice with "
                               "instruct, or give neither for a voice of its choosing")
        if reference is None:
            return {"codes": None, "transcript": None, "description": (instruct or "").strip() or None}
        wav = self._at_model_rate(reference)
        codes = ctx.run("voice prompt", [self.audio_encoder, self.quantizer], lambda: self._encode(wav),
                        self.voice_prompt_memory(wav.shape[-1]))
        return {"codes": codes, "transcript": (transcript or "").strip() or None,
                "description": (instruct or "").strip() or None}

    def _at_model_rate(self, reference: Audio) -> torch.Tensor:
        """The reference, mono, at the tokenizer's rate (torchaudio's resampler, as the tokenizer
        itself resamples for its semantic branch)."""
        import torchaudio

        wav = reference.mono()
        if reference.sample_rate != self.sample_rate:
            wav = torchaudio.functional.resample(wav, reference.sample_rate, self.sample_rate)
        return wav

    @torch.inference_mode()
    def _encode(self, wav: torch.Tensor) -> torch.Tensor:
        """As the processor encodes a conversation's audio: its feature extractor, then the
        tokenizer's encode at the top bandwidth."""
        features = self.processor.feature_extractor(wav.numpy(), sampling_rate=self.sample_rate, return_tensors="pt")
        return self.codec.encode(features["input_values"].to(self.device)).audio_codes[0].cpu()

    def voice_prompt_memory(self, samples: int) -> int:
        """M45: the tokenizer encoder's working memory for `samples` at 24 kHz (float32): the DAC
        encoder's full-rate stage, HuBERT's hidden states (every layer's is kept and averaged) and
        the per-sample front-end temporaries."""
        config = self.codec.config
        frames = samples // config.hop_length + 1
        full_rate = 4 * samples * config.acoustic_model_config.encoder_hidden_size
        semantic = config.semantic_model_config
        hubert = 4 * 2 * frames * config.semantic_downsample_factor * semantic.hidden_size * (
            semantic.num_hidden_layers + 2)
        return ACOUSTIC_COPIES * full_rate + hubert + ENCODER_BYTES_PER_SAMPLE * samples

    # ---- talker ----------------------------------------------------------------------------
    def _conversation(self, lines: Sequence[tuple[int | None, str]], voices: Sequence[Voice]) -> tuple[
            list[dict[str, Any]], list[torch.Tensor]]:
        """The published chat format for `lines` (speaker index or None, text) spoken by
        `voices`, and the reference codes in the order the prompt holds them."""
        system = {"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]}
        scene: list[dict[str, Any]] = [{"type": "text", "text": SCENE}]
        codes: list[torch.Tensor] = []
        first = voices[0].data if len(voices) == 1 else None
        if first is not None and first["codes"] is not None and first["transcript"]:
            # Zero-shot cloning with the reference's transcript: its words, then its audio.
            text = " ".join(t for _, t in lines)
            turns = [{"role": "user", "content": [{"type": "text", "text": first["transcript"]}]},
                     {"role": "assistant", "content": [{"type": "audio"}]},
                     {"role": "user", "content": [{"type": "text", "text": text}]}]
            return [system, {"role": "scene", "content": scene}, *turns], [first["codes"]]
        named: set[int] = set()
        for index, voice in enumerate(voices):
            if voice.data["codes"] is not None:
                scene += [{"type": "text", "text": f"{_speaker(index)}:"}, {"type": "audio"}]
                codes.append(voice.data["codes"])
                named.add(index)
            elif voice.data["description"]:
                scene.append({"type": "text", "text": f"{_speaker(index)}: {voice.data['description']}"})
                named.add(index)
        text = "\n".join(f"[{_speaker(who)}] {line}" if who in named or len(voices) > 1 else line
                         for who, line in lines)
        user = {"role": "user", "content": [{"type": "text", "text": text}]}
        return [system, {"role": "scene", "content": scene}, user], codes

    def _inputs(self, conversation: list[dict[str, Any]], codes: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """`generate`'s inputs, as the processor's ``apply_chat_template`` makes them from the
        same conversation with the references' audio, but from the cached codes: each framed by
        the stream's BOS and EOS and put in the delay pattern, its placeholder expanded to one
        audio token per frame."""
        processor = self.processor
        text = processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        framed = []
        for c in codes:
            bos = c.new_full((c.shape[0], 1), processor.audio_stream_bos_id)
            eos = c.new_full((c.shape[0], 1), processor.audio_stream_eos_id)
            framed.append(processor.build_delay_pattern(torch.cat([bos, c, eos], dim=1)[None])[0].transpose(0, 1))
        if text.count(processor.audio_token) != len(framed):
            raise MizuotoError(f"higgsaudio: the chat template placed {text.count(processor.audio_token)} audio "
                               f"placeholders for {len(framed)} references")
        lengths = iter(f.shape[0] for f in framed)
        text = re.sub(re.escape(processor.audio_token), lambda _: processor.get_audio_tokens(next(lengths)), text)
        bos_token = processor.tokenizer.bos_token
        tokens = processor.tokenizer(text, return_tensors="pt",
                                     add_special_tokens=not (bos_token and text.startswith(bos_token)))
        inputs = {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"]}
        if framed:
            audio = torch.cat(framed, dim=0)[None]
            inputs["audio_input_ids"] = audio
            inputs["audio_input_ids_mask"] = torch.ones(audio.shape[:2], dtype=torch.bool)
        return inputs

    def _settings(self, sampling: Sampling) -> dict[str, Any]:
        """Request settings over the folder's generation config (no repetition penalty: see the
        module's docstring)."""
        do_sample = sampling.do_sample and sampling.temperature > 0
        settings: dict[str, Any] = {"max_new_tokens": sampling.max_new_tokens, "do_sample": do_sample}
        if do_sample:
            settings.update(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
        return settings

    def frames_for(self, text_tokens: int, sampling: Sampling) -> int:
        """M46: the frames to expect for `text_tokens` of text, capped by max_new_tokens."""
        delay = self.model.config.num_codebooks
        return max(1, min(FRAMES_PER_TEXT_TOKEN * text_tokens + delay, sampling.max_new_tokens))

    def talker_memory(self, prompt_len: int, frames: int) -> int:
        """M45/M46: the talker's working memory: its KV cache grown to the prompt and the frames
        (every layer's, plus one layer's copy while it grows), one layer's activations over the
        prompt at prefill (both FFNs' halves; the intermediates of one at a time; attention by
        SDPA, no score matrix), the audio ids and one step's logits."""
        cfg = self.model.config
        elem = element_size(self.dtype)
        positions = prompt_len + frames
        kv = peak_bytes(2 * cfg.num_key_value_heads * cfg.head_dim * elem, cfg.num_hidden_layers, positions)
        layer = prompt_len * elem * (LAYER_COPIES * cfg.hidden_size + MLP_COPIES * cfg.intermediate_size)
        step = positions * cfg.num_codebooks * 8 + 4 * cfg.num_codebooks * cfg.codebook_size * 4
        return kv + layer + step

    def generate(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling) -> Codes:
        conversation, codes = self._conversation([(0, text)], [voice])
        return self._talk(ctx, conversation, codes, sampling)

    def generate_dialogue(self, ctx: RequestContext, turns: Sequence[Turn], voices: Sequence[Voice],
                          sampling: Sampling) -> Codes:
        """The talker phase for a whole dialogue in one pass: ``[SPEAKERn]`` lines, speaker n's
        reference (or description) in the scene (the base class checked the turns and voices)."""
        lines = [(turn.voice, turn.text.strip()) for turn in turns]
        # The scene form for every voice: a reference's transcript has no place in it.
        scene_voices = [dataclasses.replace(v, data={**v.data, "transcript": None}) for v in voices]
        conversation, codes = self._conversation(lines, scene_voices)
        return self._talk(ctx, conversation, codes, sampling)

    def _talk(self, ctx: RequestContext, conversation: list[dict[str, Any]], codes: Sequence[torch.Tensor],
              sampling: Sampling) -> Codes:
        inputs = self._inputs(conversation, codes)
        settings = self._settings(sampling)
        prompt_len = inputs["input_ids"].shape[-1]
        prompt_frames = inputs["audio_input_ids"].shape[1] if "audio_input_ids" in inputs else 0
        text_tokens = max(1, prompt_len - prompt_frames)
        memory = self.talker_memory(prompt_len, self.frames_for(text_tokens, sampling))
        total = int(settings["max_new_tokens"])

        @torch.inference_mode()
        def talk() -> torch.Tensor:
            on_device = {k: v.to(self.device) for k, v in inputs.items()}
            with self.seeded(sampling.seed), self.progress_per_call(ctx, self.model, total):
                try:
                    audio = self.model.generate(**on_device, **settings)
                except ValueError as exc:
                    raise MizuotoError(f"higgsaudio: {exc}") from exc
            return audio[0, prompt_frames:].cpu()

        tokens = ctx.run("talker", [self.talker], talk, memory)
        ctx.progress(total, total)
        return Codes(tokens, self.id)

    def typical_phases(self, seconds: float) -> list[PhaseEstimate]:
        """A zero-shot clone of a 10 s reference with its transcript (its codes in the prompt,
        framed by the stream's BOS and EOS in the delay pattern), the frames as `frames_for`
        estimates them from the text tokens; the decoder with the frames of `seconds`."""
        config = self.codec.config
        samples = int(TYPICAL_REFERENCE_SECONDS * self.sample_rate)
        reference = samples // config.hop_length + 1 + 2 + self.model.config.num_codebooks - 1
        text_tokens = PROMPT_OVERHEAD + typical_tokens(TYPICAL_REFERENCE_SECONDS) + typical_tokens(seconds)
        frames = self.frames_for(text_tokens, Sampling())
        return [PhaseEstimate("voice prompt", (self.audio_encoder, self.quantizer), self.voice_prompt_memory(samples)),
                PhaseEstimate("talker", (self.talker,), self.talker_memory(text_tokens + reference, frames)),
                PhaseEstimate("decoder", (self.quantizer, self.audio_decoder),
                              decoder_memory(self.codec, math.ceil(seconds * config.frame_rate)))]

    # ---- decoder ---------------------------------------------------------------------------
    def audio_frames(self, tokens: torch.Tensor) -> int:
        """The frames of audio in generated `tokens` (frames, codebooks), as the processor's
        decode cuts them: from the last all-BOS frame to the first all-EOS one after it, less
        the delay pattern's frames."""
        processor = self.processor
        bos = (tokens == processor.audio_stream_bos_id).all(-1).nonzero()
        if len(bos) == 0:
            return 0
        start = int(bos[-1, 0])
        eos = (tokens[start:] == processor.audio_stream_eos_id).all(-1).nonzero()
        end = int(eos[0, 0]) if len(eos) else tokens.shape[0] - start
        return max(0, end - 1 - (tokens.shape[1] - 1))

    def decode(self, ctx: RequestContext, codes: Codes, allow_fallback: bool | None = None) -> Audio:
        frames = self.audio_frames(codes.tokens)
        if frames == 0:
            return Audio(torch.zeros(1, 0), self.sample_rate)  # the stream ended before any audio

        @torch.inference_mode()
        def run() -> torch.Tensor:
            return self.processor.decode(codes.tokens[None].to(self.device)).float().cpu()

        wav = ctx.run("decoder", [self.quantizer, self.audio_decoder], run, decoder_memory(self.codec, frames))
        return Audio(wav.reshape(1, -1), self.sample_rate)

