"""VibeVoice (1.5B, 7B; the transformers ``-hf`` layouts) over transformers' own VibeVoice classes,
run in phases by the memory runtime (issue 34). Its noise scheduler is diffusers', as upstream
builds it from ``generation_config.json`` (diffusers is imported by transformers, lazily).

Components and phases (M1), each a handle registered with the manager:

* ``voice prompt`` — ``acoustic_encoder`` (the acoustic tokenizer's σ-VAE encoder), `oneshot`:
  each reference (24 kHz, the processor's own loudness normalization and padding to the hop)
  becomes its encoder latents, one per 3200 samples. Cached per reference (M4), noise-free:
  upstream adds the σ-VAE noise inside ``generate``, drawn from the request's seed, so the
  talker phase draws it there too. The semantic tokenizer encodes no reference: upstream runs
  it only on the speech it generates.
* ``talker`` — ``talker`` (the Qwen2 LM with its head, the acoustic and semantic connectors and
  the diffusion head), `sequence`: the LM's decoder layers are its units, in run order (M15).
  Each frame upstream's ``generate`` runs the LM for the prompt's branch and again for CFG's
  negative branch (its own short KV cache), then the diffusion head ``num_diffusion_steps``
  times, and feeds the frame's audio back through the semantic encoder. So this phase also
  places ``acoustic_decoder`` and ``semantic_encoder`` (both `oneshot`): the acoustic decoder
  decodes each latent as it is made (streaming, with its convolution caches), because the
  next LM step reads the semantic encoding of that audio.

  The diffusion head is part of the ``talker`` handle, marked `hot` (M15), not a handle of its
  own: it runs ``num_diffusion_steps`` (10) times per frame against the LM layers' once per
  branch, so when not everything fits it stays resident before any LM layer does, and one
  placement decision covers the whole per-frame loop. Its layers are still units (it is not
  in the fixed part): the 7B's head is about 1.2 GB in bfloat16, which would otherwise be
  part of the talker's minimum working set. CFG's two halves share one copy of each head
  unit (M18): upstream runs them as one batch of two rows through the head, so each head
  layer runs once per diffusion step for both. The LM's two branches are not batched
  upstream (the negative branch has its own short cache and runs after the token is chosen),
  so a streamed LM layer is copied once per branch per frame; a loop of our own running both
  branches through each layer in turn would halve that (not done: upstream's loop runs).
* ``decoder`` — the audio the talker phase decoded, frame by frame as upstream does, is the
  result: `decode` places nothing (decoding the latents again, in one pass, would repeat the
  acoustic decoder's work; the talker phase needs each frame's audio anyway).

Exactness (M40, M57). The σ-VAE noise and the diffusion noise come from torch's global RNG; the
talker phase runs inside `seeded` (a `fork_rng` seeded with the request's seed), drawing them in
upstream's order: the same audio as ``processor.apply_chat_template(...)`` then
``model.generate(...)`` after ``torch.manual_seed(seed)``, sample for sample (tested on the tiny
checkpoints, one voice and a dialogue). Token choice is an argmax (upstream ignores do_sample),
so of the request's settings only the seed and ``max_new_tokens`` apply.

Dialogue (issue 34). Up to `VOICES_PER_PASS` = 4 voices in one pass: the turns become the
conversation the processor's chat template takes (role ``N`` renders ``Speaker N:``), a voice's
reference with its first turn, as the model card's examples do.

Loading (M27). Built on meta in the engine's dtype and filled from the memory-mapped shards
(`checkpoint.load_model`); the processor from its JSON and template files; nothing executed.
"""
from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...audio import Audio
from ...errors import CheckpointError, MizuotoError
from ...memory.phases import RequestContext
from ...nn.kv_cache import peak_bytes
from ...nn.loading import reading_weights
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
from .checkpoint import check_layout, load_model, load_processor
from .published import label_of

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
# M46: speech frames (7.5 Hz) estimated per text token (Qwen2's tokens are ~4 characters, speech
# ~15 characters a second: ~2 frames a token), doubled for pauses and slow voices; capped by
# max_new_tokens.
FRAMES_PER_TEXT_TOKEN = 4
# The constants below were fitted to CPU peaks measured on the tiny checkpoint (bench/engines.py
# --peaks: 1 and 3 s references, 6 and 24 frames) to land 1.0-1.3x above them (M45); on CUDA the
# M47 calibration corrects them further.
# The prefill's live activations per prompt position (measured: ~21 KB on the tiny LM, nearly all the
# phase's peak): hidden-wide tensors (the prompt's embeddings and their audio-filled copy, the
# residual, the norm, the attention output) and the gated MLP's intermediate-wide ones (gate, up,
# their product, the activation).
LM_HIDDEN_COPIES = 6
LM_INTERMEDIATE_COPIES = 4
# Measured at full size in bfloat16 (bench/full_size.py: VibeVoice-1.5B, prompts of 268-660
# positions, the peak 0.91-0.93x the estimate without these): the RMSNorms compute in float32
# whatever the run precision (the upcast input and its square, hidden-wide), and the last
# position's logits over the 152k-token vocabulary are float32 (the head's output and the
# processed copy generate samples from).
LM_FLOAT32_HIDDEN_COPIES = 2
LOGIT_FLOAT32_COPIES = 2
# A ConvNeXt stage's live tensors per channel and sample besides its feed-forward expansion: its
# input (kept for the residual), the norm and its transposes, the depthwise conv.
CONVNEXT_COPIES = 9
# Prompt tokens of the chat template besides the script's text and the references' latents (a
# typical request, `typical_phases`): the system line, "Voice input:", a speaker's voice line
# with its audio begin and end, "Text input:", "Speaker 0:", "Speech output:"; rounded up.
PROMPT_OVERHEAD = 48


