"""VoxCPM 2 (OpenBMB, ~2.4B parameters, 48 kHz) over the official `voxcpm` package's model
code, run in phases by the memory runtime.

Components and phases (M1), each a handle registered with the manager:

* ``voice prompt`` — ``vae_encoder``, the audio VAE's encoder (`oneshot`): the reference
  audio and, with a transcript, the same audio as a continuation prompt, become latent
  patches (the package's `build_prompt_cache`). Placed only when a voice is not cached (M4).
* ``generate`` — ``generator``, one `sequence` handle (M15, M20: one streamed copy, no
  prefetch) holding everything the patch loop runs: the text-semantic LM (``base_lm``, 28
  layers) and the residual acoustic LM (``residual_lm``, 8), both once per patch; the local
  encoder (once per patch); the local DiT (``feat_decoder``), which runs 9 times per patch
  (10 Euler steps, the first zero-initialised, CFG batched); and the small projections and stop
  head between them. The local DiT is marked `hot`: when the generator does not fit, it stays
  resident and LM layers stream, since each DiT byte streamed would cross the link 9 times per
  patch and each LM or encoder byte once. The local encoder is not hot: its bytes are used once
  per patch, like an LM layer's, so keeping it cuts nothing. One handle rather than four: with
  the encoder and the DiT as `oneshot` handles of their own, the manager fills the smaller
  components first (M33) — the encoder before the DiT, whose layers are alike in size — and
  every handle reserves its own copy room (a `oneshot` one, `async_offload` + 1 copies).
  Measured by `bench/voxcpm2.py` on the tiny checkpoint: on a 14 MB simulated device this
  layout streams 18.2 MB per patch, the same handle without the hot mark (in the package's
  module order, DiT last) 45.2 MB; with four handles the phase's minimum working sets add up to
  18.8 MB (9.2 MB here), so below 22 MB it runs out of memory, and at 22 MB it streams 12.9 MB
  per patch against 10.5 MB.
* ``decoder`` — ``vae_decoder``, the audio VAE's decoder (`oneshot`), once per request. Its
  fallback after OOM (M42, M43) is `tiled_1d`, named in the output.

KV caches are working memory (M45, M46). The package preallocates both LMs' static caches for
8192 positions at construction (~300 MB in bf16 for the real model). Here they do not exist
outside a generate phase: the phase builds them (the package's own `setup_cache`) for the
positions the request can reach — its prompt plus the package's own cap on patches
(``min(6 × target tokens + 10, max_len)``) — rounded up to 64 positions, counts them in the
phase's working memory, and drops them when it ends. The attention masks every position past
the current one, so the size is invisible to the result: on the CPU the audio is identical to
the package's 8192-position run (tested; the 64-position rounding keeps every live position in
the kernels' vectorized lanes, which a smaller, unrounded size was measured not to). Not yet
verified on a GPU, whose kernels may sum rows of another length in another order.
`meta.memory.phases.generate` shows the positions and bytes reserved. For the real model (two KV
heads of 128 in bf16, 28 + 8 layers: 36 KB a position) that is 288 MB at 8192 positions and
9 MB for a 30-token sentence (prompt 31 + at most 190 patches, 256 positions).

Exactness (M40, M57). The package samples its flow noise from torch's global RNG: the generate
phase seeds it inside a `fork_rng`, so a retried phase and every placement draw the same
numbers. The runtime's hooks swap `param.data`; the package's code runs unchanged. Its one
generate call also decodes audio; here decoding is its own phase, so during generate the VAE's
`decode` records the latents instead (only for the calling thread) and the decoder phase
decodes them, trimming the continuation context as the package does.

Weight norm. The VAE uses the legacy `torch.nn.utils.weight_norm`, whose pre-hook computes
``weight`` from ``weight_g``/``weight_v`` before each forward and leaves it on the module:
after a phase every conv would keep a device copy of its weights, invisible to the runtime.
A forward hook of ours drops it after each forward (the next forward computes it again, so
nothing else changes). Weight norm's pre-hook runs before a streamed unit's own, so a unit may
not be a normed layer itself (its weights would not be there yet); in VoxCPM 2 the units are
whole blocks, and the engine checks it at load.

Loading (M27). The official folder layout (``config.json``, ``model.safetensors``,
``audiovae.pth`` or ``audiovae.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``),
from any path. The LMs', encoder's, DiT's and projections' parameters are created on `meta`,
converted to the run dtype there, then filled from the memory-mapped safetensors tensor by
tensor (`load_safetensors`, strict) — never a float32 copy of a half-precision model. Floating
buffers (the rotary tables) take the run dtype, as the package's ``model.to(dtype)`` gives them.
The VAE runs in float32, as the package runs it, so it is built in float32 and filled in place:
``audiovae.pth`` read with ``torch.load(weights_only=True, mmap=True)``, strictly.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import re
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...audio import Audio
from ...errors import CheckpointError, MizuotoError
from ...memory.handle import ModelHandle
from ...memory.phases import RequestContext
from ...memory.tiling import tiled_1d
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
    typical_tokens,
)
from .checkpoint import check_layout, drop_computed_weights, load_model, weight_norm_names

log = logging.getLogger(__name__)

# The package's defaults for a request (`VoxCPM.generate`).
CFG_VALUE = 2.0
INFERENCE_TIMESTEPS = 10
MIN_PATCHES = 2
RETRY_BADCASE_TIMES = 3
BADCASE_RATIO = 6.0  # patches per target text token; more is a bad case, and the loop's cap
# KV positions are reserved in blocks of this many (see the module docstring).
KV_BLOCK = 64
# Positions of the prompt besides text and prompt patches: the audio-start token, and the
# reference's start and end tokens.
PROMPT_OVERHEAD = 3
# The constants below were fitted to CPU peaks measured on the tiny checkpoint (see
# bench/voxcpm2.py), rounded up; on CUDA the M47 calibration corrects them further.
# Live activations of the prefill, per position, in units of the LM's hidden size (hidden
# states, embeddings, residuals, the FSQ and fusion projections, both LMs).
PREFILL_HIDDEN_COPIES = 9
# Live activations of one VAE decoder stage (the input kept for the residual, Snake's
# temporaries, the conv output), in units of the stage's output.
DECODER_STAGE_COPIES = 6
# The VAE encoder's full-rate stage, in units of its first width per 16 kHz sample; plus the
# 16 kHz waveform and the resampler's buffers per input sample.
ENCODER_STAGE_COPIES = 6
ENCODER_BYTES_PER_SAMPLE = 48
# At a strided conv: its input (the Snake's output before it, the causal padding's copy, one
# more) and its output (and one more), beside its computed weight (`_strided_conv`).
STRIDED_CONV_INPUTS = 3
STRIDED_CONV_OUTPUTS = 2


def _release_weight_norm(root: nn.Module) -> None:
    """After each forward, drop the weight that legacy weight norm computed for it (see the
    module docstring; the one computed at construction is dropped at load,
    `checkpoint.drop_computed_weights`)."""
    for module in root.modules():
        if weight_norm_names(module):
            module.register_forward_hook(lambda mod, _args, _out: drop_computed_weights(mod))


def _check_weight_norm_units(module: nn.Module, name: str) -> None:
    """A streamed unit's weights arrive in its forward pre-hook, which runs after the hooks
    registered before it: weight norm's, registered at construction, would compute from weights
    not yet there. So no unit may be a weight-normed layer itself (in VoxCPM 2 the units are
    whole blocks, the normed convs inside them)."""
    bad = [u.name for u in ModelHandle.units_of(module) if weight_norm_names(u.module)]
    if bad:
        raise MizuotoError(f"voxcpm2 {name}: units {', '.join(bad)} are weight-normed layers themselves; "
                           "their weights could not be streamed in before weight norm reads them")


class GeneratorModules(nn.Module):
    """What the generate phase runs, as one component. Submodules are the package's own
    (shared, not copied); the local DiT comes first, so among hot units it is placed first."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.feat_decoder = model.feat_decoder
        self.feat_encoder = model.feat_encoder
        self.base_lm = model.base_lm
        self.residual_lm = model.residual_lm
        for name in ("fsq_layer", "enc_to_lm_proj", "lm_to_dit_proj", "res_to_dit_proj", "fusion_concat_proj",
                     "stop_proj", "stop_head"):
            setattr(self, name, getattr(model, name))


