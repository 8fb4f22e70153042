"""Dia (Nari Labs, 1.6B) over transformers' own Dia and DAC code, run in phases by the memory
runtime (issue 34).

Components and phases (M1), each a handle registered with the manager:

* ``voice prompt`` — ``dac_encoder`` and ``quantizer`` (DAC 44 kHz's encoder and residual
  codebooks), `oneshot`: a reference recording becomes 9 rows of codes, the audio prompt Dia
  continues (with its transcript in front of the text). Cached per reference (M4); a voice with
  no reference encodes nothing (Dia then picks a voice of its own).
* ``talker`` — the whole `DiaForConditionalGeneration`, `sequence` (M15, M20): its text
  encoder's and audio decoder's layers are the units. The encoder is not a handle of its own
  and not the fixed part: it runs once per request inside `generate` (its output is then held
  as the cross-attention cache), while the decoder runs at every step with both CFG rows in one
  batch. So the decoder is marked `hot`: with a short budget its layers stay resident and the
  encoder's stream (once per request), which the fixed part would have kept resident for
  nothing. As its own handle it would need our own copy of `generate`'s CFG encoder pass.
* ``decoder`` — ``quantizer`` and ``dac_decoder``, `oneshot`: codes to 44.1 kHz audio.

Text and speakers. Dia speaks a script with the speaker tags ``[S1]`` and ``[S2]`` (its
tokenizer's two special tokens) and its nonverbal tags — ``(laughs)``, ``(coughs)``, ``(sighs)``
… — written in the text, which pass through as text. `generate` puts ``[S1]`` in front of a
text without a tag; `generate_dialogue` speaks up to two voices in one pass (`VOICES_PER_PASS`):
turn by turn with each voice's tag, the cloned voices' transcripts and codes first (voice 1's,
then voice 2's), as Dia's own examples prompt two cloned speakers.

Exactness (M40, M57). `generate` samples from torch's global RNG: the talker phase seeds it in a
`fork_rng`, so a retried phase and every placement draw the same numbers. Our phases equal
transformers' `DiaProcessor` + `generate` + `DiaProcessor.batch_decode` sample for sample (the
inputs are built as the processor builds them, from the cached codes).

Loading (M27): `checkpoint.load_model`; the model in the engine's dtype, DAC float32 as shipped.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ...audio import Audio
from ...errors import CheckpointError, MizuotoError
from ...memory.phases import RequestContext
from ...nn.kv_cache import peak_bytes
from ..base import (
    TYPICAL_CHARS_PER_SECOND,
    TYPICAL_REFERENCE_SECONDS,
    CheckpointInfo,
    Codes,
    Engine,
    PhaseEstimate,
    Sampling,
    Turn,
    Voice,
    element_size,
)
from .checkpoint import check_layout, load_model
from .config import AUDIO_BOS, AUDIO_PAD, HOP, SAMPLE_RATE, SPEAKER_TAGS

# M46: decoder frames estimated per byte of text (86 frames a second, ~14 characters a second
# of speech), capped by max_new_tokens.
FRAMES_PER_TEXT_BYTE = 7
# The constants below were fitted to CPU peaks measured on the tiny checkpoint (bench/engines.py
# --peaks), to land 1.0-1.3x above them (M45); on CUDA the M47 calibration corrects them further.
# Live activations of one transformer layer per row and position, in units of the hidden size
# (residual, norm, attention projections), besides the MLP's intermediate-wide tensors.
LAYER_COPIES = 6
# The step's logits (rows x 9 channels x 1028, float32) and the logits processors' copies of them.
LOGITS_COPIES = 8
# The prefill's logits at every audio-prompt position: the head's output and its reshaped copy.
PREFILL_LOGITS_COPIES = 2
# The DAC's widest stage (channels x samples, float32), counted this many times: the stage's
# output, the Snake activations, dilated-conv inputs and residual sums alive together (decoder;
# the encoder's full-rate stage keeps one fewer).
DAC_STAGE_COPIES = 6
ENCODER_STAGE_COPIES = 5
# Per reference sample besides the convs: resampling, the feature extractor's float32 values and
# padding mask, their copies.
ENCODER_BYTES_PER_SAMPLE = 48


def tagged(tag: str, text: str) -> str:
    """`text` as Dia's script line of speaker `tag`; a text that starts with a tag is Dia script
    already and is kept as written."""
    text = text.strip()
    return text if text.startswith(SPEAKER_TAGS) else f"{tag} {text}"


class DiaEngine(Engine):
    """Dia in three phases: voice prompt, talker, decoder (M1)."""

    id = "dia"
    title = "Dia"
    REQUIREMENTS = "dia"
    UPSTREAM = "transformers"
    PUBLISHED = "published"
    PHASED = True
    VOICES_PER_PASS = len(SPEAKER_TAGS)
    sample_rate = SAMPLE_RATE

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        """A Dia folder (transformers layout); None otherwise. Dia has no named speakers
        (``[S1]``/``[S2]`` are roles in a script, not voices) and no language to choose: it
        reads the text as written (English)."""
        try:
            check_layout(folder)
        except CheckpointError:
            return None
        return CheckpointInfo("Dia", [], ["auto"])

    def __init__(self, manager: Any, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> None:
        super().__init__(manager, model_dir, dtype, device)
        if self.model_dir is None:
            raise CheckpointError("dia needs a checkpoint folder (the nari-labs/Dia-1.6B-0626 layout)")
        parts = load_model(self.model_dir, dtype)
        self.model, self.dac, self.processor = parts.model, parts.dac, parts.processor
        self.delay_pattern: list[int] = list(self.model.config.delay_pattern)
        self.talker = self.register(self.model, "talker", kind="sequence")
        self.talker.mark(self.model.model.decoder, "hot")
        self.dac_encoder = self.register(self.dac.encoder, "dac_encoder")
        self.quantizer = self.register(self.dac.quantizer, "quantizer")
        self.dac_decoder = self.register(self.dac.decoder, "dac_decoder")

    def handles(self) -> list[Any]:
        return [self.dac_encoder, self.quantizer, self.talker, self.dac_decoder]

    # ---- voice prompt ----------------------------------------------------------------------
    def encode_voice(self, ctx: RequestContext, reference: Audio | None, transcript: str | None,
                     speaker: str | None, instruct: str | None = None) -> dict[str, Any]:
        if speaker or instruct:
            raise MizuotoError("dia has no named speakers or voice descriptions: clone a reference (with its "
                               "transcript), or give neither for a voice of Dia's own")
        if reference is None:
            return {"codes": None, "transcript": None}
        if not (transcript or "").strip():
            raise MizuotoError("dia: give the reference audio's transcript (Dia continues the recording after it)")
        wav = reference.mono_at(SAMPLE_RATE)
        codes = ctx.run("voice prompt", [self.dac_encoder, self.quantizer], lambda: self._encode(wav),
                        self.voice_prompt_memory(wav.shape[-1]))
        return {"codes": codes, "transcript": transcript.strip()}

    @torch.inference_mode()
    def _encode(self, wav: torch.Tensor) -> torch.Tensor:
        """(frames, 9) codes of a 44.1 kHz recording, as `DiaProcessor` encodes its audio."""
        features = self.processor.feature_extractor(wav.numpy(), sampling_rate=SAMPLE_RATE, return_tensors="pt")
        hop = self.processor.feature_extractor.hop_length
        length = math.ceil(features["padding_mask"][0].sum(dim=-1) / hop) * hop
        audio = features["input_values"][0][None, ..., :length].to(self.device)
        return self.dac.encode(audio).audio_codes.transpose(1, 2)[0].cpu()

    def voice_prompt_memory(self, samples: int) -> int:
        """M45: the DAC encoder's working memory for `samples` 44.1 kHz samples (float32): its
        full-rate stage, which the later, strided stages only shrink."""
        widest = samples * self.dac.config.encoder_hidden_size
        return 4 * ENCODER_STAGE_COPIES * widest + ENCODER_BYTES_PER_SAMPLE * samples

    # ---- talker ----------------------------------------------------------------------------
    def script(self, turns: Sequence[Turn], voices: Sequence[Voice]) -> tuple[str, torch.Tensor | None]:
        """Dia's input for a dialogue: the text (the cloned voices' transcripts, then the turns,
        each with its voice's tag) and the audio prompt (the cloned voices' codes, in the same
        order), None where no voice is cloned. The turns and voices are checked already
        (`base.check_dialogue`)."""
        cloned = [(SPEAKER_TAGS[i], v.data) for i, v in enumerate(voices) if v.data.get("codes") is not None]
        prompt = [tagged(tag, data["transcript"]) for tag, data in cloned]
        lines = [tagged(SPEAKER_TAGS[t.voice], t.text) for t in turns]
        codes = torch.cat([data["codes"] for _, data in cloned]) if cloned else None
        return " ".join(prompt + lines), codes

    def inputs(self, text: str, codes: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """`generate`'s inputs for one row, as `DiaProcessor.__call__` builds them: the text's
        bytes, and the audio prompt (BOS, then `codes`) under the delay pattern."""
        proc = self.processor
        # One row: the processor's padding changes nothing (and would only warn about max_length).
        encoded = proc.tokenizer([text], add_special_tokens=False, return_tensors="pt")
        channels, max_delay = len(self.delay_pattern), max(self.delay_pattern)
        if codes is None:
            audio = torch.full((1, 1, channels), AUDIO_BOS, dtype=torch.long)
        else:
            audio = F.pad(codes[None].long(), (0, 0, 1, 0, 0, 0), mode="constant", value=AUDIO_BOS)
        mask = torch.ones((1, audio.shape[1] + max_delay), dtype=torch.long)
        positions = mask.shape[-1]
        prefill = torch.full((1, positions, channels), AUDIO_PAD, dtype=torch.int)
        prefill[:, :positions - max_delay] = audio
        indices = proc.build_indices(bsz=1, seq_len=positions, num_channels=channels,
                                     delay_pattern=self.delay_pattern, revert=False)
        delayed = proc.apply_audio_delay(prefill, pad_token_id=AUDIO_PAD, bos_token_id=AUDIO_BOS,
                                         precomputed_idx=indices)
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"],
                "decoder_input_ids": delayed, "decoder_attention_mask": mask}

    def frames_for(self, text: str, sampling: Sampling) -> int:
        """M46: the decoder steps estimated for `text` (bytes), capped by max_new_tokens."""
        return max(1, min(FRAMES_PER_TEXT_BYTE * len(text.encode("utf-8")), sampling.max_new_tokens))

    def guidance_rows(self) -> int:
        """Rows the decoder runs per request row: two under classifier-free guidance."""
        scale = self.model.generation_config.guidance_scale
        return 2 if scale is not None and scale != 1 else 1

    def talker_memory(self, text_tokens: int, prompt_frames: int, frames: int) -> int:
        """M45/M46: the talker phase's working memory, from the request: the decoder's KV cache
        (self-attention over the audio prompt, the new frames and the delay; cross-attention
        over the text) for both CFG rows, and the larger of the prefills and one step's logits.
        The encoder's prefill: its activations and attention scores over the text. The
        decoder's: the audio prompt's activations and scores, and its logits at every prompt
        position (Dia's head computes them all, 9 channels x 1028 each), kept twice."""
        enc, dec = self.model.config.encoder_config, self.model.config.decoder_config
        elem = element_size(self.dtype)
        rows = self.guidance_rows()
        prompt = prompt_frames + 1  # BOS and the prompt's frames (the delayed tail is not prefilled)
        positions = prompt + max(self.delay_pattern) + frames
        self_kv = peak_bytes(2 * dec.num_key_value_heads * dec.head_dim * elem, dec.num_hidden_layers, positions,
                             "dynamic", rows)
        cross_kv = (rows * dec.num_hidden_layers * text_tokens * 2 * dec.cross_num_key_value_heads
                    * dec.cross_head_dim * elem)
        encoder = rows * text_tokens * elem * (LAYER_COPIES * enc.hidden_size + 2 * enc.intermediate_size
                                               + enc.num_attention_heads * text_tokens)
        head = dec.num_channels * dec.vocab_size
        decoder = rows * prompt * elem * (LAYER_COPIES * dec.hidden_size + 2 * dec.intermediate_size
                                          + dec.num_attention_heads * prompt + PREFILL_LOGITS_COPIES * head)
        step = rows * head * 4 * LOGITS_COPIES
        return self_kv + cross_kv + max(encoder, decoder, step)

    def _settings(self, sampling: Sampling) -> dict[str, Any]:
        """The request's sampling over generation_config.json (its guidance scale). Dia has no
        repetition penalty in its recipe and takes none here; it samples at temperature 1 or more
        (its `generate` raises a lower one to 1, with a warning a user cannot act on: the
        node's default is 0.9), so a lower one is passed as 1, which samples the same.
        ``max_new_tokens`` counts audio frames: under the delay pattern the last channel's frame
        comes 15 steps after the first's, so `generate` runs that many steps more (else 16 new
        tokens would give no audio at all)."""
        return {"do_sample": sampling.do_sample, "temperature": max(sampling.temperature, 1.0), "top_k": sampling.top_k,
                "top_p": sampling.top_p, "max_new_tokens": self.decoder_steps(sampling)}

    def decoder_steps(self, sampling: Sampling) -> int:
        """Decoder steps for the request: its frames and the delay pattern's tail."""
        return sampling.max_new_tokens + max(self.delay_pattern)

    def generate(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling) -> Codes:
        return self._talk(ctx, [Turn(0, text)], [voice], sampling)

    def generate_dialogue(self, ctx: RequestContext, turns: Sequence[Turn], voices: Sequence[Voice],
                          sampling: Sampling) -> Codes:
        return self._talk(ctx, turns, voices, sampling)

    def _talk(self, ctx: RequestContext, turns: Sequence[Turn], voices: Sequence[Voice], sampling: Sampling) -> Codes:
        text, codes = self.script(turns, voices)
        inputs = self.inputs(text, codes)
        prompt_len = inputs["decoder_attention_mask"].shape[1] - max(self.delay_pattern)
        spoken = " ".join(t.text for t in turns)
        memory = self.talker_memory(inputs["input_ids"].shape[-1], prompt_len - 1, self.frames_for(spoken, sampling))
        settings = self._settings(sampling)
        total = self.decoder_steps(sampling)

        @torch.inference_mode()
        def talk() -> torch.Tensor:
            placed = {k: v.to(self.device) for k, v in inputs.items()}
            with self.seeded(sampling.seed), self.progress_per_call(ctx, self.model.model.decoder, total):
                return self.model.generate(**placed, **settings)[0].cpu()

        tokens = ctx.run("talker", [self.talker], talk, memory)
        ctx.progress(total, total)
        return Codes(tokens, self.id, {"prompt_len": prompt_len})

    def typical_phases(self, seconds: float) -> list[PhaseEstimate]:
        """One voice cloned from a 10 s reference with its transcript (its codes the audio
        prompt, its transcript before the text, each with a speaker tag): the text's bytes (one
        token each), the steps as `frames_for` estimates them; the decoder with the frames of
        `seconds`, at most the request's max_new_tokens."""
        samples = int(TYPICAL_REFERENCE_SECONDS * SAMPLE_RATE)
        reference = samples // HOP
        spoken = "a" * round(seconds * TYPICAL_CHARS_PER_SECOND)  # English: a byte a character
        text_tokens = round(TYPICAL_REFERENCE_SECONDS * TYPICAL_CHARS_PER_SECOND) + len(spoken) + 2 * len("[S1] ")
        sampling = Sampling()
        frames = self.frames_for(spoken, sampling)
        decoded = min(math.ceil(seconds * SAMPLE_RATE / HOP), sampling.max_new_tokens)
        return [PhaseEstimate("voice prompt", (self.dac_encoder, self.quantizer), self.voice_prompt_memory(samples)),
                PhaseEstimate("talker", (self.talker,), self.talker_memory(text_tokens, reference, frames)),
                PhaseEstimate("decoder", (self.quantizer, self.dac_decoder), self.decoder_memory(decoded))]

    # ---- decoder ---------------------------------------------------------------------------
    def frames(self, codes: Codes) -> torch.Tensor:
        """(9, frames) codes to decode: the delay pattern undone, the audio prompt and the tail
        after EOS cut, as `DiaProcessor.batch_decode` does."""
        sequence = codes.tokens[None]
        _, positions, channels = sequence.shape
        end = positions - int((sequence[:, :, 0] == AUDIO_PAD).sum()) - 1
        indices = self.processor.build_indices(bsz=1, seq_len=positions, num_channels=channels,
                                               delay_pattern=self.delay_pattern, revert=True)
        undone = self.processor.apply_audio_delay(sequence, pad_token_id=-1, bos_token_id=-1,
                                                  precomputed_idx=indices).transpose(1, 2)
        return undone[0, :, int(codes.extra["prompt_len"]):end]

    def decoder_memory(self, frames: int) -> int:
        """M45: the DAC decoder's working memory for `frames` code frames (float32): its widest
        upsampling stage and the waveform."""
        config = self.dac.config
        widest, length, channels = 0, frames, config.decoder_hidden_size
        for rate in config.upsampling_ratios:
            channels //= 2
            length *= rate
            widest = max(widest, channels * length)
        return 4 * (DAC_STAGE_COPIES * widest + 2 * frames * config.hop_length)

    def decode(self, ctx: RequestContext, codes: Codes, allow_fallback: bool | None = None) -> Audio:
        frames = self.frames(codes)
        if frames.shape[-1] <= 0:
            return Audio(torch.zeros(1, 0), self.sample_rate)  # EOS at once: nothing to decode

        @torch.inference_mode()
        def run() -> torch.Tensor:
            wav = self.dac.decode(audio_codes=frames[None].to(self.device)).audio_values
            return wav.cpu().squeeze().float()

        # No fallback: tiles of the DAC decoder would change samples at their seams (M43).
        wav = ctx.run("decoder", [self.quantizer, self.dac_decoder], run, self.decoder_memory(frames.shape[-1]))
        return Audio(wav.unsqueeze(0), self.sample_rate)
