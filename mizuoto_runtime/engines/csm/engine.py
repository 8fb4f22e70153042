"""CSM (Sesame's Conversational Speech Model, 1B) over transformers' own CSM and Mimi code, run in
phases by the memory runtime (issue 34).

Components and phases (M1), each a handle registered with the manager:

* ``voice prompt`` — ``mimi_encoder`` and ``quantizer`` (Mimi's encoder and its 32 residual
  codebooks), `oneshot`: a reference recording becomes the codes of a context turn (its
  transcript and its audio), as CSM's processor and model encode the context audio. Cached per
  reference (M4); a voice with no reference encodes nothing (CSM then picks a voice of its own).
* ``talker`` — `CsmForConditionalGeneration` without its codec, `sequence` (M15, M20): the
  backbone's layers and the depth decoder's are the units. The depth decoder is not a handle of
  its own: `generate` calls it inside every backbone step (31 of its steps per frame, 32 codes),
  so both must be placed together for the whole phase. It is marked `hot`: with a short budget
  its layers (run 31 times a frame) stay resident and the backbone's (once a frame) stream, as
  Qwen3-TTS's code predictor does.
* ``decoder`` — ``quantizer`` and ``mimi_decoder``, `oneshot`: codes to 24 kHz audio.

Speakers and context (the processor's chat template, speaker ids as roles). Voice ``i`` of a
pass is speaker ``[i]``; a cloned voice is a context turn first (its transcript and its
reference's codes), in voice order. `generate` speaks one turn as speaker 0.
`generate_dialogue` speaks a conversation in one talker phase (`VOICES_PER_PASS` = 2 speakers,
the two-party conversations CSM was trained on and Sesame's own examples use; the template takes
any integer id, but the model has no training for more): each turn is one `generate` over the
context turns and the turns spoken so far, whose codes are the next turns' context, as CSM
continues a conversation. Upstream's pipeline takes context as audio and re-encodes it; here a
spoken turn's context is its own codes, the ones the model produced (no decode and re-encode
inside the phase). Each turn samples with its own seed (`chunk_seed`: turn k with seed + k),
stops at its all-zero frame, and is decoded on its own, as upstream decodes an utterance.

Exactness (M40, M57). `generate` samples from torch's global RNG: the talker phase seeds it in a
`fork_rng`, so a retried phase and every placement draw the same numbers. The context codes go
in where upstream's `_merge_input_ids_with_input_values` puts the codes its codec computes (the
same embedding lookups, the same positions): our phases equal transformers' processor +
`generate(output_audio=True)` sample for sample.

Loading (M27): `checkpoint.load_model`; backbone and depth decoder in the engine's dtype, Mimi
float32 as shipped.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

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
    SmallWeights,
    Turn,
    Voice,
    chunk_seed,
    element_size,
    typical_tokens,
)
from .checkpoint import check_layout, load_model
from .config import FRAME_SAMPLES, SAMPLE_RATE

# M46: frames estimated per byte of text (12.5 frames a second, ~14 characters a second of
# speech), capped by max_new_tokens.
FRAMES_PER_TEXT_BYTE = 1
# The constants below were fitted to CPU peaks measured on the tiny checkpoint (bench/engines.py
# --peaks), to land 1.0-1.3x above them (M45); on CUDA the M47 calibration corrects them further.
# Live activations of one backbone layer per position, in units of the hidden size, besides the
# MLP's intermediate-wide tensors; `generate` keeps every layer's hidden states (it reads the last).
LAYER_COPIES = 6
# Mimi's full-rate stage (filters x samples, float32), counted this many times: the stage's
# output, the ELU and residual convs' temporaries alive together.
MIMI_STAGE_COPIES = 4
# Beside the codebooks' tables (32 x 2048 x 256 float32: 64 MB published), the quantizer's
# lookups and distances of the codebook it is on: measured 0.3% of the tables for a 1 s
# reference and 3-frame decode at the published size (issue 35: 0.997x without it); a
# sixteenth of the tables covers them.
TABLE_MARGIN = 16
# Prompt tokens of the chat template besides the turns' texts and the context audio's frames (a
# typical request, `typical_phases`): begin of text, each turn's speaker id and end, the audio
# begin and end tokens; rounded up.
PROMPT_OVERHEAD = 12


class _Context(threading.local):
    """The context codes of the `generate` running in this thread (None: upstream's own path)."""

    codes: list[torch.Tensor] | None = None


class CsmEngine(Engine):
    """CSM in three phases: voice prompt, talker, decoder (M1)."""

    id = "csm"
    title = "CSM"
    REQUIREMENTS = "csm"
    UPSTREAM = "transformers"
    PUBLISHED = "published"
    PHASED = True
    VOICES_PER_PASS = 2
    # The talker (backbone and depth decoder) is where the bytes are; the Mimi codec keeps its
    # weights as published (issue 36).
    WEIGHTS = {"generate": SmallWeights(("talker",))}
    sample_rate = SAMPLE_RATE

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        """A CSM folder (transformers layout); None otherwise. No named speakers (speaker ids
        are roles in a conversation) and no language to choose (it reads the text as written)."""
        try:
            check_layout(folder)
        except CheckpointError:
            return None
        return CheckpointInfo("CSM", [], ["auto"])

    def __init__(self, manager: Any, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> None:
        super().__init__(manager, model_dir, dtype, device)
        if self.model_dir is None:
            raise CheckpointError("csm needs a checkpoint folder (the sesame/csm-1b layout)")
        parts = load_model(self.model_dir, dtype)
        self.model, self.codec, self.processor = parts.model, parts.codec, parts.processor
        self.depth_defaults = self.model.depth_decoder.generation_config.to_dict()
        self._context = _Context()
        upstream_merge = self.model._merge_input_ids_with_input_values

        def merge(input_ids: torch.Tensor, input_values: torch.Tensor | None = None,
                  input_values_cutoffs: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> Any:
            codes = self._context.codes
            if codes is None:
                return upstream_merge(input_ids, input_values, input_values_cutoffs, labels)
            return {"inputs_embeds": self.embed(input_ids, codes), "labels": labels}

        self.model._merge_input_ids_with_input_values = merge
        self.talker = self.register(self.model, "talker", kind="sequence")
        self.talker.mark(self.model.depth_decoder, "hot")
        self.mimi_encoder = self.register(self.codec.encoder, "mimi_encoder")
        self.quantizer = self.register(self.codec.quantizer, "quantizer")
        self.mimi_decoder = self.register(self.codec.decoder, "mimi_decoder")

    def handles(self) -> list[Any]:
        return [self.mimi_encoder, self.quantizer, self.talker, self.mimi_decoder]

    @contextmanager
    def _fresh_codebooks(self) -> Iterator[None]:
        """Mimi caches each codebook's ``embed_sum / cluster_usage`` on first use and never drops
        it: after a phase it would pin a device copy and go stale when the quantizer moves or
        streams. Dropped after every phase that uses the codebooks."""
        try:
            yield
        finally:
            for module in self.codec.quantizer.modules():
                if getattr(module, "_embed", None) is not None:
                    module._embed = None

    # ---- voice prompt ----------------------------------------------------------------------
    def encode_voice(self, ctx: RequestContext, reference: Audio | None, transcript: str | None,
                     speaker: str | None, instruct: str | None = None) -> dict[str, Any]:
        if speaker or instruct:
            raise MizuotoError("csm has no named speakers or voice descriptions: give a context recording (with "
                               "its transcript), or neither for a voice of CSM's own")
        if reference is None:
            return {"codes": None, "transcript": None}
        if not (transcript or "").strip():
            raise MizuotoError("csm: give the reference audio's transcript (CSM takes it as a context turn)")
        wav = reference.mono_at(SAMPLE_RATE)
        codes = ctx.run("voice prompt", [self.mimi_encoder, self.quantizer], lambda: self._encode(wav),
                        self.mimi_encoder_memory(wav.shape[-1]))
        return {"codes": codes, "transcript": transcript.strip()}

    @torch.inference_mode()
    def _encode(self, wav: torch.Tensor) -> torch.Tensor:
        """(frames, codebooks) codes of a 24 kHz recording, as CSM's model encodes its context."""
        values = self.processor.feature_extractor(wav.numpy(), sampling_rate=SAMPLE_RATE, return_tensors="pt")
        with self._fresh_codebooks():
            codes = self.codec.encode(values["input_values"].to(self.device)).audio_codes
        return codes.transpose(1, -1)[0].cpu()

    def mimi_encoder_memory(self, samples: int) -> int:
        """M45: Mimi's encoder working memory for `samples` 24 kHz samples (float32): its
        full-rate stage (the strided stages only shrink it), or, where more, the codebooks'
        tables the quantizer computes (every codebook's entries, float32)."""
        return max(self._mimi_stage(samples), self._codebook_tables() * (TABLE_MARGIN + 1) // TABLE_MARGIN)

    def mimi_decoder_memory(self, frames: int) -> int:
        """M45: Mimi's decoder working memory for `frames` frames (float32): the codebooks'
        tables the quantizer computes, then its full-rate stage."""
        return self._codebook_tables() * (TABLE_MARGIN + 1) // TABLE_MARGIN + self._mimi_stage(frames * FRAME_SAMPLES)

    def _mimi_stage(self, samples: int) -> int:
        return 4 * MIMI_STAGE_COPIES * samples * self.codec.config.num_filters

    def _codebook_tables(self) -> int:
        config = self.codec.config
        return 4 * config.num_quantizers * config.codebook_size * config.codebook_dim

    # ---- talker ----------------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor, codes: list[torch.Tensor]) -> torch.Tensor:
        """The backbone's input: text embeddings, each context turn's codes embedded at its
        audio tokens, the audio-EOS frame at each audio-EOS token (where and as
        `CsmForConditionalGeneration._merge_input_ids_with_input_values` puts them)."""
        model, config = self.model, self.model.config
        embeds = model.embed_text_tokens(input_ids)
        if codes:
            frames = torch.cat(codes).to(input_ids.device)
            embeds[input_ids == config.audio_token_id] = model.backbone_model.embed_tokens(frames[None])[0]
            eos_frame = torch.full((1, 1, config.num_codebooks), config.codebook_eos_token_id, dtype=torch.long,
                                   device=input_ids.device)
            eos = input_ids == config.audio_eos_token_id
            embeds[eos] = model.backbone_model.embed_tokens(eos_frame).squeeze(1).repeat(int(eos.sum()), 1)
        return embeds

    def conversation(self, context: Sequence[tuple[int, str, torch.Tensor | None]], turn: Turn
                     ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
        """The inputs of one `generate`: the turns before it (speaker, text, codes or None) and
        the turn to speak, rendered by the processor's chat template and tokenized as the
        processor does, each context audio token repeated for its frames; and those codes."""
        messages: list[dict[str, Any]] = []
        codes: list[torch.Tensor] = []
        for speaker, text, turn_codes in context:
            content: list[dict[str, Any]] = [{"type": "text", "text": text}]
            if turn_codes is not None:
                content.append({"type": "audio"})
                codes.append(turn_codes)
            messages.append({"role": str(speaker), "content": content})
        messages.append({"role": str(turn.voice), "content": [{"type": "text", "text": turn.text.strip()}]})
        proc = self.processor
        text = proc.apply_chat_template(messages, tokenize=False)
        pieces = text.split(proc.audio_token)
        text = pieces[0] + "".join(proc.audio_token * c.shape[0] + rest for c, rest in zip(codes, pieces[1:]))
        encoded = proc.tokenizer([text], padding=True, padding_side="left", add_special_tokens=False,
                                 return_tensors="pt")
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}, codes

    def _settings(self, sampling: Sampling) -> dict[str, Any]:
        """The request's sampling for the backbone, its subtalker settings (else the checkpoint's)
        for the depth decoder. Every depth-decoder setting is passed each time: `generate`
        writes them into the model's shared depth-decoder config, where one request's would
        otherwise stay for the next. CSM has no repetition penalty in its recipe and takes none."""
        depth = self.depth_defaults

        def pick(ours: object, key: str) -> object:
            return depth.get(key) if ours is None else ours

        return {
            "do_sample": sampling.do_sample, "temperature": sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p, "max_new_tokens": sampling.max_new_tokens,
            "depth_decoder_do_sample": pick(sampling.subtalker_do_sample, "do_sample"),
            "depth_decoder_temperature": pick(sampling.subtalker_temperature, "temperature"),
            "depth_decoder_top_k": pick(sampling.subtalker_top_k, "top_k"),
            "depth_decoder_top_p": pick(sampling.subtalker_top_p, "top_p"),
        }

    def frames_for(self, text: str, sampling: Sampling) -> int:
        """M46: the frames estimated for `text` (bytes), capped by max_new_tokens."""
        return max(1, min(FRAMES_PER_TEXT_BYTE * len(text.encode("utf-8")), sampling.max_new_tokens))

    def talker_memory(self, prompt: int, frames: int, context_frames: int) -> int:
        """M45/M46: the talker phase's working memory, from the request: the backbone's KV cache
        over the prompt and the frames, the depth decoder's over one frame, and the prefill:
        every layer's hidden states over the prompt (`generate` keeps them) and the larger of
        one layer's activations (the gated MLP's three intermediate-wide tensors among them) and
        attention scores, and the context codes' embeddings (one per codebook before their sum)."""
        config, depth = self.model.config, self.model.config.depth_decoder_config
        elem = element_size(self.dtype)
        kv = peak_bytes(2 * config.num_key_value_heads * config.head_dim * elem, config.num_hidden_layers,
                        prompt + frames)
        depth_kv = peak_bytes(2 * depth.num_key_value_heads * depth.head_dim * elem, depth.num_hidden_layers,
                              config.num_codebooks + 1)
        hidden = (config.num_hidden_layers + 1) * prompt * config.hidden_size * elem
        layer = prompt * elem * (LAYER_COPIES * config.hidden_size + 3 * config.intermediate_size
                                 + config.num_attention_heads * prompt)
        context = context_frames * config.num_codebooks * config.hidden_size * elem
        return kv + depth_kv + hidden + max(layer, context)

    def generate(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling) -> Codes:
        return self._talk(ctx, [Turn(0, text)], [voice], sampling)

    def generate_dialogue(self, ctx: RequestContext, turns: Sequence[Turn], voices: Sequence[Voice],
                          sampling: Sampling) -> Codes:
        return self._talk(ctx, turns, voices, sampling)

    def _talk(self, ctx: RequestContext, turns: Sequence[Turn], voices: Sequence[Voice], sampling: Sampling) -> Codes:
        # The turns and voices are checked already (`base.check_dialogue`).
        context = [(i, v.data["transcript"], v.data["codes"]) for i, v in enumerate(voices)
                   if v.data.get("codes") is not None]
        settings = self._settings(sampling)
        context_frames = sum(int(c.shape[0]) for _, _, c in context)
        frames = [self.frames_for(t.text, sampling) for t in turns]
        # The last turn's prompt is the longest: the first's, every earlier turn's text and frames.
        first = int(self.conversation(context, turns[0])[0]["input_ids"].shape[-1])
        earlier = sum(len(t.text.encode("utf-8")) + f for t, f in zip(turns[:-1], frames[:-1]))
        memory = self.talker_memory(first + earlier, frames[-1], context_frames + sum(frames[:-1]))
        total = len(turns) * sampling.max_new_tokens

        @torch.inference_mode()
        def talk() -> list[torch.Tensor]:
            spoken: list[tuple[int, str, torch.Tensor | None]] = list(context)
            said: list[torch.Tensor] = []
            with self.progress_per_call(ctx, self.model.backbone_model, total):
                for k, turn in enumerate(turns):
                    inputs, codes = self.conversation(spoken, turn)
                    placed = {key: value.to(self.device) for key, value in inputs.items()}
                    self._context.codes = [c.to(self.device) for c in codes]
                    try:
                        with self.seeded(chunk_seed(sampling.seed, k)):
                            out = self.model.generate(**placed, **settings)[0].cpu()
                    finally:
                        self._context.codes = None
                    out = out[:self.utterance_end(out)]
                    said.append(out)
                    spoken.append((turn.voice, turn.text.strip(), out))
            return said

        said = ctx.run("talker", [self.talker], talk, memory)
        ctx.progress(total, total)
        return Codes(torch.cat(said), self.id, {"turns": [int(s.shape[0]) for s in said]})

    def utterance_end(self, frames: torch.Tensor) -> int:
        """Where an utterance ends: its first all-EOS frame (upstream's `output_audio` cut)."""
        ends = (frames == self.model.config.codebook_eos_token_id).all(dim=-1).nonzero()
        return int(ends.min()) if ends.numel() else int(frames.shape[0])

    def typical_phases(self, seconds: float) -> list[PhaseEstimate]:
        """One turn in a voice cloned from a 10 s reference with its transcript (a context
        turn: its text and its frames), the frames as `frames_for` estimates them from the
        text's bytes; the decoder with the frames of `seconds`, at most max_new_tokens."""
        samples = int(TYPICAL_REFERENCE_SECONDS * SAMPLE_RATE)
        context = math.ceil(samples / FRAME_SAMPLES)
        spoken = "a" * round(seconds * TYPICAL_CHARS_PER_SECOND)  # English: a byte a character
        sampling = Sampling()
        prompt = PROMPT_OVERHEAD + typical_tokens(TYPICAL_REFERENCE_SECONDS) + context + typical_tokens(seconds)
        decoded = min(math.ceil(seconds * SAMPLE_RATE / FRAME_SAMPLES), sampling.max_new_tokens)
        return [PhaseEstimate("voice prompt", (self.mimi_encoder, self.quantizer), self.mimi_encoder_memory(samples)),
                PhaseEstimate("talker", (self.talker,),
                              self.talker_memory(prompt, self.frames_for(spoken, sampling), context)),
                PhaseEstimate("decoder", (self.quantizer, self.mimi_decoder), self.mimi_decoder_memory(decoded))]

    # ---- decoder ---------------------------------------------------------------------------
    def decode(self, ctx: RequestContext, codes: Codes, allow_fallback: bool | None = None) -> Audio:
        lengths: list[int] = codes.extra.get("turns") or [int(codes.tokens.shape[0])]
        pieces = [p for p in torch.split(codes.tokens, lengths) if p.shape[0] > 0]
        if not pieces:
            return Audio(torch.zeros(1, 0), self.sample_rate)  # EOS at once: nothing to decode

        @torch.inference_mode()
        def run() -> torch.Tensor:
            with self._fresh_codebooks():
                waves = [self.codec.decode(p.transpose(0, 1).unsqueeze(0).to(self.device)).audio_values[0, 0].cpu()
                         for p in pieces]
            return torch.cat(waves).float()

        # No fallback: Mimi's decoder carries transformer context across the utterance, so tiles
        # would change samples (M43). Each turn is decoded on its own, as upstream decodes it.
        longest = max(p.shape[0] for p in pieces)
        wav = ctx.run("decoder", [self.quantizer, self.mimi_decoder], run, self.mimi_decoder_memory(longest))
        return Audio(wav.unsqueeze(0), self.sample_rate)