class VibeVoiceEngine(Engine):
    """VibeVoice in phases: voice prompt, talker (M1); dialogues of up to four voices."""

    id = "vibevoice"
    title = "VibeVoice"
    REQUIREMENTS = "vibevoice"
    UPSTREAM = "diffusers"  # transformers' VibeVoice builds its noise scheduler from diffusers
    VERSIONS = ("1.5b", "7b")
    PUBLISHED = "published"
    PHASED = True
    VOICES_PER_PASS = 4
    # fp8 / int8 storage for the talker (the LM, its connectors and the diffusion head: where 7B's
    # bytes are); the acoustic and semantic tokenizers stay as published.
    WEIGHTS = {"generate": SmallWeights(("talker",))}
    sample_rate = SAMPLE_RATE
    # Diffusion steps per frame; None: the checkpoint's generation config (upstream's 10).
    # Tests and benches set fewer.
    steps: int | None = None

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        """A VibeVoice ``-hf`` folder, named by the published size its LM matches; None otherwise.
        No built-in speakers (it clones references) and no language setting."""
        try:
            config = check_layout(folder)
        except CheckpointError:
            return None
        return CheckpointInfo(label_of(config))

    def __init__(self, manager: Any, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> None:
        super().__init__(manager, model_dir, dtype, device)
        if self.model_dir is None:
            raise CheckpointError("vibevoice needs a checkpoint folder (vibevoice/VibeVoice-1.5B-hf or -7B-hf)")
        self.model = load_model(self.model_dir, dtype)
        # A shapes-only build (engines.published) reads no tokenizer: it cannot run a request.
        self.processor = load_processor(self.model_dir) if reading_weights() else None
        inner = self.model.model
        for tokenizer in (inner.audio_tower.encoder, inner.audio_tower.decoder, inner.semantic_tokenizer_encoder):
            name_block_units(tokenizer)
        self.acoustic_encoder = self.register(inner.audio_tower.encoder, "acoustic_encoder")
        self.talker = self.register(talker_modules(self.model), "talker", kind="sequence")
        self.talker.mark(inner.diffusion_head, "hot")
        self.acoustic_decoder = self.register(inner.audio_tower.decoder, "acoustic_decoder")
        self.semantic_encoder = self.register(inner.semantic_tokenizer_encoder, "semantic_encoder")

    def handles(self) -> list[Any]:
        return [self.acoustic_encoder, self.talker, self.acoustic_decoder, self.semantic_encoder]

    @property
    def hop(self) -> int:
        return int(self.model.config.audio_config.hop_length)

    # ---- voice prompt ----------------------------------------------------------------------
    def encode_voice(self, ctx: RequestContext, reference: Audio | None, transcript: str | None,
                     speaker: str | None, instruct: str | None = None) -> dict[str, Any]:
        if speaker or instruct:
            raise MizuotoError("vibevoice clones a reference voice: it has no built-in speakers and takes no "
                               "instruct")
        if reference is None:
            return {"latents": None}  # the model's own voice: the speaker gets no voice line
        wav = reference.mono()
        if reference.sample_rate != SAMPLE_RATE:
            import torchaudio

            wav = torchaudio.functional.resample(wav, reference.sample_rate, SAMPLE_RATE)
        features = self.processor.feature_extractor(wav.numpy(), sampling_rate=SAMPLE_RATE, return_tensors="pt")
        values = features["input_values"]
        frames = math.ceil(int(features["padding_mask"].sum()) / self.hop)

        @torch.inference_mode()
        def encode() -> torch.Tensor:
            encoder = self.model.model.audio_tower.encoder
            latents = encoder(values.to(self.device, self.dtype)).latents
            return latents[0, :frames].cpu()

        latents = ctx.run("voice prompt", [self.acoustic_encoder], encode, self.voice_prompt_memory(values.shape[-1]))
        return {"latents": latents}

    def voice_prompt_memory(self, samples: int) -> int:
        """M45: the acoustic encoder's working memory for `samples` (padded, 24 kHz): each stage
        halves or more the length as it doubles the channels, so every early stage holds about
        filters x samples values, counted for a ConvNeXt block's live tensors; and the input."""
        config = self.model.config.audio_config
        widest = samples * config.num_filters * (config.ffn_expansion + CONVNEXT_COPIES)
        return element_size(self.dtype) * widest + 8 * samples

    # ---- talker ----------------------------------------------------------------------------
    def generate(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling) -> Codes:
        return self.generate_dialogue(ctx, [Turn(0, text)], [voice], sampling)

    def conversation(self, turns: Sequence[Turn], voices: Sequence[Voice]) -> tuple[list[dict[str, Any]],
                                                                                     list[torch.Tensor]]:
        """The chat-template conversation of `turns` (role ``N`` for ``voices[N]``, a voice's
        reference with its first turn) and the references' latents in the order they appear."""
        messages: list[dict[str, Any]] = []
        latents: list[torch.Tensor] = []
        seen: set[int] = set()
        for turn in turns:
            content: list[dict[str, Any]] = []
            reference = voices[turn.voice].data.get("latents")
            if turn.voice not in seen and reference is not None:
                content.append({"type": "audio", "path": f"voice {turn.voice}"})  # a placeholder: not loaded
                latents.append(reference)
            seen.add(turn.voice)
            content.append({"type": "text", "text": turn.text})
            messages.append({"role": str(turn.voice), "content": content})
        return messages, latents

    def prompt_ids(self, messages: list[dict[str, Any]], latents: Sequence[torch.Tensor]) -> torch.Tensor:
        """(1, positions) token ids, as the processor makes them: the rendered chat template with
        each audio placeholder repeated once per latent of its reference."""
        processor = self.processor
        try:
            text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except (TypeError, ValueError) as exc:
            raise MizuotoError(f"vibevoice: the checkpoint's chat template failed ({exc})") from exc
        replacements = [processor.audio_token * int(x.shape[0]) for x in latents]
        expanded, _ = processor.get_text_with_replacements([text], audio_replacements=replacements)
        ids: torch.Tensor = processor.tokenizer(expanded, return_tensors="pt")["input_ids"]
        return ids

    def prompt_embeds(self, ids: torch.Tensor, latents: Sequence[torch.Tensor]) -> torch.Tensor:
        """The prompt's input embeddings with the references' acoustic features in place, as
        upstream's prefill makes them (`get_audio_features`): the σ-VAE noise drawn over the
        references padded to the longest, each row's noise scale first, from the RNG now."""
        inner = self.model.model
        embeds = inner.get_input_embeddings()(ids)
        if not latents:
            return embeds
        longest = max(int(x.shape[0]) for x in latents)
        # (rows, channels, frames) seen as (rows, frames, channels), as the encoder's output is:
        # `randn_like` fills memory in this order, so the noise lands where upstream's does.
        batch = torch.zeros(len(latents), latents[0].shape[-1], longest, dtype=latents[0].dtype,
                            device=self.device).permute(0, 2, 1)
        for row, x in enumerate(latents):
            batch[row, : x.shape[0]] = x
        std = self.model.config.audio_config.vae_std * torch.randn(len(latents), device=batch.device, dtype=batch.dtype)
        batch = batch + std[:, None, None] * torch.randn_like(batch)
        features = (batch + inner.latent_bias_factor) * inner.latent_scaling_factor
        lengths = torch.tensor([int(x.shape[0]) for x in latents])
        valid = (torch.arange(longest)[None] < lengths[:, None])
        audio_embeds = inner.multi_modal_projector(features)[valid.to(self.device)]
        mask = (ids == self.model.config.audio_token_id).unsqueeze(-1).expand_as(embeds)
        return embeds.masked_scatter(mask, audio_embeds.to(embeds.dtype))

    def frames_for(self, text_tokens: int, sampling: Sampling) -> int:
        """M46: 4 frames per text token, capped by max_new_tokens."""
        return max(1, min(FRAMES_PER_TEXT_TOKEN * text_tokens, sampling.max_new_tokens))

    def talker_memory(self, prompt: int, frames: int) -> int:
        """M45/M46: the talker phase's working memory, from the request: the last position's
        logits, and the larger of the prefill (one Qwen2 layer's activations over the prompt,
        and one head's attention scores) and the generation — the prompt branch's KV cache over prompt and frames and
        the negative branch's over the frames, both dynamic (M46), with one frame's acoustic
        decoding and semantic encoding (`frame_memory`)."""
        tc = self.model.config.text_config
        elem = element_size(self.dtype)
        head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        position = 2 * tc.num_key_value_heads * head_dim * elem
        caches = (peak_bytes(position, tc.num_hidden_layers, prompt + frames)
                  + peak_bytes(position, tc.num_hidden_layers, frames + 1))
        layer = prompt * (elem * (LM_HIDDEN_COPIES * tc.hidden_size + LM_INTERMEDIATE_COPIES * tc.intermediate_size)
                          + 4 * LM_FLOAT32_HIDDEN_COPIES * tc.hidden_size)
        scores = prompt * prompt * 4
        logits = 4 * LOGIT_FLOAT32_COPIES * tc.vocab_size
        return max(layer + scores, caches + self.frame_memory()) + logits

    def frame_memory(self) -> int:
        """One frame's acoustic decoding and semantic encoding: the widest ConvNeXt stage of each
        over the frame's hop of samples (filters x samples at full rate)."""
        elem = element_size(self.dtype)
        acoustic = self.model.config.audio_config
        semantic = self.model.config.semantic_model_config
        return sum(elem * self.hop * c.num_filters * (c.ffn_expansion + CONVNEXT_COPIES) for c in (acoustic, semantic))

    def generate_dialogue(self, ctx: RequestContext, turns: Sequence[Turn], voices: Sequence[Voice],
                          sampling: Sampling) -> Codes:
        messages, latents = self.conversation(turns, voices)
        ids = self.prompt_ids(messages, latents)
        text_tokens = max(1, ids.shape[-1] - sum(int(x.shape[0]) for x in latents))
        total = sampling.max_new_tokens
        memory = self.talker_memory(ids.shape[-1], self.frames_for(text_tokens, sampling))
        options: dict[str, Any] = {"max_new_tokens": total}
        if self.steps is not None:
            options["num_diffusion_steps"] = self.steps

        @torch.inference_mode()
        def talk() -> torch.Tensor:
            with self.progress_per_call(ctx, self.model.model.semantic_tokenizer_encoder, total), \
                    self.seeded(sampling.seed):
                on_device = ids.to(self.device)
                embeds = self.prompt_embeds(on_device, [x.to(self.device) for x in latents])
                audio = self.model.generate(input_ids=on_device, attention_mask=torch.ones_like(on_device),
                                            inputs_embeds=embeds, **options)[0]
            if audio is None:  # it stopped before any speech
                return torch.zeros(0)
            return audio.reshape(-1).float().cpu()

        wav = ctx.run("talker", [self.talker, self.acoustic_decoder, self.semantic_encoder], talk, memory)
        ctx.progress(total, total)
        return Codes(wav, self.id)

    def typical_phases(self, seconds: float) -> list[PhaseEstimate]:
        """One voice cloned from a 10 s reference (its latents in the prompt), the text's frames
        as `frames_for` estimates them from the prompt's text tokens; the talker phase decodes
        as it goes (no decoder phase). Upstream runs the LM's two guidance branches one after
        the other, so a streamed LM layer is copied twice per frame."""
        samples = math.ceil(TYPICAL_REFERENCE_SECONDS * SAMPLE_RATE / self.hop) * self.hop
        latents = samples // self.hop
        text_tokens = PROMPT_OVERHEAD + typical_tokens(seconds)
        frames = self.frames_for(text_tokens, Sampling())
        return [PhaseEstimate("voice prompt", (self.acoustic_encoder,), self.voice_prompt_memory(samples)),
                PhaseEstimate("talker", (self.talker, self.acoustic_decoder, self.semantic_encoder),
                              self.talker_memory(text_tokens + latents, frames), forwards_per_step=2)]

    # ---- decoder ---------------------------------------------------------------------------
    def decode(self, ctx: RequestContext, codes: Codes, allow_fallback: bool | None = None) -> Audio:
        """The audio the talker phase decoded frame by frame (module docstring)."""
        return Audio(codes.tokens.reshape(1, -1).float(), self.sample_rate)


def block_units(tokenizer: nn.Module) -> list[nn.Module]:
    """An acoustic or semantic tokenizer's units, in run order: the stem's convolution, each
    stage's resampling convolution, every ConvNeXt block, the head. By default (M12) the units
    would be the stages, the outermost list's children: the last stage of the published
    tokenizers (2048 channels, 8 blocks) would be one unit of 600 MB in bfloat16, all of it in
    the minimum working set; a block is at most 67 MB."""
    units: list[nn.Module] = []
    for stage in (tokenizer.stem, *tokenizer.conv_layers):
        units.append(stage.conv if hasattr(stage, "conv") else stage.convtr)
        units.extend(stage.stage)
    units.append(tokenizer.head)
    return units


def name_block_units(tokenizer: nn.Module) -> None:
    """Make `block_units` the tokenizer's units (M12: a module's ``memory_units()``)."""
    tokenizer.memory_units = functools.partial(block_units, tokenizer)


def talker_modules(model: nn.Module) -> nn.Module:
    """What the talker phase runs besides the acoustic decoder and semantic encoder, as one
    module: the LM (its layers the units), its head, the connectors, the diffusion head and
    the latent scale and bias (the model's own parameters, held here so the phase places them)."""
    inner = model.model
    scales = nn.Module()
    scales.register_parameter("latent_scaling_factor", inner.latent_scaling_factor)
    scales.register_parameter("latent_bias_factor", inner.latent_bias_factor)
    return nn.ModuleDict({
        "scales": scales, "language_model": inner.language_model, "lm_head": model.lm_head,
        "multi_modal_projector": inner.multi_modal_projector, "semantic_connector": inner.semantic_connector,
        "diffusion_head": inner.diffusion_head,
    })
