"""Chatterbox (Resemble AI, MIT) over the `chatterbox-tts` package's modules, run in phases by
the memory runtime (issue 34). Chatterbox (English) is the ``ResembleAI/chatterbox`` folder;
Chatterbox Multilingual (23 languages) its ``t3_mtl23ls_v2.safetensors`` in that folder, run as
upstream's ``ChatterboxMultilingualTTS`` runs it (its tokenizer, language token and punctuation
cleanup; T3's alignment analyzer, which upstream's ``T3.inference`` attaches itself).

Components and phases (M1), each a handle registered with the manager:

* ``voice prompt`` — ``s3_tokenizer`` (S3Gen's S3 speech tokenizer), ``speaker_encoder``
  (S3Gen's CAM++) and ``voice_encoder`` (T3's speaker embedding), `oneshot`: the reference's
  conditionals as upstream's ``prepare_conditionals`` computes them (`conditioning`). Cached
  per reference (M4); the emotion exaggeration (a voice option) is only T3's ``emotion_adv``
  scalar, set on the cached voice without encoding again. No reference: the folder's built-in
  voice (``conds.pt``, read with ``weights_only=True``).
* ``talker`` — T3 (a Llama backbone with its embeddings, heads and conditioning encoder),
  `sequence` with the Llama layers as units: upstream's own ``T3.inference`` loop, which runs
  the classifier-free guidance's conditional and unconditional rows as one batch of 2, so each
  streamed layer is copied once per token for both (M18, M20). Its KV cache grows with the
  positions (M46: conditioning, text and speech tokens, both rows).
* ``decoder`` — ``flow`` (S3Gen's token-to-mel flow: conformer encoder and CFM estimator, 10
  Euler steps with CFG as one batch of 2) and ``vocoder`` (HiFT), `oneshot`; then upstream's
  fade-in and its audio watermark.

Watermark: every output carries upstream's default, Resemble AI's Perth implicit watermark
(``perth.PerthImplicitWatermarker`` applied to the waveform, as ``ChatterboxTTS.generate``
does). It is not a memory mechanism: it runs on the CPU after the decoder, on the decoder's
output alone, so it is the same under every placement (tested).

Exactness (M40, M57): upstream samples T3's tokens and draws the flow's and HiFT's noise from
torch's global RNG in one stream; the talker runs inside a `fork_rng` seeded with the request's
seed and hands its generator state to the decoder, which continues the stream, so the phases
equal one ``generate`` call with that seed.
"""
from __future__ import annotations

import contextlib
import functools
import io
import logging
import math
from pathlib import Path
from typing import Any

import torch

from ...audio import Audio
from ...errors import ArgumentError, CheckpointError, MizuotoError
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
from .checkpoint import CONDS_FILE, HEAD_DIM, MULTILINGUAL_FILES, MULTILINGUAL_T3, check_layout, load, split_choice
from .conditioning import DEC_COND_SECONDS, at_24k, conditionals

log = logging.getLogger(__name__)

DEFAULT_EXAGGERATION = 0.5  # upstream's generate()
CFG_WEIGHT = 0.5
MIN_P = 0.05
MAX_SPEECH_TOKENS = 1000  # upstream's generate() caps T3 at 1000 tokens (40 s)
SPEECH_VOCAB = 6561  # S3 speech tokens; T3's others (start, stop, padding) are dropped
TOKENS_PER_TEXT_TOKEN = 8  # M46: speech tokens (25 Hz) a text token plans for, capped by the above
FLOW_STEPS = 10
MEL_PER_TOKEN = 2  # S3Gen's mels are 50 Hz, its tokens 25 Hz
# Fitted to CPU peaks (bench/engines.py --peaks: 1 and 3 s references, 24 and 48 tokens) to land
# 1.0-1.3x above them (M45); on CUDA the M47 calibration corrects them further.
# Per reference sample (24 kHz): resampling, the three encoders' front ends (mels, fbanks). The
# phase's peak is mostly there: nearly the same with the tiny S3 tokenizer (128 wide) and the
# published one (1280 wide, 6 layers), whose activations show at a short reference only (issue
# 35): one copy of its width over the 100 Hz mel frames.
ENCODER_BYTES_PER_SAMPLE = 140
TOKENIZER_COPIES = 1
CONDITIONING_POSITIONS = 34  # T3's speaker (1), perceiver (32) and emotion (1) positions
# A step's logits of one position, float32: both CFG rows, their mix, the repetition penalty,
# temperature, min-p and top-p warpers, and the probabilities.
STEP_LOGIT_COPIES = 8
# The prefill's gated MLP: two intermediate-wide tensors live at once, both CFG rows (issue 35: at
# the published width, 4096, without them a short request estimated 0.95x; three counted put the
# tiny checkpoint's, 8x its width, at 1.35x).
MLP_COPIES = 2
# The flow's peak is its conformer encoder's (512 wide, 8 heads: the same in every checkpoint),
# per mel frame in copies of its width and of its attention scores (relative-position attention
# keeps both score matrices and their shift); the estimator, run after it, peaks lower: per mel
# frame, both CFG rows, copies of its inner width and of its 320 input channels. Measured at the
# tiny and the published sizes alike (issue 35: the published estimator, 512 wide inside with 8
# heads, added to the encoder counted 2.6x the peak).
FLOW_ENCODER_COPIES = 14
SCORE_COPIES = 8
ESTIMATOR_COPIES = 6
ESTIMATOR_INPUT = 320
# HiFT per output sample: the harmonic source, its STFT and the last stages, and its stages'
# activations, which scale with its base width (5/8 byte per channel: 64 and 512 wide measured).
HIFT_BYTES_PER_SAMPLE = 210
# A short request's HiFT peak is a weight: each call recomputes its weight-normed convs' weights
# (the first upsampling conv's, 8 MB at the published width), this much activation beside it.
HIFT_WEIGHT_SHARE = 8

