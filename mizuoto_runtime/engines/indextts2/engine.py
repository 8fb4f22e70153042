"""IndexTTS-2 (bilibili) in our own model code, run in phases by the memory runtime.

Components (M1), each a handle:
* voice prompt — ``w2v_bert`` (w2v-BERT 2.0, 17 layers), ``semantic_codec`` (its encoder and
  quantizer), ``campplus`` (CAM++), ``conditioning`` (the GPT's speaker and emotion encoders);
  placed once per reference voice and cached (M4): a second request with the same voice places
  none of them. w2v-BERT reads the reference twice, as upstream: resampled from 22.05 kHz for the
  voice, and loaded at 16 kHz for its own emotion. An emotion reference audio is prompted the
  same way (w2v-BERT + conditioning), cached too (the last `EMOTIONS_KEPT` audios).
* talker — ``talker``, a `sequence` handle whose units are the GPT-2 blocks (M11; transformers'
  `Conv1D` leaves, declared streamable, M13). Beam search runs the beams as rows of one batch,
  so each streamed unit is copied once per step whatever the beam count (M18). The phase also
  runs the full GPT forward for the latents and draws the flow's noise right after the codes,
  so the random draws come in upstream's order. With float16 / bfloat16 the GPT (all of
  UnifiedVoice) is in that dtype and its phases run under autocast, as upstream's use_fp16;
  the rest stays float32.
* flow — ``flow``, s2mel (`oneshot`): the CFG halves are one batch-2 estimator call per step,
  so they share each copy (M18).
* emotion text — ``emotion_text``, the checkpoint's Qwen3 emotion model (`sequence`, float16 as
  upstream loads it), placed only when a request gives the emotion as text (`instruct`, or the
  spoken text); it samples from the request's seed and the decoding continues that random stream,
  as upstream's; cached per text and seed (the last `EMOTIONS_KEPT`). Its answer is cut at
  `emotion_text.MAX_ANSWER_TOKENS` (upstream: 32768), and its KV cache estimated at that.
* vocoder — ``vocoder``, BigVGAN v2 (`oneshot`). No `tiled_1d` fallback: it does not tile
  exactly with the runtime's tiles (256 mel frames, 32 crossfaded): never torch.equal; measured
  on a 700-frame mel, the tiles differ from the whole decode by up to 7.8e-1 of full scale inside
  the crossfades and 2.8e-4 outside them on the tiny checkpoint (4.2e-2 and 9e-6 on the fixture's
  BigVGAN), and overlaps of 64 or 128 frames still leave 1e-2 to 4e-1.

KV cache (M45, M46): estimated at 24 codes per text token, times the beams, capped by
`max_new_tokens`, plus the prompt.
"""
from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import torch

from ...audio import Audio
from ...errors import ArgumentError, CheckpointError, MizuotoError
from ...lru import LruCache
from ...nn.features import kaldi_fbank
from ...nn.loading import reading_weights
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
from . import pipeline
from .checkpoint import Layout, check_layout, load_bigvgan, load_campplus, load_codec, load_gpt, load_s2mel, load_tables
from .components import CodecEncoder, Conditioning, Flow, Talker
from .decoding import DecodeSettings
from .emotion import EMOTIONS, Emotion
from .emotion_text import EmotionModel, parse
from .text import GLOSSARY_FILE, MAX_SEGMENT_TOKENS, TextTokenizer
from .w2v import W2VBert

log = logging.getLogger(__name__)

SAMPLE_RATE = 22050
PROMPT_SECONDS = 15  # upstream cuts reference audio to 15 s
CODES_PER_TEXT_TOKEN = 24  # M46
NUM_BEAMS = 3
# Working-memory constants (M45), fitted on the tiny checkpoint's CPU peaks (`bench/engines.py
# --peaks`, 1.0-1.3x); each multiplies the dimension its term scales with.
CAMPPLUS_MAPS = 3  # CAM++'s front-end maps (channels x 80 bands) alive at once
SUBSAMPLING_COPIES = 2  # the conformers' 2-D front end: its conv output and ReLU's, then the ReLU's and the reshape
FLOW_HIDDEN_COPIES = 30  # the estimator's live activations per frame, in units of its hidden width
VOCODER_STAGE_COPIES = 12  # BigVGAN's AMP blocks: 2x-rate activations and their temporaries
SILENCE_MS = 200  # between segments, as upstream
# Emotion vectors of emotion audios, and emotion text's readings (text, seed): the most recently
# used kept, each about 5 KB (a 1280-wide vector; a CPU random state), so a session sweeping seeds
# or audios holds a few hundred KB at most, while repeating a recent request skips its phase.
EMOTIONS_KEPT = 64
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _mono(audio: Audio) -> torch.Tensor:
    return audio.waveform.float().mean(0, keepdim=True)


