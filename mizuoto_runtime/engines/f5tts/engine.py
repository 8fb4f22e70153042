"""F5-TTS (v1 Base and any model of its DiT family) over the official `f5-tts` package's model
code, run in phases by the memory runtime (issue 11).

Phases (M1):

* ``voice prompt`` — the reference mel (F5-TTS's own `MelSpec`, parameter-free: no component
  is placed) and the reference transcript. Cached by the base class (M4).
* ``flow`` — the DiT (`CFM.transformer`), `oneshot`: every ODE step runs each block once over
  the whole sequence. Upstream packs the conditional and unconditional CFG halves into one
  batch (``cfg_infer=True``), so a streamed block is copied once per step and serves both
  (M18). On CUDA the next blocks copy on a side stream while one computes (M19, M20: a
  one-shot model's compute hides its copies). Its text blocks run once per request (first
  step, cond then uncond; the text embedding is cached upstream after that).
* ``vocoder`` — Vocos, `oneshot`, float32 as F5-TTS runs it. Fallback after OOM (M42, M43):
  `tiled_1d`, valid here because Vocos is local in time: a 7-tap depthwise ConvNeXt stack with
  per-frame LayerNorm (no time-global statistics, no state carried along the sequence, unlike
  HiFT's phase) followed by an overlap-add ISTFT. Outside the 32-frame crossfades a tile's
  samples are the whole decode's (`tests/engines/test_f5tts.py` checks it); inside, the two tiles
  differ by their missing context, which the crossfade blends.

Exactness (M40, M57). `CFM.sample` draws its noise from torch's global RNG (``seed=`` calls
``torch.manual_seed``): the flow phase runs inside a `fork_rng` with the request's seed, so
retries and placements replay the same noise and the caller's RNG is left as it was.

Loading (M27). The published folder layout (``SWivid/F5-TTS``'s ``F5TTS_v1_Base/``):
``model_<step>.safetensors`` (EMA weights under ``ema_model.``) and ``vocab.txt``; the vocoder
as published (``charactr/vocos-mel-24khz``: ``config.yaml`` + ``pytorch_model.bin``) in a
``vocos-mel-24khz/`` subfolder. The architecture comes from a model config in F5-TTS's own
format (``<name>.yaml`` as in the package's ``configs/``) when the folder has one, else the
package's ``F5TTS_v1_Base.yaml``. The DiT is built on meta in its run precision and the
memory-mapped safetensors copied in (no float32 copy); the vocoder's ``.bin`` is read with
``torch.load(weights_only=True, mmap=True)`` and its ``config.yaml`` may only name Vocos's own
classes (nothing else is imported from a model folder).

The package's ``f5_tts.model`` ``__init__`` imports its trainer (wandb, accelerate, datasets);
`import_upstream` imports the model modules without running it (`f5tts.upstream`).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from ...audio import Audio
from ...errors import CheckpointError, MizuotoError
from ...memory.phases import RequestContext
from ...memory.tiling import tiled_1d
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
)
from .checkpoint import DEFAULT_CONFIG, SAMPLE_RATE, VOCODER_FOLDER, check_layout, load_flow, load_vocoder
from .upstream import import_upstream

log = logging.getLogger(__name__)

TARGET_RMS = 0.1  # upstream's loudness normalization of the reference (and back, of the output)
CFG_STRENGTH = 2.0
SWAY_SAMPLING = -1.0
DEFAULT_STEPS = 32
# The constants below were fitted to CPU peaks measured on the tiny checkpoint (bench/engines.py
# --peaks, the request sizes of the estimate tests: 1 and 3 s references, 4 steps) to land 1.0-1.3x
# above them (M45: never under, not much over); on CUDA the M47 calibration corrects them.
# Live activations of one DiT block, per CFG row and position, in units of the model width: the
# block input kept for the residual, adaLN-modulated input, q/k/v, the attention output, the
# feed-forward's hidden (ff_mult wide) and its GELU.
DIT_BLOCK_COPIES = 5
# Vocos: its backbone and its ISTFT head peak one after the other, never together (issue 35: the
# sum of both read 1.9x the published Vocos's peak). The backbone's live activations per frame in
# units of its width (a ConvNeXt block's input, its depthwise output, the intermediate layer at
# intermediate/width, its GELU). The head's, in units of its projection's output per frame (the
# spectrum, n_fft + 2 floats): the projection, its exp / cos / sin halves and the complex
# spectrum's pieces (measured: 4.5 with torch.istft, 3.5 with vocos's own, at both sizes), beside
# the backbone's output; with ``padding="same"`` (vocos's own overlap-add, the tiny checkpoint's)
# also the inverse FFT's frames, windowed and folded (window-long frames), and the output; the
# published ``"center"`` (torch.istft) holds none of those at its peak.
VOCOS_BLOCK_COPIES = 4
VOCOS_SPECTRUM_COPIES = 5
VOCOS_OVERLAP_ADD_FRAMES = 3


class F5TTSEngine(Engine):
    """F5-TTS in three phases: voice prompt, flow, vocoder (M1)."""

    id = "f5tts"
    title = "F5-TTS"
    REQUIREMENTS = "f5tts"
    UPSTREAM = "f5_tts"
    WEIGHTS = {"generate": SmallWeights(("flow",)), "decode": SmallWeights(("vocoder",))}
    PHASED = True
    sample_rate = SAMPLE_RATE
    PUBLISHED = "published"
    steps = DEFAULT_STEPS  # ODE steps (F5-TTS's nfe_step); tests and benches set fewer

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        """A folder in the published layout (weights, vocab.txt, the Vocos folder) with at most one
        model config, labelled with the config's name as the loader picks it (the folder's
        ``*.yaml``, else the package's F5TTS_v1_Base); None otherwise. No built-in speakers,
        and no language setting (the vocabulary decides what it speaks): "auto" only."""
        try:
            check_layout(folder)
        except CheckpointError:
            return None
        configs = sorted(folder.glob("*.yaml"))
        if len(configs) > 1:
            return None
        return CheckpointInfo(configs[0].stem if configs else DEFAULT_CONFIG, [], ["auto"])

    def __init__(self, manager: Any, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> None:
        super().__init__(manager, model_dir, dtype, device)
        if self.model_dir is None:
            raise CheckpointError("f5tts needs a checkpoint folder (the F5TTS_v1_Base layout: "
                                  f"model_<step>.safetensors, vocab.txt, {VOCODER_FOLDER}/)")
        self.cfm, mel_kwargs = load_flow(self.model_dir, dtype)
        self.vocos = load_vocoder(self.model_dir / VOCODER_FOLDER)
        self.mel = import_upstream().MelSpec(**mel_kwargs)  # parameter-free: computed where the audio is
        self.hop = mel_kwargs["hop_length"]
        self.flow = self.register(self.cfm, "flow")
        self.vocoder = self.register(self.vocos, "vocoder")

    def handles(self) -> list[Any]:
        return [self.flow, self.vocoder]

    # ---- voice prompt ----------------------------------------------------------------------
    def encode_voice(self, ctx: RequestContext, reference: Audio | None, transcript: str | None,
                     speaker: str | None, instruct: str | None = None) -> dict[str, Any]:
        if reference is None or not (transcript or "").strip():
            raise MizuotoError("f5tts clones a voice: give reference audio and its transcript "
                               "(it has no speakers and no speech recognition here)")
        if speaker or instruct:
            raise MizuotoError("f5tts takes no speaker or instruct: the reference audio is the voice")
        wav = reference.mono().unsqueeze(0)
        rms = float(torch.sqrt(torch.mean(torch.square(wav))))
        if 0 < rms < TARGET_RMS:
            wav = wav * TARGET_RMS / rms
        if reference.sample_rate != SAMPLE_RATE:
            import torchaudio

            wav = torchaudio.functional.resample(wav, reference.sample_rate, SAMPLE_RATE)
        if wav.shape[-1] < self.hop:
            raise MizuotoError(f"f5tts: the reference audio is too short ({wav.shape[-1]} samples at 24 kHz)")

        @torch.inference_mode()
        def mel() -> torch.Tensor:
            return self.mel(wav.to(self.device)).permute(0, 2, 1).cpu()  # (1, frames, mels)

        return {"mel": ctx.run("voice prompt", [], mel), "frames": wav.shape[-1] // self.hop, "rms": rms,
                "ref_text": _ref_text(transcript or "")}

    # ---- flow ------------------------------------------------------------------------------
    def durations(self, voice: Voice, text: str, speed: float = 1.0) -> tuple[int, int]:
        """(reference frames, total frames): upstream's estimate from the two texts' byte lengths.
        The reference counts samples // hop frames (its mel has one more: the STFT is centred)."""
        ref_frames = voice.data["frames"]
        ref_bytes = len(voice.data["ref_text"].encode("utf-8"))
        gen_bytes = len(text.encode("utf-8"))
        if gen_bytes < 10:
            speed = 0.3  # upstream's rule for very short texts
        return ref_frames, ref_frames + int(ref_frames / ref_bytes * gen_bytes / speed)

    def flow_memory(self, frames: int, text_tokens: int, steps: int, rows: int = 1) -> int:
        """M45: the flow phase's working memory, from the request: 2 CFG rows per request row over
        `frames` positions through one DiT block at a time, the ODE trajectory (every step's
        state is kept by torchdiffeq), the cached text embeddings and the conditioning."""
        dit = self.cfm.transformer
        elem = element_size(self.dtype)
        mel = self.cfm.num_channels
        text_dim = dit.text_embed.text_embed.embedding_dim
        ff_width = dit.transformer_blocks[0].ff.ff[0][0].out_features / dit.dim if dit.depth else 2
        cfg_rows = 2 * rows
        block = cfg_rows * frames * dit.dim * elem * (DIT_BLOCK_COPIES + 2 * ff_width)
        trajectory = (steps + 1) * rows * frames * mel * elem
        text = cfg_rows * (frames + text_tokens) * text_dim * elem * 4  # embedding, conv blocks' temporaries
        inputs = cfg_rows * frames * (3 * mel + text_dim) * elem
        return int(block + trajectory + text + inputs)

    def generate(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling) -> Codes:
        data = voice.data
        if "mel" not in data:
            raise MizuotoError("f5tts: the voice has no reference mel; "
                               "make it with voice_prompt(reference=…, transcript=…)")
        modules = import_upstream()
        ref_frames, total = self.durations(voice, text)
        tokens = modules.convert_char_to_pinyin([data["ref_text"] + text])
        steps = self.steps
        memory = self.flow_memory(total, len(tokens[0]), steps)

        @torch.inference_mode()
        def flow() -> torch.Tensor:
            with self.progress_per_call(ctx, self.cfm.transformer, steps), self.seeded(sampling.seed):
                out, _trajectory = self.cfm.sample(
                    cond=data["mel"].to(self.device), text=tokens, duration=total, steps=steps,
                    cfg_strength=CFG_STRENGTH, sway_sampling_coef=SWAY_SAMPLING, seed=sampling.seed,
                )
                del _trajectory
            return out[:, ref_frames:, :].to(torch.float32).permute(0, 2, 1).cpu()  # (1, mels, frames)

        mel = ctx.run("flow", [self.flow], flow, memory)
        ctx.progress(steps, steps)
        return Codes(mel, self.id, {"rms": data["rms"]})

    def typical_phases(self, seconds: float) -> list[PhaseEstimate]:
        """A 10 s reference and its transcript before the text (one character token each), the
        ODE's `steps`; the voice prompt's mel holds no component."""
        rate = SAMPLE_RATE / self.hop
        ref_frames, frames = int(TYPICAL_REFERENCE_SECONDS * rate), int(seconds * rate)
        chars = round((TYPICAL_REFERENCE_SECONDS + seconds) * TYPICAL_CHARS_PER_SECOND)
        return [PhaseEstimate("flow", (self.flow,), self.flow_memory(ref_frames + frames, chars, self.steps)),
                PhaseEstimate("vocoder", (self.vocoder,), self.vocoder_memory(frames))]

    # ---- vocoder ---------------------------------------------------------------------------
    def vocoder_memory(self, frames: int) -> int:
        """M45: Vocos's working memory for `frames` mel frames (float32): the larger of its
        backbone's and its ISTFT head's (the backbone's output is live through the head)."""
        backbone, head = self.vocos.backbone, self.vocos.head
        width = backbone.embed.out_channels
        inner = backbone.convnext[0].pwconv1.out_features if len(backbone.convnext) else width
        blocks = 4 * (VOCOS_BLOCK_COPIES * width + 2 * inner)
        istft = head.istft
        spectrum = 4 * (width + VOCOS_SPECTRUM_COPIES * head.out.out_features)
        if istft.padding == "same":
            spectrum += 4 * (VOCOS_OVERLAP_ADD_FRAMES * istft.win_length + istft.hop_length)
        return frames * max(blocks, spectrum)

    def decode(self, ctx: RequestContext, codes: Codes, allow_fallback: bool | None = None) -> Audio:
        mel = codes.tokens
        if mel.shape[-1] == 0:
            return Audio(torch.zeros(1, 0), self.sample_rate)

        def vocode(frames: torch.Tensor) -> torch.Tensor:
            return self.vocos.decode(frames.to(self.device))

        @torch.inference_mode()
        def whole() -> torch.Tensor:
            return vocode(mel).cpu()

        @torch.inference_mode()
        def tiled() -> torch.Tensor:
            return tiled_1d(vocode, mel).cpu()

        wav = ctx.run("vocoder", [self.vocoder], whole, self.vocoder_memory(mel.shape[-1]),
                      fallback=("tiled_1d", tiled), allow_fallback=allow_fallback)
        rms = codes.extra.get("rms", TARGET_RMS)
        if 0 < rms < TARGET_RMS:
            wav = wav * rms / TARGET_RMS  # upstream gives the output the reference's loudness back
        return Audio(wav.to(torch.float32), self.sample_rate)  # (1, samples)


def _ref_text(text: str) -> str:
    """The reference transcript as upstream's inference passes it: ended on a sentence mark and a
    space (`preprocess_ref_audio_text`), then one more space after a one-byte last character
    (`infer_batch_process`)."""
    if not text.endswith(". ") and not text.endswith("。"):
        text = text + " " if text.endswith(".") else text + ". "
    if len(text[-1].encode("utf-8")) == 1:
        text += " "
    return text
