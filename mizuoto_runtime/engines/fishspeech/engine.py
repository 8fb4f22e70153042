"""Fish Speech (OpenAudio S1-mini, Fish Audio S2-Pro) on our own model code, run in phases by
the memory runtime.

Components and phases (M1), each a handle registered with the manager:

* ``voice prompt`` — ``codec_encoder`` (`oneshot`): the reference audio (resampled to 44.1 kHz,
  mono) becomes codes; with its transcript it is the voice. Placed only when a voice is not
  cached (M4). Without a reference the model speaks in a voice of its own choosing.
* ``talker`` — ``talker`` (`sequence`, M15/M20): the slow transformer's layers are its units,
  streamed in run order; the fast transformer is in the same handle and marked `hot`. It runs
  ``num_codebooks`` times per frame against the slow transformer's once, so when the talker does
  not fit, the fast transformer stays resident and only slow layers stream: each frame then
  copies exactly the slow transformer's streamed units (tested from the streamer's counters).
  Without the mark, the budget would go to the slow layers that come first in run order and
  every streamed fast layer would be copied once per codebook. Measured by `bench/engines.py` on
  the tiny S2-Pro checkpoint with the talker capped half-way: 0.56 MB streamed per frame with
  the mark, 3.94 MB without (7x); 41 against 59 ms per frame on the CPU. On the real S2-Pro a
  fast layer is about as large as a slow one (~200 MB in bf16), so each one streamed would cost
  about 2 GB of copies per frame.
  One handle rather than two: a second handle would reserve its own copy room and the manager
  would fill the smaller component first (M33), the same outcome with a larger minimum.
* ``decoder`` — ``codec_decoder`` (`oneshot`), once per request. No ``tiled_1d`` fallback:
  tiles would not give the same samples (M43). The post-quantizer transformer's rotary table
  is rounded to bfloat16 per absolute position, so a tile's frames would be rotated by other
  rounded values than in the whole run, and its window reaches 128 frames back.

The token loop is ours (`loop.generate`): no host sync per frame (the stop token is looked at
once every 8 frames), the KV cache written in place, static buffers doubling when full under
``compute.kv_cache = static`` (M53), grown per step otherwise. Its working memory (M45/M46) is
estimated from the request: the prompt's positions (system text, the voice's codes, every user
batch) plus the frames the text should take (`FRAMES_PER_TEXT_BYTE` per UTF-8 byte of each
batch), each batch capped by its real bound (``max_new_tokens`` and the room left in the
model's ``max_seq_len``). A generation that runs past the estimate reruns exactly (M40).

Exactness (M40, M57). Sampling draws from a generator of the phase's own, seeded from the
request's seed at the start of each attempt: a retried phase and every placement draw the same
numbers, and the same seed gives the same codes as upstream's ``torch.manual_seed(seed)`` run
on the CPU (the fixture test checks it). Weights reach the code through the handle's hooks,
which swap `param.data`.

Licences: S2-Pro code and weights are under the Fish Audio Research License (research and
non-commercial); S1-mini weights are CC-BY-NC-SA-4.0. The loader logs it once per load.
S1-mini runs with the prompt and sampling of its own release code (upstream up to d3df505,
Apache-2.0; `prompt.s1_prompt`, `sampling.S1Sampling`): no chat, the whole text at once, a
windowed repetition penalty and top-p. No reference data covers it; it was compared with that
code on a tiny checkpoint outside the repository (identical frames).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...audio import Audio
from ...errors import ArgumentError, CheckpointError, MizuotoError
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
    Voice,
    element_size,
    typical_tokens,
)
from . import prompt as chat
from .checkpoint import detect_version, load_codec, load_dual_ar
from .codec import CodecConfig
from .dual_ar import FastTransformer, KVCache, SlowTransformer
from .loop import FrameSampler, frame_count
from .loop import generate as run_loop
from .sampling import S1Sampling, SamplingTensors

SAMPLE_RATE = 44100
LABELS = {"s2-pro": "S2-Pro", "s1-mini": "S1-mini"}
# M46: about 21.5 frames a second; speech is about 15 bytes of text a second (fewer for CJK,
# whose characters take 3 bytes): 2 frames per byte bounds both.
FRAMES_PER_TEXT_BYTE = 2
# Live activations of a codec conv stage (input kept for the residual, Snake's temporaries,
# the conv's output), in units of the stage's output.
CODEC_STAGE_COPIES = 6


class DualARTalker(nn.Module):
    """The talker component: the slow transformer's layers, then the fast one's, are its units."""

    def __init__(self, slow: SlowTransformer, fast: FastTransformer) -> None:
        super().__init__()
        self.slow = slow
        self.fast = fast

    def memory_units(self) -> list[nn.Module]:
        return [*self.slow.layers, *self.fast.fast_layers]


class FishSpeechEngine(Engine):
    id = "fishspeech"
    title = "Fish Speech"
    REQUIREMENTS = "fishspeech"
    VERSIONS = ("s2-pro", "s1-mini")
    REFERENCE = "reference"
    PUBLISHED = "published"
    PHASED = True
    FAST_HOT: ClassVar[bool] = True  # the layout; `bench/engines.py` measures it against none
    # The dual-AR talker is where the bytes are (issue 36); its slow head stays as published (the
    # slow transformer reads `output.weight` outside its forward), and so does the codec.
    WEIGHTS = {"generate": SmallWeights(("talker",), keep=("slow.output",))}
    sample_rate = SAMPLE_RATE

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        version = detect_version(folder)
        return None if version is None else CheckpointInfo(LABELS[version], [], ["auto"])

    def __init__(self, manager: Any, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> None:
        super().__init__(manager, model_dir, dtype, device)
        if self.model_dir is None:
            raise CheckpointError("fishspeech needs a checkpoint folder (the S2-Pro or S1-mini layout)")
        self.model = load_dual_ar(self.model_dir, dtype)
        encoder, decoder = load_codec(self.model_dir, dtype)
        self.codec: CodecConfig = encoder.cfg
        self.talker_module = DualARTalker(self.model.slow, self.model.fast)
        self.talker = self.register(self.talker_module, "talker", kind="sequence")
        if self.FAST_HOT:
            self.talker.mark(self.model.fast, "hot")
        self.codec_encoder = self.register(encoder, "codec_encoder")
        self.codec_decoder = self.register(decoder, "codec_decoder")

    def handles(self) -> list[Any]:
        return [self.codec_encoder, self.talker, self.codec_decoder]

    @property
    def version(self) -> str:
        return self.model.version

    # ---- voice prompt ----------------------------------------------------------------------
    def encode_voice(self, ctx: RequestContext, reference: Audio | None, transcript: str | None,
                     speaker: str | None, instruct: str | None = None) -> dict[str, Any]:
        if speaker or instruct:
            raise MizuotoError("fishspeech takes no speaker name or instruct: clone a voice from reference audio "
                               "and its transcript")
        if reference is None:
            return {"codes": None, "transcript": None}
        if not transcript or not transcript.strip():
            raise ArgumentError("fishspeech clones a voice from reference audio and its transcript: "
                                "give the transcript too")
        wav = self._at_44k(reference)
        codes = ctx.run("voice prompt", [self.codec_encoder], lambda: self._encode(wav),
                        self.voice_prompt_memory(wav.shape[-1]))
        return {"codes": codes, "transcript": transcript}

    @staticmethod
    def _at_44k(reference: Audio) -> Tensor:
        wav = reference.mono()
        if reference.sample_rate == SAMPLE_RATE:
            return wav
        import torchaudio  # only for references at another rate (upstream resamples with it too)

        return torchaudio.functional.resample(wav, reference.sample_rate, SAMPLE_RATE)

    @torch.inference_mode()
    def _encode(self, wav: Tensor) -> Tensor:
        codes = self.codec_encoder.module(wav[None].to(self.device, self.dtype))
        return codes[0].cpu()

    def voice_prompt_memory(self, samples: int) -> int:
        """M45: the encoder's widest conv stage (channels x length) from the reference length."""
        c = self.codec
        length, channels = math.ceil(samples / c.frame_length) * c.frame_length, c.encoder_dim
        widest = channels * length
        for rate in c.encoder_rates:
            length, channels = math.ceil(length / rate), channels * 2
            widest = max(widest, channels * length * rate // 2)  # the residual units run at the input rate
        return element_size(self.dtype) * (CODEC_STAGE_COPIES * widest + 2 * samples)

    # ---- talker ----------------------------------------------------------------------------
    def plan_positions(self, text: str, voice: Voice, sampling: Sampling) -> tuple[int, int]:
        """M46: (the prompt positions of the last batch, the frames estimated for it), the last
        batch's prompt holding every earlier batch and its estimated answer."""
        cfg = self.model.config
        prompt_len, frames = 0, 0
        for i, batch in enumerate(self._batches(text)):
            if i == 0:
                prompt_len = self._rows(voice, [], batch).shape[1]
            else:  # the earlier batch's answer and this batch's text, chat tokens rounded up
                prompt_len += frames + len(self.model.tokenizer.encode(batch)) + 16
            cap = frame_count(min(prompt_len, cfg.max_seq_len - 1), sampling.max_new_tokens, cfg.max_seq_len)
            frames = max(1, min(cap, FRAMES_PER_TEXT_BYTE * len(batch.encode("utf-8"))))
        return prompt_len, frames

    def _batches(self, text: str) -> list[str]:
        """S2-Pro speaks speaker-tagged text batch by batch; S1-mini's code speaks it whole."""
        return [text] if self.version == "s1-mini" else chat.batches(text)

    def _rows(self, voice: Voice, answered: list[chat.Part], batch: str) -> Tensor:
        """The prompt frames for `batch`, after the batches `answered` (S2-Pro's chat)."""
        data, cfg = voice.data, self.model.config
        if self.version == "s1-mini":
            parts = chat.s1_prompt(data.get("transcript"), data.get("codes"), batch)
        else:
            parts = [*chat.system_message(data.get("transcript"), data.get("codes")), *answered,
                     *chat.user_message(batch), *chat.assistant_turn()]
        return chat.encode(parts, self.model.tokenizer, cfg.num_codebooks)

    def talker_memory(self, prompt_len: int, frames: int, kv_cache: str | None = None) -> int:
        """M45/M46: the slow KV cache grown to the prompt and frames (`peak_bytes` of its kind),
        the fast one's ``num_codebooks`` positions, and the prefill's activations (hidden states,
        MLP) with four float32 vocabulary rows. No attention-score term: torch's fused attention
        (CPU and CUDA sdpa) keeps none, and the tiny checkpoint's peak grows linearly with the
        prompt (measured by `bench/engines.py --peaks`, 1.0-1.3x). A frame's sampling over the
        vocabulary (a sort with its int64 order, softmax, cumulative sums, uniforms: 29 bytes an
        entry in bfloat16, 41 in float32) runs once the prefill's activations are freed, which
        cover it: S2-Pro's shortest chat prompt (46 positions) holds more. At S2-Pro's published
        size (36 layers, 2560 wide, 155776 tokens; one block's weights in every layer) a 3 s
        voice and 8 frames read 1.08x, a short request without a voice 1.11x."""
        cfg, elem = self.model.config, element_size(self.dtype)
        kind = kv_cache or self.manager.policy.kv_cache
        kv = peak_bytes(KVCache.position_bytes(cfg.n_local_heads, cfg.head_dim, self.dtype), cfg.n_layer,
                        prompt_len + frames, "static" if kind == "static" else "dynamic")
        fast_kv = KVCache.position_bytes(cfg.fast_n_local_heads, cfg.fast_head_dim, self.dtype) * cfg.n_fast_layer \
            * cfg.num_codebooks
        prefill = elem * prompt_len * (4 * cfg.dim + 3 * cfg.intermediate_size) \
            + 4 * cfg.vocab_size * 4
        return kv + fast_kv + prefill

    def _sampling_tensors(self, sampling: Sampling) -> SamplingTensors | S1Sampling:
        cfg = self.model.config
        if self.version == "s1-mini":
            return S1Sampling.build(temperature=sampling.temperature,
                                    top_p=sampling.top_p if sampling.do_sample else 0.0,
                                    repetition_penalty=sampling.repetition_penalty, device=self.device)
        return SamplingTensors.build(
            temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.do_sample else 1, vocab_size=cfg.vocab_size,
            semantic_begin=cfg.semantic_begin_id, semantic_end=cfg.semantic_end_id, im_end_id=self.model.im_end_id,
            dtype=self.dtype, device=self.device)

    def generate(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling) -> Codes:
        kv_cache = self.manager.policy.kv_cache
        prompt_len, frames = self.plan_positions(text, voice, sampling)
        memory = self.talker_memory(prompt_len, frames, kv_cache)
        ctx.report.add_phase("talker", kv_positions=prompt_len + frames, frames_estimated=frames,
                             working_mb=round(memory / 2**20, 2))
        batches = self._batches(text)
        total = sampling.max_new_tokens * len(batches)

        def talk() -> tuple[Tensor, int]:
            return self._talk(ctx, batches, voice, sampling, kv_cache, total)

        codes, computed = ctx.run("talker", [self.talker], talk, memory)
        ctx.progress(total, total)
        ctx.applied.update(talker_loop="lean", kv_cache=kv_cache)
        return Codes(codes, self.id, {"frames_computed": computed})

    @torch.inference_mode()
    def _talk(self, ctx: RequestContext, batches: list[str], voice: Voice, sampling: Sampling, kv_cache: str,
              total: int) -> tuple[Tensor, int]:
        """Every batch in turn, each answer going back into the chat: the codes of all, and the
        frames the slow transformer ran (each one pass of its layers)."""
        m, cfg = self.model, self.model.config
        generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        sampler = FrameSampler(m.fast, self._sampling_tensors(sampling), generator, self.device)
        cache = m.slow.new_cache(self.device, kind=kv_cache)
        answered: list[chat.Part] = []
        answers, done, computed = [], 0, 0
        for batch in batches:
            rows = self._rows(voice, answered, batch)
            try:
                frames = frame_count(rows.shape[1], sampling.max_new_tokens, cfg.max_seq_len)
            except ValueError as exc:
                raise ArgumentError(f"fishspeech: {exc}; shorten the text or the reference") from exc
            base = done
            out = run_loop(m.slow, sampler, rows.to(self.device), frames, cache, m.im_end_id,
                           on_frame=lambda n, base=base: ctx.progress(min(base + n, total), total))
            done += sampling.max_new_tokens
            computed += out.computed
            answer = out.codes.cpu()
            answers.append(answer)
            answered += [*chat.user_message(batch), *chat.assistant_answer(answer)]
        return torch.cat(answers, dim=1), computed

    # ---- decoder ---------------------------------------------------------------------------
    def typical_phases(self, seconds: float) -> list[PhaseEstimate]:
        """A clone of a 10 s reference with its transcript (its codes and text in the system
        message), the text's frames as `plan_positions` estimates them (per UTF-8 byte), one
        batch; chat tokens rounded up as there."""
        rate = SAMPLE_RATE / self.codec.frame_length
        ref_frames = math.ceil(TYPICAL_REFERENCE_SECONDS * rate)
        prompt = 16 + typical_tokens(TYPICAL_REFERENCE_SECONDS + seconds) + ref_frames
        frames = FRAMES_PER_TEXT_BYTE * round(seconds * TYPICAL_CHARS_PER_SECOND)
        samples = int(TYPICAL_REFERENCE_SECONDS * SAMPLE_RATE)
        return [PhaseEstimate("voice prompt", (self.codec_encoder,), self.voice_prompt_memory(samples)),
                PhaseEstimate("talker", (self.talker,), self.talker_memory(prompt, frames)),
                PhaseEstimate("decoder", (self.codec_decoder,), self.decoder_memory(math.ceil(seconds * rate)))]

    def decoder_memory(self, frames: int) -> int:
        """M45: the decoder's widest stage (channels x length) for `frames` code frames."""
        c = self.codec
        length = frames * math.prod(c.downsample_factor)
        widest, channels = c.latent_dim * length, c.decoder_dim
        for rate in c.decoder_rates:
            length, channels = length * rate, channels // 2
            widest = max(widest, channels * length)
        return element_size(self.dtype) * (CODEC_STAGE_COPIES * widest + 2 * length)

    def decode(self, ctx: RequestContext, codes: Codes, allow_fallback: bool | None = None) -> Audio:
        tokens = codes.tokens
        if tokens.shape[-1] == 0:
            return Audio(torch.zeros(1, 0), self.sample_rate)  # stopped at once: nothing to decode

        @torch.inference_mode()
        def run() -> Tensor:
            wav = self.codec_decoder.module(tokens[None].to(self.device))
            return wav[0].to(torch.float32).cpu()

        # No fallback: tiles would not give the whole run's samples (see the module docstring).
        wav = ctx.run("decoder", [self.codec_decoder], run, self.decoder_memory(tokens.shape[-1]))
        return Audio(wav, self.sample_rate)