def load_rate(wav: torch.Tensor, rate: int, target: int) -> torch.Tensor:
    """What upstream's `librosa.load(path, sr=target)` makes of a file: librosa's soxr_hq resampler."""
    if rate == target:
        return wav
    import librosa

    return torch.from_numpy(librosa.resample(wav.numpy(), orig_sr=rate, target_sr=target, res_type="soxr_hq"))


def resample(wav: torch.Tensor, rate: int, target: int) -> torch.Tensor:
    """Upstream's `torchaudio.transforms.Resample(rate, target)` (22.05 kHz -> 16 kHz)."""
    import torchaudio

    return torchaudio.transforms.Resample(rate, target)(wav)  # its kernel is not functional.resample's to the bit


class IndexTTS2Engine(Engine):
    """IndexTTS-2: zero-shot cloning of a reference voice, with emotion from a second reference
    audio or an emotion vector; 22.05 kHz output."""

    id = "indextts2"
    title = "IndexTTS-2"
    REQUIREMENTS = "indextts2"
    REFERENCE = "reference"
    PUBLISHED = "published"
    sample_rate = SAMPLE_RATE
    VOICE_OPTIONS = ("emotion",)
    # The GPT talker is where the bytes are (issue 36); the prompt encoders, the s2mel flow and
    # BigVGAN (weight-normed) keep their weights as published.
    WEIGHTS = {"generate": SmallWeights(("talker",))}

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        try:
            check_layout(folder)
        except CheckpointError:
            return None
        return CheckpointInfo("IndexTTS-2", [], ["auto"])

    def __init__(self, manager: Any, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> None:
        super().__init__(manager, model_dir, dtype, device)
        if self.model_dir is None:
            raise MizuotoError("indextts2 needs a checkpoint folder (the layout of IndexTeam/IndexTTS-2)")
        if dtype not in DTYPES:
            raise MizuotoError(f"indextts2 runs its GPT in float32, float16 or bfloat16 (the rest in float32), "
                               f"not {dtype}")
        check_layout(self.model_dir)
        layout = Layout.open(self.model_dir)
        self.config = layout.config
        # A shapes-only build (engines.published) has the configs alone: no bpe.model to read.
        self.tokenizer = (TextTokenizer(self.model_dir / "bpe.model", self.model_dir / GLOSSARY_FILE)
                          if reading_weights() else None)
        self.tables = load_tables(layout)
        self.gpt = load_gpt(layout).to(dtype)  # all of UnifiedVoice, as upstream's use_fp16 halves it
        codec = load_codec(layout)
        self.s2mel = load_s2mel(layout)
        self.w2v = W2VBert(layout.aux("w2v_bert"), self.tables.w2v_mean, self.tables.w2v_std)
        self.emotions: LruCache[str, torch.Tensor] = LruCache(EMOTIONS_KEPT)
        self.text_emotions: LruCache[tuple[str, int], tuple[tuple[float, ...], torch.Tensor]] = LruCache(EMOTIONS_KEPT)
        self.emotion_dir = layout.qwen_emotion_dir
        self.emotion_model = (EmotionModel(self.emotion_dir)
                              if (self.emotion_dir / "config.json").is_file() else None)
        self.flow_module = Flow(self.s2mel, codec)  # copies the code embedding: before any handle holds it
        self.bigvgan = load_bigvgan(layout)
        self.w2v_bert = self.register(self.w2v, "w2v_bert")
        self.semantic_codec = self.register(CodecEncoder(codec), "semantic_codec")
        self.campplus = self.register(load_campplus(layout), "campplus")
        self.conditioning = self.register(Conditioning(self.gpt), "conditioning")
        self.talker = self.register(Talker(self.gpt), "talker", kind="sequence")
        self.flow = self.register(self.flow_module, "flow")
        self.vocoder = self.register(self.bigvgan, "vocoder")
        self.emotion_text = (self.register(self.emotion_model, "emotion_text", kind="sequence")
                             if self.emotion_model is not None else None)
        self.num_beams = NUM_BEAMS

    def handles(self) -> list[Any]:
        extra = [self.emotion_text] if self.emotion_text is not None else []
        return [self.w2v_bert, self.semantic_codec, self.campplus, self.conditioning, self.talker, self.flow,
                self.vocoder, *extra]

    # ---- voice prompt ----------------------------------------------------------------------
    def prompt_audio(self, reference: Audio) -> tuple[torch.Tensor, torch.Tensor]:
        """-> the reference at 22.05 kHz (as upstream loads it, cut to 15 s) and at 16 kHz (as upstream
        resamples that)."""
        wav = load_rate(_mono(reference), reference.sample_rate, SAMPLE_RATE)[:, :PROMPT_SECONDS * SAMPLE_RATE]
        if wav.shape[-1] < SAMPLE_RATE // 10:
            raise MizuotoError(f"indextts2: reference audio of {reference.seconds:.2f} s is too short (0.1 s at least)")
        return wav, resample(wav, SAMPLE_RATE, 16000)

    def features(self, wav_16k: torch.Tensor) -> torch.Tensor:
        feats, mask = self.w2v.inputs(wav_16k)
        return self.w2v(feats.to(self.device), mask.to(self.device))

    def encode_voice(self, ctx: Any, reference: Audio | None, transcript: str | None, speaker: str | None,
                     instruct: str | None = None) -> dict[str, Any]:
        if reference is None:
            raise MizuotoError("indextts2 clones a voice: give reference audio")
        if speaker:
            raise MizuotoError("indextts2 has no built-in speakers; give reference audio")
        wav_22k, wav_16k = self.prompt_audio(reference)
        own_16k = self.emotion_audio(reference)
        fbank = kaldi_fbank(wav_16k, num_mel_bins=80, sample_frequency=16000.0)
        handles = [self.w2v_bert, self.semantic_codec, self.campplus, self.conditioning]

        @torch.inference_mode()
        def run() -> dict[str, Any]:
            spk = self.features(wav_16k)
            _, quantized = self.semantic_codec.module.quantizer.quantizers[0].encode(
                self.semantic_codec.module.encoder(spk.transpose(1, 2)).transpose(1, 2))
            style = pipeline.speaker_style(self.campplus.module, fbank.to(self.device))
            lengths = pipeline.feature_lengths(spk)
            with self.gpt_autocast():
                base = self.gpt.emotion_vector(spk, lengths)
                spk_latent = self.gpt.speaker_latent(spk, lengths)
            # Without an emotion audio upstream takes the reference itself as one: loaded straight
            # at 16 kHz (not the 22.05 kHz copy resampled), so its features differ from `spk`.
            return {"spk_latent": spk_latent.cpu(), "base_emotion": base.cpu(),
                    "own_emotion": self.merged_emotion(base, own_16k, 1.0).cpu(),
                    "style": style.cpu(), "semantic": quantized.transpose(1, 2).cpu(),
                    "ref_mel": pipeline.reference_mel(wav_22k, self.config["s2mel"]).cpu()}

        return ctx.run("voice prompt", handles, run, self.voice_prompt_memory(wav_16k.shape[-1]))

    def voice_prompt_memory(self, samples_16k: int) -> int:
        """M45: the voice prompt's working memory, its big parts together (they run one after
        the other, but what each returns stays to the phase's end; the sum bounds that, measured
        1.15x): the larger of w2v-BERT (float32) over the prompt's frames (50 per second: the
        hidden state of every layer is kept, plus the attention scores and feed-forward of one
        layer and the 160-wide input features) and the conditioning conformers' 2-D front end
        (in the GPT's autocast dtype: a stride-2 conv over frames x w2v-BERT's width, its
        output channels x half of each, `SUBSAMPLING_COPIES` maps alive: 74 MB for a 3 s
        prompt at the published 512 channels x 1024 wide, nothing at the tiny width); and CAM++'s
        2-D front end over the fbank frames (100 per second: its channels x 80 bands,
        `CAMPPLUS_MAPS` maps alive at once)."""
        frames = samples_16k // 320 + 1
        cfg = self.w2v.model.config
        hidden = 4 * frames * cfg.hidden_size
        scores = 4 * cfg.num_attention_heads * frames * frames
        w2v = ((len(self.w2v.model.encoder.layers) + 8) * hidden + 2 * scores
               + 4 * frames * (cfg.intermediate_size + 160))
        gpt = self.gpt
        channels = max(e.embed.conv[0].out_channels for e in (gpt.conditioning_encoder, gpt.emo_conditioning_encoder))
        subsampling = (SUBSAMPLING_COPIES * element_size(self.dtype) * channels * ((frames - 1) // 2)
                       * ((cfg.hidden_size - 1) // 2))
        head = self.campplus.module.head
        campplus = 4 * CAMPPLUS_MAPS * head.conv1.out_channels * 80 * (samples_16k // 160 + 1)
        return max(w2v, subsampling) + campplus

    # ---- emotion ---------------------------------------------------------------------------
    @staticmethod
    def emotion_audio(audio: Audio) -> torch.Tensor:
        """An audio as upstream loads an emotion reference: at 16 kHz directly, cut to 15 s."""
        return load_rate(_mono(audio), audio.sample_rate, 16000)[:, :PROMPT_SECONDS * 16000]

    def merged_emotion(self, base: torch.Tensor, wav_16k: torch.Tensor, alpha: float) -> torch.Tensor:
        """merge_emovec: the voice's vector moved by `alpha` towards the emotion audio's."""
        emo = self.features(wav_16k)
        with self.gpt_autocast():
            return base + alpha * (self.gpt.emotion_vector(emo, pipeline.feature_lengths(emo)) - base)

    def gpt_autocast(self) -> torch.autocast:
        """Upstream's GPT phases with use_fp16: autocast to the GPT's dtype (off in float32)."""
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def voice_prompt(self, ctx: Any, reference: Audio | None = None, transcript: str | None = None,
                     speaker: str | None = None, instruct: str | None = None,
                     emotion: Emotion | None = None) -> Voice:
        """The cached voice (M4; `instruct` is not part of it), with `emotion` applied when given
        (see `with_emotion`); `instruct` is emotion text for the emotion model."""
        voice = super().voice_prompt(ctx, reference, transcript, speaker)
        if instruct:
            if emotion is not None:
                raise ArgumentError("indextts2: give the emotion as text (instruct) or as audio / weights, not both")
            emotion = Emotion(text=instruct, from_text=True)
        return voice if emotion is None else self.with_emotion(ctx, voice, emotion)

    def with_emotion(self, ctx: Any, voice: Voice, emotion: Emotion) -> Voice:
        """`voice` speaking with `emotion`. An emotion audio's vector is computed now (placing
        w2v-BERT and the conditioning encoders once per audio, then cached); weights, and text for
        the emotion model, are resolved by each request under its seed, as upstream draws them."""
        if emotion.by_weights:
            if emotion.vector is not None and not emotion.from_text:
                pipeline.check_weights(self.tables, emotion.vector)
            data = {**voice.data, "emotion": emotion}
        else:
            data = {**voice.data, "emotion_vector": self.emotion_vector(ctx, voice, emotion)}
        return Voice(f"{voice.key}+{emotion.key()}", data, self.id)

    def emotion_vector(self, ctx: Any, voice: Voice, emotion: Emotion | None) -> torch.Tensor:
        """The vector of an emotion audio (cached per voice and audio), or the voice's own."""
        if emotion is None or emotion.audio is None:
            return voice.data.get("emotion_vector", voice.data["own_emotion"])
        key = f"{voice.key}:{emotion.key()}"
        cached = self.emotions.get(key)
        if cached is None:
            wav, base = self.emotion_audio(emotion.audio), voice.data["base_emotion"]

            @torch.inference_mode()
            def run() -> torch.Tensor:
                return self.merged_emotion(base.to(self.device), wav, emotion.alpha).cpu()

            cached = ctx.run("voice prompt", [self.w2v_bert, self.conditioning], run,
                             self.voice_prompt_memory(wav.shape[-1]))
            self.emotions[key] = cached
        return cached

    def emotion_from_text(self, ctx: Any, text: str, seed: int) -> tuple[tuple[float, ...], torch.Tensor]:
        """The eight emotion weights the checkpoint's emotion model reads in `text`, and the RNG
        state after it: it samples as its folder's generation config says, from the request's
        seed, and upstream's decoding draws next from the same stream (cached per text and seed)."""
        if self.emotion_model is None:
            raise MizuotoError(f"indextts2: emotion from text needs the emotion model in "
                               f"{self.emotion_dir} (qwen0.6bemo4-merge/ of IndexTeam/IndexTTS-2)")
        cached = self.text_emotions.get((text, seed))
        if cached is None:
            model = self.emotion_model
            ids = model.prompt(text)

            @torch.inference_mode()
            def run() -> tuple[str, torch.Tensor]:
                with self.seeded(seed):
                    answer = model.answer(ids.to(self.device))
                    return answer, self.rng_state()

            positions = ids.shape[1] + model.max_answer_tokens
            ctx.report.add_phase("emotion text", kv_positions=positions,
                                 kv_cache_mb=round(model.kv_bytes(positions) / 2**20, 3))
            answer, state = ctx.run("emotion text", [self.emotion_text], run, model.kv_bytes(positions))
            cached = parse(answer, text), state
            self.text_emotions[(text, seed)] = cached
            log.info("indextts2: emotion of %r: %s", text, dict(zip(EMOTIONS, cached[0])))
        return cached

    def request_emotion(self, ctx: Any, text: str, voice: Voice, emotion: Emotion | None,
                        seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> the emotion vector of one request, and the RNG state its decoding starts from (None:
        the seed's) when the emotion model sampled first. `emotion` (else the voice's) as
        upstream's infer: text (None: the spoken text, the chunk's when long text is cut) through
        the emotion model, or weights,
        mixed from the emotion matrix; an audio's vector; or the voice's own."""
        emotion = emotion or voice.data.get("emotion")
        if emotion is None or not emotion.by_weights:
            return self.emotion_vector(ctx, voice, emotion), None
        state, weights = None, emotion.vector
        if emotion.from_text:  # upstream: emotion text wins over a vector
            weights, state = self.emotion_from_text(ctx, emotion.text or text, seed)
        rng = random.Random(seed) if emotion.random else None
        vector = pipeline.emotion_from_weights(self.tables, voice.data["style"], list(weights),
                                               voice.data["own_emotion"], emotion.alpha, rng)
        return vector, state

    # ---- talker ----------------------------------------------------------------------------
    def decode_settings(self, sampling: Sampling) -> DecodeSettings:
        return DecodeSettings(do_sample=sampling.do_sample, top_p=sampling.top_p, top_k=sampling.top_k,
                              temperature=sampling.temperature, num_beams=self.num_beams,
                              repetition_penalty=sampling.repetition_penalty)

    def kv_positions(self, text_tokens: int, max_new: int) -> int:
        """M46: the prompt (32 latents, 2 speed, text + start/stop, start_mel) and the codes:
        24 per text token, capped by `max_new_tokens` and the model's limit."""
        codes = min(CODES_PER_TEXT_TOKEN * text_tokens, max_new, self.gpt.cfg.max_mel_tokens)
        return 32 + 2 + text_tokens + 2 + 1 + codes

    def talker_memory(self, text_tokens: int, max_new: int) -> dict[str, int]:
        """M45: KV cache of every beam at the estimated positions, and a whole second one: a
        decoding step's GPT-2 pass builds every layer's grown cache while the old list is still
        held, and the beam reorder builds the reordered list the same way (measured at the
        published 24 layers: 23 MB over the cache, 1.02x with it); the prefill's activations over
        the prompt, every beam; and the latent forward's (one row, the whole sequence)."""
        cfg, elem = self.gpt.cfg, element_size(self.dtype)
        positions = self.kv_positions(text_tokens, max_new)
        prompt = positions - min(CODES_PER_TEXT_TOKEN * text_tokens, max_new, cfg.max_mel_tokens)
        kv = 2 * cfg.layers * positions * cfg.model_dim * elem * self.num_beams

        def row(t: int) -> int:  # one sequence's hidden states, MLP and attention scores over t positions
            return elem * t * (8 * cfg.model_dim + cfg.heads * t)

        return {"kv_cache": kv, "kv_transient": kv,
                "activations": self.num_beams * row(prompt), "latent": row(positions)}

    def generate(self, ctx: Any, text: str, voice: Voice, sampling: Sampling, emotion: Emotion | None = None) -> Codes:
        segments = self.tokenizer.segments(text)
        if not segments:
            raise MizuotoError("indextts2: the text gives no tokens to speak")
        unknown = sum(ids.count(self.tokenizer.unk_id) for ids in segments)
        if unknown:
            log.warning("indextts2: %d text tokens are unknown to bpe.model and will be read as <unk>", unknown)
        emovec, rng_state = self.request_emotion(ctx, text, voice, emotion, sampling.seed)
        max_new = min(sampling.max_new_tokens, self.gpt.cfg.max_mel_tokens)
        settings = self.decode_settings(sampling)
        longest = max(len(s) for s in segments)
        parts = self.talker_memory(longest, max_new)
        ctx.report.add_phase("talker", kv_positions=self.kv_positions(longest, max_new), beams=self.num_beams,
                             segments=len(segments), **{f"{k}_mb": round(v / 2**20, 3) for k, v in parts.items()})
        ref_frames = voice.data["ref_mel"].shape[-1]

        @torch.inference_mode()
        def run() -> list[dict[str, torch.Tensor]]:
            out = []
            spk_latent, vec = voice.data["spk_latent"].to(self.device), emovec.to(self.device)
            # progress and interrupt once per GPT call: prefill, one per code, the latent forward
            calls = len(segments) * (max_new + 1)
            with self.seeded(sampling.seed), self.progress_per_call(ctx, self.gpt.gpt, calls):
                if rng_state is not None:
                    self.set_rng_state(rng_state)
                pipeline.skip_prompt_draws(self.w2v.upstream_draws)
                for ids in segments:
                    text_ids = torch.tensor([ids], dtype=torch.int32, device=self.device)
                    with self.gpt_autocast():
                        raw = pipeline.decode_codes(self.gpt, spk_latent, text_ids, vec, settings, max_new)
                    codes = pipeline.cut_at_stop(raw, self.gpt.cfg.stop_mel_token)
                    if codes.shape[1] == 0:
                        raise MizuotoError("indextts2: the model stopped before speaking a segment; try another seed")
                    if int(codes.max()) >= self.gpt.cfg.start_mel_token:
                        raise MizuotoError(f"indextts2: the model produced code {int(codes.max())} (its start code), "
                                           "which has no sound; try another seed")
                    with self.gpt_autocast():
                        latent = self.gpt.latent(spk_latent, text_ids, codes, vec)
                    frames = ref_frames + pipeline.target_frames(codes.shape[1])
                    noise = torch.randn([1, self.s2mel.cfm.in_channels, frames], device=self.device)
                    # s2mel runs in float32 (a CPU autocast leaves the final norm's output in the GPT's dtype)
                    out.append({"codes": codes.cpu(), "latent": latent.float().cpu(), "noise": noise.cpu()})
            return out

        done = ctx.run("talker", [self.talker], run, sum(parts.values()))
        tokens = torch.cat([d["codes"] for d in done], dim=1)
        return Codes(tokens, self.id, {"segments": done, "voice": voice.key, "voice_data": voice.data})

    def typical_phases(self, seconds: float) -> list[PhaseEstimate]:
        """A clone of a 10 s reference (no emotion text), the text in segments of at most
        `MAX_SEGMENT_TOKENS` (one is live at a time), each segment's codes as `kv_positions`
        estimates them; the flow sees the reference's mel frames before the segment's."""
        segment = min(typical_tokens(seconds), MAX_SEGMENT_TOKENS)
        max_new = self.gpt.cfg.max_mel_tokens
        codes = min(CODES_PER_TEXT_TOKEN * segment, max_new)
        hop = self.config["s2mel"]["preprocess_params"]["spect_params"]["hop_length"]
        ref_frames = int(TYPICAL_REFERENCE_SECONDS * SAMPLE_RATE / hop)
        handles = (self.w2v_bert, self.semantic_codec, self.campplus, self.conditioning)
        samples = int(TYPICAL_REFERENCE_SECONDS * 16000)
        return [PhaseEstimate("voice prompt", handles, self.voice_prompt_memory(samples)),
                PhaseEstimate("talker", (self.talker,), sum(self.talker_memory(segment, max_new).values())),
                PhaseEstimate("flow", (self.flow,), self.flow_memory(ref_frames + pipeline.target_frames(codes))),
                PhaseEstimate("vocoder", (self.vocoder,), self.vocoder_memory(pipeline.target_frames(codes)))]

    # ---- flow and vocoder ------------------------------------------------------------------
    def flow_memory(self, frames: int) -> int:
        """M45: the estimator's batch-2 (CFG) activations over every frame (its transformer's
        feed-forward and the WaveNet are 4x and 2x the hidden width; fused attention keeps no
        score matrix: the measured peak is linear in the frames), x and its update."""
        hidden = self.s2mel.cfm.estimator.cond_x_merge_linear.out_features
        return 4 * 2 * frames * FLOW_HIDDEN_COPIES * hidden + 4 * 8 * 80 * frames

    def vocoder_memory(self, frames: int) -> int:
        h = self.bigvgan.h
        widest, channels, length = 0, h.upsample_initial_channel, frames
        for rate in h.upsample_rates:
            channels //= 2
            length *= rate
            widest = max(widest, channels * length)
        return 4 * VOCODER_STAGE_COPIES * widest

    def decode(self, ctx: Any, codes: Codes, allow_fallback: bool | None = None) -> Audio:
        voice = codes.extra.get("voice_data")
        segments = codes.extra.get("segments")
        if voice is None or segments is None:
            raise MizuotoError("indextts2 decode: codes must come from this engine's generate")
        ref_frames = voice["ref_mel"].shape[-1]
        frames = max(ref_frames + pipeline.target_frames(s["codes"].shape[1]) for s in segments)

        @torch.inference_mode()
        def run_flow() -> list[torch.Tensor]:
            # progress and interrupt once per Euler step
            with self.progress_per_call(ctx, self.s2mel.cfm.estimator, len(segments) * pipeline.DIFFUSION_STEPS):
                return [self._flow_segment(segment, voice) for segment in segments]

        mels = ctx.run("flow", [self.flow], run_flow, self.flow_memory(frames))

        @torch.inference_mode()
        def run_vocoder() -> torch.Tensor:
            silence = torch.zeros(1, SAMPLE_RATE * SILENCE_MS // 1000)
            pieces: list[torch.Tensor] = []
            for i, mel in enumerate(mels):
                if i:
                    pieces.append(silence)
                pieces.append(pipeline.vocode(self.bigvgan, mel.to(self.device)).cpu())
            return torch.cat(pieces, dim=1)

        longest = max(m.shape[-1] for m in mels)
        wav = ctx.run("vocoder", [self.vocoder], run_vocoder, self.vocoder_memory(longest))
        return Audio(wav, SAMPLE_RATE)

    def _flow_segment(self, segment: dict[str, torch.Tensor], voice: dict[str, Any]) -> torch.Tensor:
        """One segment's mel: the prompt's content, then the codes' stretched to 1.72 frames per
        code; 25 Euler steps from the noise the talker drew; the prompt's frames cut off."""
        flow, s2m, dev = self.flow_module, self.s2mel, self.device
        ref_mel = voice["ref_mel"].to(dev)
        prompt = s2m.length_regulator(voice["semantic"].to(dev), torch.tensor([ref_mel.shape[-1]], device=dev))
        projected = s2m.gpt_layer(segment["latent"].to(dev))
        embedded = flow.embed(segment["codes"].to(dev))
        target = torch.tensor([pipeline.target_frames(embedded.shape[1])], device=dev)
        cond = torch.cat([prompt, s2m.length_regulator(embedded + projected, target)], dim=1)
        full = s2m.cfm.solve(segment["noise"].to(dev), torch.tensor([cond.shape[1]], device=dev), ref_mel, cond,
                             voice["style"].to(dev), pipeline.DIFFUSION_STEPS, pipeline.CFG_RATE)
        return full[:, :, ref_mel.shape[-1]:].cpu()