def multilingual_languages() -> list[str]:
    """The language codes of Chatterbox Multilingual (upstream's SUPPORTED_LANGUAGES), read from
    its module's source without importing the package (listing checkpoints must stay light)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("chatterbox")
    if spec is None or not spec.submodule_search_locations:
        return []
    source = Path(list(spec.submodule_search_locations)[0]) / "mtl_tts.py"
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SUPPORTED_LANGUAGES" for t in node.targets):
            return sorted(ast.literal_eval(node.value))
    return []


class ChatterboxEngine(Engine):
    """Chatterbox in three phases: voice prompt, talker (T3), decoder (S3Gen flow + HiFT) (M1)."""

    id = "chatterbox"
    title = "Chatterbox"
    REQUIREMENTS = "chatterbox"
    UPSTREAM = "chatterbox"
    VERSIONS = ("english", "multilingual")
    PUBLISHED = "published"
    VOICE_OPTIONS = ("exaggeration",)
    # T3 (the Llama talker) is where the bytes are; the S3Gen flow and HiFT vocoder keep their
    # weights as published (issue 36).
    WEIGHTS = {"generate": SmallWeights(("talker",))}
    sample_rate = 24000

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        """A ResembleAI/chatterbox folder (Chatterbox, English), or its multilingual T3 file
        (Chatterbox Multilingual: its language codes, "auto" first: no language token); None
        otherwise."""
        root, multilingual = split_choice(folder)
        try:
            check_layout(root, multilingual)
        except CheckpointError:
            return None
        if multilingual:
            return CheckpointInfo("Chatterbox Multilingual", [], ["auto", *multilingual_languages()])
        return CheckpointInfo("Chatterbox", [], ["en"])

    @classmethod
    def checkpoint_entries(cls, folder: Path) -> list[tuple[str, CheckpointInfo]]:
        """The folder as published offers both models: itself (English) and, where its
        multilingual files are there, its ``t3_mtl23ls_v2.safetensors`` (Multilingual)."""
        entries = super().checkpoint_entries(folder)
        if folder.is_dir() and all((folder / name).is_file() for name in MULTILINGUAL_FILES):
            info = cls.describe_checkpoint(folder / MULTILINGUAL_T3)
            entries += [(MULTILINGUAL_T3, info)] if info is not None else []
        return entries

    def __init__(self, manager: Any, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> None:
        super().__init__(manager, model_dir, dtype, device)
        if self.model_dir is None:
            raise CheckpointError("chatterbox needs a checkpoint folder (the files of ResembleAI/chatterbox)")
        folder, self.multilingual = split_choice(self.model_dir)
        self.models = load(folder, dtype, self.multilingual)
        m = self.models
        self.s3_tokenizer = self.register(m.s3gen.tokenizer, "s3_tokenizer")
        self.speaker_encoder = self.register(m.s3gen.speaker_encoder, "speaker_encoder")
        self.voice_encoder = self.register(m.ve, "voice_encoder")
        self.talker = self.register(m.t3, "talker", kind="sequence")
        self.flow = self.register(m.s3gen.flow, "flow")
        self.vocoder = self.register(m.s3gen.mel2wav, "vocoder")

    def handles(self) -> list[Any]:
        return [self.s3_tokenizer, self.speaker_encoder, self.voice_encoder, self.talker, self.flow, self.vocoder]

    @functools.cached_property
    def watermarker(self) -> Any:
        """Upstream's default watermark (Perth implicit), on the CPU as upstream builds it. Its
        loader prints a line on stdout (where the CLI writes its JSON): kept for the log."""
        import perth

        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            marker = perth.PerthImplicitWatermarker()
        log.debug("perth: %s", said.getvalue().strip())
        return marker

    # ---- voice prompt ----------------------------------------------------------------------
    def voice_prompt(self, ctx: RequestContext, reference: Audio | None = None, transcript: str | None = None,
                     speaker: str | None = None, instruct: str | None = None,
                     exaggeration: float = DEFAULT_EXAGGERATION) -> Voice:
        """The cached voice of `reference` (M4; no transcript is used) speaking with the emotion
        `exaggeration` (upstream's 0.5 by default; 0 is flat, higher more expressive)."""
        if instruct:
            raise ArgumentError("chatterbox takes no voice description (instruct): give a reference audio")
        if isinstance(exaggeration, bool) or not isinstance(exaggeration, (int, float)) \
                or not math.isfinite(exaggeration) or exaggeration < 0:
            raise ArgumentError(f"exaggeration must be a finite number >= 0, got {exaggeration!r}")
        voice = super().voice_prompt(ctx, reference, None, speaker)
        return Voice(f"{voice.key}:{float(exaggeration)!r}", {**voice.data, "exaggeration": float(exaggeration)},
                     self.id)

    def encode_voice(self, ctx: RequestContext, reference: Audio | None, transcript: str | None,
                     speaker: str | None, instruct: str | None = None) -> dict[str, Any]:
        if speaker:
            raise MizuotoError("chatterbox has no named speakers: give a reference audio, or none for the "
                               "checkpoint's built-in voice")
        if reference is None:
            if self.models.conds is None:
                raise MizuotoError(f"chatterbox: {self.model_dir} has no built-in voice ({CONDS_FILE}): "
                                   "give a reference audio")
            conds = self.models.conds
            return {"t3": {k: v for k, v in conds["t3"].items() if k != "emotion_adv"}, "gen": dict(conds["gen"])}
        wav = at_24k(reference.mono().numpy(), reference.sample_rate)
        m = self.models

        @torch.inference_mode()
        def encode() -> dict[str, Any]:
            return conditionals(m.t3, m.s3gen, m.ve, wav, self.device)

        return ctx.run("voice prompt", [self.s3_tokenizer, self.speaker_encoder, self.voice_encoder], encode,
                       self.voice_prompt_memory(wav.shape[-1]))

    def voice_prompt_memory(self, samples_24k: int) -> int:
        """M45: the reference's encoders (float32): per reference sample (the voice encoder reads
        it whole), and the S3 tokenizer's activations over its 100 Hz mel frames (of the first
        10 s at most)."""
        frames = min(samples_24k, DEC_COND_SECONDS * 24000) // 240 + 1
        tokenizer = 4 * TOKENIZER_COPIES * frames * self.models.sizes.tokenizer_width
        return ENCODER_BYTES_PER_SAMPLE * samples_24k + tokenizer

    # ---- talker ----------------------------------------------------------------------------
    def language_id(self, language: str | None) -> str | None:
        """The multilingual model's language code for `language` (a code or its English name;
        None or "auto": no language token, as upstream without one). The English model takes
        English only."""
        wanted = (language or "auto").strip().lower()
        if not self.multilingual:
            if wanted not in ("auto", "en", "english"):
                raise ArgumentError(f"chatterbox: this model speaks English only, got language {language!r} "
                                    "(Chatterbox Multilingual speaks others)")
            return None
        if wanted == "auto":
            return None
        from chatterbox.mtl_tts import SUPPORTED_LANGUAGES

        names = {name.lower(): code for code, name in SUPPORTED_LANGUAGES.items()}
        code = wanted if wanted in SUPPORTED_LANGUAGES else names.get(wanted)
        if code is None:
            raise ArgumentError(f"chatterbox: language {language!r} is not one Chatterbox Multilingual speaks "
                                f"({', '.join(SUPPORTED_LANGUAGES)})")
        return code

    def _text_tokens(self, text: str, language: str | None) -> torch.Tensor:
        if self.multilingual:  # mtl_tts's own punctuation cleanup and language token
            from chatterbox.mtl_tts import punc_norm

            tokens = self.models.tokenizer.text_to_tokens(punc_norm(text), language_id=self.language_id(language))
        else:
            from chatterbox.tts import punc_norm

            self.language_id(language)
            tokens = self.models.tokenizer.text_to_tokens(punc_norm(text))
        hp = self.models.t3.hp
        tokens = torch.cat([tokens, tokens], dim=0)  # the CFG rows
        tokens = torch.nn.functional.pad(tokens, (1, 0), value=hp.start_text_token)
        return torch.nn.functional.pad(tokens, (0, 1), value=hp.stop_text_token)

    def max_tokens(self, sampling: Sampling) -> int:
        return min(sampling.max_new_tokens, MAX_SPEECH_TOKENS)

    def talker_memory(self, text_tokens: int, speech_tokens: int) -> int:
        """M45/M46: T3's working memory, both CFG rows: the KV cache over the conditioning,
        text and speech positions (`text_tokens` with start and stop), and what upstream's loop
        asks of the prefill: the speech logits of every prompt position and every layer's hidden
        states (it runs with output_hidden_states); with the multilingual model also every
        layer's attention weights, and one layer's scores besides while it computes (its
        alignment analyzer switches the Llama to eager attention; SDPA returns none); and the
        last layer's MLP intermediates beside them. Then each step's float32 copies of one
        position's logits (`STEP_LOGIT_COPIES`)."""
        t3 = self.models.t3
        cfg = t3.cfg
        elem = element_size(self.dtype)
        prompt = CONDITIONING_POSITIONS + text_tokens + 1  # and the start-of-speech token
        kv = peak_bytes(2 * cfg.num_key_value_heads * cfg.head_dim * elem, cfg.num_hidden_layers,
                        prompt + speech_tokens, "dynamic", 2)
        logits = 2 * prompt * t3.hp.speech_tokens_dict_size * elem
        hidden = (cfg.num_hidden_layers + 1) * 2 * prompt * cfg.hidden_size * elem
        attention = (cfg.num_hidden_layers + 1) * 2 * cfg.num_attention_heads * prompt * prompt * elem
        mlp = MLP_COPIES * 2 * prompt * cfg.intermediate_size * elem
        step = STEP_LOGIT_COPIES * t3.hp.speech_tokens_dict_size * 4
        return kv + logits + hidden + mlp + step + (attention if self.multilingual else 0)

    def generate(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling) -> Codes:
        from chatterbox.models.t3.modules.cond_enc import T3Cond

        data = voice.data
        tokens = self._text_tokens(text, sampling.language)
        limit = self.max_tokens(sampling)
        plan = min(limit, TOKENS_PER_TEXT_TOKEN * tokens.shape[-1])
        t3 = self.models.t3

        @torch.inference_mode()
        def talk() -> tuple[torch.Tensor, torch.Tensor]:
            # In T3's precision: upstream casts the conditionals to its device only (bfloat16 fails there).
            cond = T3Cond(**data["t3"], emotion_adv=data["exaggeration"] * torch.ones(1, 1, 1)).to(
                device=self.device, dtype=self.dtype)
            with self.progress_per_call(ctx, t3.tfmr, limit + 1), self.seeded(sampling.seed):
                speech = t3.inference(t3_cond=cond, text_tokens=tokens.to(self.device), max_new_tokens=limit,
                                      temperature=sampling.temperature, cfg_weight=CFG_WEIGHT,
                                      repetition_penalty=sampling.repetition_penalty, min_p=MIN_P,
                                      top_p=sampling.top_p)
                return speech[0].cpu(), self.rng_state().clone()

        speech, state = ctx.run("talker", [self.talker], talk, self.talker_memory(tokens.shape[-1], plan))
        from chatterbox.models.s3tokenizer import drop_invalid_tokens

        # Upstream's: the tokens between start and stop of speech, then only speech tokens (the
        # multilingual generate omits the second filter, a no-op unless T3 proposes a padding
        # token, which its flow could not embed).
        speech = drop_invalid_tokens(speech)
        speech = speech[speech < SPEECH_VOCAB]
        return Codes(speech, self.id, {"gen": data["gen"], "rng_state": state})

    def typical_phases(self, seconds: float) -> list[PhaseEstimate]:
        """A clone of a 10 s reference (its first 10 s are the flow's prompt tokens, 25 a
        second), the line's text tokens with start and stop, T3's tokens as `generate` plans
        them (capped at 1000: 40 s a line; a script is spoken line by line); the flow and the
        vocoder over the speech of `seconds`, within that cap."""
        samples = int(TYPICAL_REFERENCE_SECONDS * 24000)
        text_tokens = typical_tokens(seconds) + 2
        limit = self.max_tokens(Sampling())
        speech = min(limit, math.ceil(seconds * 25))
        prompt = DEC_COND_SECONDS * 25
        return [PhaseEstimate("voice prompt", (self.s3_tokenizer, self.speaker_encoder, self.voice_encoder),
                              self.voice_prompt_memory(samples)),
                PhaseEstimate("talker", (self.talker,),
                              self.talker_memory(text_tokens, min(limit, TOKENS_PER_TEXT_TOKEN * text_tokens))),
                PhaseEstimate("flow", (self.flow,), self.flow_memory(prompt + speech)),
                PhaseEstimate("vocoder", (self.vocoder,), self.vocoder_memory(MEL_PER_TOKEN * speech))]

    # ---- decoder ---------------------------------------------------------------------------
    def flow_memory(self, tokens: int) -> int:
        """M45: the flow's working memory (float32) for `tokens` speech tokens (the reference's
        and the new ones), over 2 mel frames per token: the larger of the conformer encoder's
        (512 wide, 8 heads; its attention scores grow with the square of the frames) and the
        estimator's (2 CFG rows), which run one after the other."""
        sizes = self.models.sizes
        frames = MEL_PER_TOKEN * tokens
        encoder = 4 * frames * 512 * FLOW_ENCODER_COPIES + 4 * (512 // HEAD_DIM) * frames * frames * SCORE_COPIES
        inner = max(sizes.estimator_channels, HEAD_DIM * sizes.estimator_heads)
        estimator = 4 * 2 * frames * (ESTIMATOR_COPIES * inner + 2 * ESTIMATOR_INPUT)
        return max(encoder, estimator)

    def vocoder_memory(self, frames: int) -> int:
        """M45: HiFT's working memory for `frames` mel frames (480 samples each at 24 kHz): per
        sample, its source and STFT and its stages, which scale with its base width; at least
        its largest weight-normed weight, which every call recomputes (a short request's peak)."""
        per_sample = HIFT_BYTES_PER_SAMPLE + self.models.sizes.hift_channels * 5 // 8
        weight = self.hift_weight_bytes
        return max(weight, per_sample * frames * 480) + weight // HIFT_WEIGHT_SHARE

    @functools.cached_property
    def hift_weight_bytes(self) -> int:
        """HiFT's largest weight-normed weight, float32 (the shapes are read: meta builds too)."""
        vocoder = self.models.s3gen.mel2wav
        return max((4 * m.parametrizations.weight.original1.numel() for m in vocoder.modules()
                    if hasattr(m, "parametrizations") and "weight" in m.parametrizations), default=0)

    def decode(self, ctx: RequestContext, codes: Codes, allow_fallback: bool | None = None) -> Audio:
        from chatterbox.models.s3gen.const import S3GEN_SR

        s3gen = self.models.s3gen
        gen: dict[str, Any] = codes.extra["gen"]
        prompt = int(gen["prompt_token"].shape[-1])
        tokens = codes.tokens

        @torch.inference_mode()
        def flow() -> torch.Tensor:
            # As S3Token2Mel.forward with a ref_dict: every tensor to the flow's device and dtype.
            ref = {k: v.to(device=self.device, dtype=s3gen.dtype) if torch.is_tensor(v) else v for k, v in gen.items()}
            speech = torch.atleast_2d(tokens).to(self.device)
            lengths = torch.LongTensor([speech.size(-1)]).to(self.device)
            with self.progress_per_call(ctx, s3gen.flow.decoder.estimator, FLOW_STEPS), self.seeded(0):
                self.set_rng_state(codes.extra["rng_state"])
                mels, _ = s3gen.flow.inference(token=speech, token_len=lengths, finalize=True, noised_mels=None,
                                               n_timesteps=FLOW_STEPS, meanflow=s3gen.meanflow, **ref)
                return mels.to(dtype=s3gen.dtype), self.rng_state().clone()

        mels, state = ctx.run("flow", [self.flow], flow, self.flow_memory(prompt + tokens.shape[-1]))

        @torch.inference_mode()
        def vocode() -> torch.Tensor:
            with self.seeded(0):
                self.set_rng_state(state)
                cache = torch.zeros(1, 1, 0).to(device=self.device, dtype=s3gen.dtype)
                wav, _ = s3gen.mel2wav.inference(speech_feat=mels.to(self.device), cache_source=cache)
            fade = s3gen.trim_fade.to(wav.device)
            wav[:, :len(fade)] *= fade  # upstream's fade-in against the reference's spillover
            return wav.squeeze(0).float().cpu()

        wav = ctx.run("vocoder", [self.vocoder], vocode, self.vocoder_memory(mels.shape[-1]))
        marked = self.watermarker.apply_watermark(wav.numpy(), sample_rate=S3GEN_SR)
        return Audio(torch.from_numpy(marked).unsqueeze(0), self.sample_rate)