@dataclasses.dataclass(frozen=True)
class GenerationPlan:
    """What a generate phase will do, from the request (M45): its prompt, its patches at most,
    and the KV positions each LM's cache gets."""

    prompt_positions: int
    patches: int
    kv_positions: int


def _strided_conv(channels_in: int, channels_out: int, rate: int, length_in: int, length_out: int) -> int:
    """Floats alive at one of the VAE's strided convs (kernel 2 x stride): its weight, which
    weight norm computes anew at each call (float32; at the published width the largest,
    1024 x 2048 x 16, is 128 MB: more than a short request's activations, issue 35), beside
    `STRIDED_CONV_INPUTS` copies of its input and `STRIDED_CONV_OUTPUTS` of its output."""
    return (channels_in * channels_out * 2 * rate + STRIDED_CONV_INPUTS * channels_in * length_in
            + STRIDED_CONV_OUTPUTS * channels_out * length_out)


def _element(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class VoxCPM2Engine(Engine):
    """VoxCPM 2: zero-shot (with an optional voice description), reference cloning, and
    reference + transcript continuation; 48 kHz output."""

    id = "voxcpm2"
    title = "VoxCPM 2"
    REQUIREMENTS = "voxcpm2"
    UPSTREAM = "voxcpm"
    PUBLISHED = "published"
    WEIGHTS = {
        "voice_prompt": SmallWeights(("vae_encoder",)),
        "generate": SmallWeights(("generator",)),
        "decode": SmallWeights(("vae_decoder",)),
    }

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        """An official VoxCPM 2 folder (its files, config.json's architecture); None otherwise,
        VoxCPM 1.x folders included. No built-in speakers, and no language setting (the model
        reads the language from the text): "auto" only."""
        try:
            check_layout(folder)
        except CheckpointError:
            return None
        return CheckpointInfo("VoxCPM2", [], ["auto"])

    def __init__(self, manager: Any, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> None:
        super().__init__(manager, model_dir, dtype, device)
        if self.model_dir is None:
            raise MizuotoError("voxcpm2 needs a checkpoint folder (the layout of openbmb/VoxCPM2)")
        self.model = load_model(self.model_dir, dtype, self.device)
        _release_weight_norm(self.model.audio_vae)
        _check_weight_norm_units(self.model.audio_vae.encoder, "vae_encoder")
        _check_weight_norm_units(self.model.audio_vae.decoder, "vae_decoder")
        self.sample_rate = int(self.model.sample_rate)
        self._lock = threading.Lock()  # the package keeps one KV cache per LM: one generate at a time
        self.vae_encoder = self.register(self.model.audio_vae.encoder, "vae_encoder")
        self.register_generate()
        self.vae_decoder = self.register(self.model.audio_vae.decoder, "vae_decoder")

    def register_generate(self) -> None:
        """The generate phase's component: one `sequence` handle, the local DiT hot (9 runs per
        patch; see the module docstring). `bench/voxcpm2.py` measures other layouts."""
        self.generator = self.register(GeneratorModules(self.model), "generator", kind="sequence")
        self.generator.mark(self.model.feat_decoder, "hot")

    def generate_handles(self) -> list[Any]:
        return [self.generator]

    def handles(self) -> list[Any]:
        return [self.vae_encoder, *self.generate_handles(), self.vae_decoder]

    # ---- voice prompt ----------------------------------------------------------------------
    def encode_voice(self, ctx: RequestContext, reference: Audio | None, transcript: str | None,
                     speaker: str | None, instruct: str | None = None) -> dict[str, Any]:
        """Zero-shot without a reference; a reference alone is cloned in isolation (the
        package's reference mode); with its transcript it is also the continuation prompt
        (reference + continuation, the package's strongest cloning). `instruct` describes the
        voice or style, as the package's parenthesized prefix to the text."""
        if speaker:
            raise MizuotoError("voxcpm2 has no built-in speakers; give reference audio or an instruct description")
        if reference is None:
            if transcript:
                raise MizuotoError("voxcpm2: a transcript needs the reference audio it transcribes")
            return {"prompt": None, "instruct": instruct or None}
        samples = math.ceil(reference.waveform.shape[-1] * self.model._encode_sample_rate / reference.sample_rate)
        # With a transcript the audio is encoded twice, one after the other: one encode's memory.
        prompt = ctx.run("voice prompt", [self.vae_encoder], lambda: self._prompt_cache(reference, transcript),
                         self.voice_prompt_memory(reference.waveform.shape[-1], samples))
        return {"prompt": prompt, "instruct": instruct or None}

    def _prompt_cache(self, reference: Audio, transcript: str | None) -> dict[str, Any]:
        """The package's `build_prompt_cache`, which reads audio files: the reference goes
        through a float WAV, which reads back exactly."""
        import soundfile

        with tempfile.TemporaryDirectory(prefix="mizuoto-voxcpm2-") as tmp:
            path = str(Path(tmp) / "reference.wav")
            soundfile.write(path, reference.waveform.float().t().numpy(), reference.sample_rate, subtype="FLOAT")
            try:
                return self.model.build_prompt_cache(
                    prompt_text=transcript or None, prompt_wav_path=path if transcript else None,
                    reference_wav_path=path,
                )
            except ValueError as exc:
                raise MizuotoError(f"voxcpm2 voice prompt: {exc}") from exc

    def voice_prompt_memory(self, input_samples: int, samples: int) -> int:
        """M45: the voice-prompt phase's working memory, from the reference's length (`samples`
        at the VAE's 16 kHz): the encoder's full-rate stage (float32), which later stages only
        shrink, or its widest strided conv (`_strided_conv`), plus the waveform and the
        resampler's buffers."""
        vae = self.model.audio_vae
        channels, length, conv = vae.encoder_dim, samples, 0
        for rate in vae.encoder_rates:  # each block doubles the channels as it downsamples
            shorter = math.ceil(length / rate)
            conv = max(conv, _strided_conv(channels, 2 * channels, rate, length, shorter))
            channels, length = 2 * channels, shorter
        stage = ENCODER_STAGE_COPIES * vae.encoder_dim * samples
        return 4 * max(stage, conv) + ENCODER_BYTES_PER_SAMPLE * max(input_samples, samples)

    # ---- generate --------------------------------------------------------------------------
    def target_text(self, text: str, voice: Voice) -> str:
        """The text as the package's `VoxCPM.generate` passes it on (one line, single spaces),
        after the voice's description in parentheses, the package's voice-design syntax."""
        text = re.sub(r"\s+", " ", text.replace("\n", " "))  # not empty: `generate` checked it
        instruct = voice.data.get("instruct")
        return f"({instruct}){text}" if instruct else text

    def _tokens(self, text: str) -> int:
        return len(self.model.text_tokenizer(text))

    def plan(self, target: str, prompt: dict[str, Any] | None, max_patches: int) -> GenerationPlan:
        """M45/M46: positions and patches from the request. The prompt holds the text (with the
        continuation transcript before it), the audio-start token, the reference patches with
        their two marks, and the continuation patches; the loop stops at the package's cap."""
        mode = prompt.get("mode") if prompt else None
        continued = mode in ("continuation", "ref_continuation")
        text = (prompt or {}).get("prompt_text", "") + target if continued else target
        positions = self._tokens(text) + PROMPT_OVERHEAD
        for key in ("ref_audio_feat", "audio_feat"):
            if prompt and key in prompt:
                positions += int(prompt[key].shape[0])
        patches = max(1, min(int(self._tokens(target) * BADCASE_RATIO + 10), max_patches))
        kv = math.ceil((positions + patches) / KV_BLOCK) * KV_BLOCK
        return GenerationPlan(positions, patches, kv)

    def kv_cache_bytes(self, plan: GenerationPlan) -> int:
        """Both LMs' static caches at the plan's positions, in the precision they compute in."""
        return sum(self._position_bytes(lm) * lm.config.num_hidden_layers * plan.kv_positions
                   for lm in (self.model.base_lm, self.model.residual_lm))

    def _position_bytes(self, lm: nn.Module) -> int:
        """Keys and values of one position in one layer."""
        cfg = lm.config
        head_dim = cfg.kv_channels or cfg.hidden_size // cfg.num_attention_heads
        return 2 * cfg.num_key_value_heads * head_dim * _element(self.dtype)

    def generate_memory(self, plan: GenerationPlan) -> dict[str, int]:
        """M45/M46: the generate phase's working memory, by part: the static KV caches; the
        prefill's per-layer keys and values (kept by the package until the loop ends:
        `peak_bytes` of a cache grown to the prompt); the prefill's activations (both LMs'
        hidden states and MLPs, attention scores, the local encoder over every prompt patch);
        and one patch of the local DiT (CFG doubles its batch)."""
        m, elem = self.model, _element(self.dtype)
        t = plan.prompt_positions
        prefill_kv = sum(peak_bytes(self._position_bytes(lm), lm.config.num_hidden_layers, t, "dynamic")
                         for lm in (m.base_lm, m.residual_lm))
        lm = m.config.lm_config
        tokens = m.patch_size + 1  # the encoder reads a patch and its special token
        enc, dit = m.feat_encoder.config, m.feat_decoder.estimator.config
        activations = elem * t * (PREFILL_HIDDEN_COPIES * lm.hidden_size + 3 * lm.intermediate_size
                                  + lm.num_attention_heads * t)
        activations += elem * t * tokens * (4 * enc.hidden_size + 3 * enc.intermediate_size
                                            + enc.num_attention_heads * tokens)
        dit_tokens = 2 * (2 * m.patch_size + 2)
        activations += elem * 2 * dit_tokens * (4 * dit.hidden_size + 3 * dit.intermediate_size)
        return {"kv_cache": self.kv_cache_bytes(plan), "prefill_kv": prefill_kv, "activations": activations}

    def generate(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling) -> Codes:
        target = self.target_text(text, voice)
        prompt = voice.data.get("prompt")
        plan = self.plan(target, prompt, sampling.max_new_tokens)
        parts = self.generate_memory(plan)
        ctx.report.add_phase("generate", kv_positions=plan.kv_positions, patches_at_most=plan.patches,
                             **{f"{k}_mb": round(v / 2**20, 2) for k, v in parts.items()})
        log.info("voxcpm2 generate: KV caches for %d positions (prompt %d + at most %d patches): %.2f MB "
                 "reserved, working memory %.2f MB in all", plan.kv_positions, plan.prompt_positions, plan.patches,
                 parts["kv_cache"] / 2**20, sum(parts.values()) / 2**20)
        model = self.model

        def run() -> tuple[torch.Tensor, int]:
            with self._lock, self.seeded(sampling.seed), self._kv_caches(plan), \
                    self._progress(ctx, plan.patches), self._deferred_decode() as latents:
                try:
                    _wav, _tokens, generated = model.generate_with_prompt_cache(
                        target_text=target, prompt_cache=prompt, min_len=MIN_PATCHES, max_len=sampling.max_new_tokens,
                        inference_timesteps=INFERENCE_TIMESTEPS, cfg_value=CFG_VALUE, retry_badcase=True,
                        retry_badcase_max_times=RETRY_BADCASE_TIMES, retry_badcase_ratio_threshold=BADCASE_RATIO,
                    )
                except ValueError as exc:
                    raise MizuotoError(f"voxcpm2 generate: {exc}") from exc
            latent = latents[-1]
            return latent.cpu(), latent.shape[-1] // model.patch_size - int(generated.shape[0])

        latent, context = ctx.run("generate", self.generate_handles(), run, sum(parts.values()))
        ctx.progress(plan.patches, plan.patches)
        return Codes(latent, self.id, {"context_patches": context})

    @contextlib.contextmanager
    def _kv_caches(self, plan: GenerationPlan) -> Iterator[None]:
        """Both LMs' static caches at the request's size (the package's `setup_cache`), only
        for the phase: its working memory, freed when it ends or fails."""
        lms = (self.model.base_lm, self.model.residual_lm)
        try:
            for lm in lms:
                lm.setup_cache(1, plan.kv_positions, self.device, self.dtype)
            yield
        finally:
            for lm in lms:
                lm.kv_cache = None

    @contextlib.contextmanager
    def _deferred_decode(self) -> Iterator[list[torch.Tensor]]:
        """While the package's generate call runs on this thread, its VAE `decode` records the
        latents and returns no audio: decoding is the decoder phase's (M1)."""
        vae, thread = self.model.audio_vae, threading.get_ident()
        original = vae.decode
        latents: list[torch.Tensor] = []

        def record(z: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if threading.get_ident() != thread:
                return original(z, *args, **kwargs)
            latents.append(z)
            return z.new_zeros(z.shape[0], 1, 0)

        vae.decode = record
        try:
            yield latents
        finally:
            del vae.decode  # the class's method again

    @contextlib.contextmanager
    def _progress(self, ctx: RequestContext, total: int) -> Iterator[None]:
        """Progress and interrupt once per patch: the local encoder runs once for the prompt,
        then once per patch. The hook reports only this request's thread."""
        steps = iter(range(total + 1))
        thread = threading.get_ident()

        def pre(_module: nn.Module, _args: Any) -> None:
            if threading.get_ident() == thread:
                ctx.progress(next(steps, total), total)

        hook = self.model.feat_encoder.register_forward_pre_hook(pre)
        try:
            yield
        finally:
            hook.remove()

    def typical_phases(self, seconds: float) -> list[PhaseEstimate]:
        """A 10 s reference with its transcript (the package's reference + continuation: the
        reference's patches are in the prompt twice), the text's patches at the loop's cap."""
        sample_rate = self.model._encode_sample_rate
        frame_rate = sample_rate / math.prod(self.model.audio_vae.encoder_rates)  # latent frames a second
        ref_patches = math.ceil(TYPICAL_REFERENCE_SECONDS * frame_rate / self.model.patch_size)
        positions = typical_tokens(TYPICAL_REFERENCE_SECONDS + seconds) + PROMPT_OVERHEAD + 2 * ref_patches
        patches = int(typical_tokens(seconds) * BADCASE_RATIO + 10)
        plan = GenerationPlan(positions, patches, math.ceil((positions + patches) / KV_BLOCK) * KV_BLOCK)
        samples = int(TYPICAL_REFERENCE_SECONDS * sample_rate)
        return [PhaseEstimate("voice prompt", (self.vae_encoder,), self.voice_prompt_memory(samples, samples)),
                PhaseEstimate("generate", tuple(self.generate_handles()), sum(self.generate_memory(plan).values())),
                PhaseEstimate("decoder", (self.vae_decoder,), self.decoder_memory(math.ceil(seconds * frame_rate)))]

    # ---- decoder ---------------------------------------------------------------------------
    def decoder_memory(self, frames: int) -> int:
        """M45: the VAE decoder's working memory for `frames` latent frames (float32): its widest
        upsampling stage or its widest strided conv (`_strided_conv`), plus the waveform."""
        vae = self.model.audio_vae
        length, channels = frames, vae.decoder_dim
        widest, conv = channels * length, 0
        for rate in vae.decoder_rates:  # each block halves the channels as it upsamples
            conv = max(conv, _strided_conv(channels, channels // 2, rate, length, length * rate))
            channels //= 2
            length *= rate
            widest = max(widest, channels * length)
        return 4 * (max(DECODER_STAGE_COPIES * widest, conv) + 2 * length)

    def decode(self, ctx: RequestContext, codes: Codes, allow_fallback: bool | None = None) -> Audio:
        latent = codes.tokens
        if latent.dim() != 3 or latent.shape[1] != self.model.audio_vae.latent_dim:
            raise MizuotoError(f"voxcpm2 decode: expected latents [1, {self.model.audio_vae.latent_dim}, frames], "
                               f"got shape {tuple(latent.shape)}")
        vae = self.model.audio_vae
        skip = self.model.patch_size * self.model._decode_chunk_size * int(codes.extra.get("context_patches", 0))

        @torch.inference_mode()
        def run(decode: Any) -> torch.Tensor:
            wav = decode(latent.to(self.device, torch.float32))
            return wav[..., skip:].squeeze(1)[0].cpu()

        wav = ctx.run("decoder", [self.vae_decoder], lambda: run(vae.decode), self.decoder_memory(latent.shape[-1]),
                      fallback=("tiled_1d", lambda: run(lambda z: tiled_1d(vae.decode, z))),
                      allow_fallback=allow_fallback)
        return Audio(wav, self.sample_rate)
