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
  samples are the whole decode's (`tests/test_f5tts.py` checks it); inside, the two tiles
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
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...audio import Audio
from ...errors import CheckpointError, MizuotoError
from ...loading import build_on_meta, load_safetensors
from ...nn.checkpoint import load_weights_only
from ...phases import RequestContext
from ...tiling import tiled_1d
from ..base import CheckpointInfo, Codes, Engine, Sampling, Voice, element_size
from ..checkpoint_files import read_yaml
from .upstream import import_upstream, package_config, vocos_classes

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
HOP = 256
VOCODER_FOLDER = "vocos-mel-24khz"
DEFAULT_CONFIG = "F5TTS_v1_Base"  # the package's config of the published checkpoint
EMA_PREFIX = "ema_model."
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
# Vocos: live activations per frame in units of the backbone width (a ConvNeXt block's input,
# its depthwise output, the intermediate layer at intermediate/width, its GELU), plus the
# ISTFT's spectrum and overlap-add buffers per output sample.
VOCOS_BLOCK_COPIES = 4
VOCOS_BYTES_PER_SAMPLE = 56


def find_weights(folder: Path) -> Path:
    """The folder's ``model_<step>.safetensors`` (the highest step when there are several)."""
    found = sorted(folder.glob("model_*.safetensors"),
                   key=lambda p: int(m.group(1)) if (m := re.fullmatch(r"model_(\d+)\.safetensors", p.name)) else -1)
    if not found:
        raise CheckpointError(f"{folder}: not an F5-TTS checkpoint folder, no model_<step>.safetensors "
                              "(expected the layout of SWivid/F5-TTS F5TTS_v1_Base/)")
    return found[-1]


def check_layout(folder: Path) -> tuple[Path, Path, Path]:
    """(weights, vocab.txt, vocoder folder) of an F5-TTS folder, each checked to exist."""
    if not folder.is_dir():
        raise CheckpointError(f"F5-TTS checkpoint folder not found: {folder}")
    weights = find_weights(folder)
    missing = [name for name in ("vocab.txt", f"{VOCODER_FOLDER}/config.yaml", f"{VOCODER_FOLDER}/pytorch_model.bin")
               if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(f"{folder}: F5-TTS folder is missing {', '.join(missing)} (the vocoder goes in "
                              f"{VOCODER_FOLDER}/, as published in charactr/vocos-mel-24khz)")
    return weights, folder / "vocab.txt", folder / VOCODER_FOLDER


def model_config(folder: Path) -> dict[str, Any]:
    """``model:`` of the folder's F5-TTS config (``*.yaml``), else of the package's v1 Base."""
    configs = sorted(folder.glob("*.yaml"))
    if len(configs) > 1:
        raise CheckpointError(f"{folder}: several model configs ({', '.join(p.name for p in configs)}); keep one")
    config = read_yaml(configs[0]) if configs else package_config(DEFAULT_CONFIG)
    model = config.get("model")
    if not isinstance(model, dict) or model.get("backbone") != "DiT" or not isinstance(model.get("arch"), dict):
        where = configs[0] if configs else f"{DEFAULT_CONFIG}.yaml"
        raise CheckpointError(f"{where}: expected an F5-TTS model config with model.backbone DiT and model.arch")
    if model.get("mel_spec", {}).get("mel_spec_type", "vocos") != "vocos":
        raise CheckpointError(f"{folder}: only the Vocos mel (mel_spec_type: vocos) is supported")
    return model


def read_vocab(path: Path) -> dict[str, int]:
    """vocab.txt as upstream reads it (one token a line; index = line number)."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc})") from exc
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise CheckpointError(f"{path}: empty vocabulary")
    return {token: i for i, token in enumerate(lines)}


def load_flow(folder: Path, dtype: torch.dtype) -> tuple[nn.Module, dict[str, Any]]:
    """`f5_tts.model.CFM` with its DiT, built on meta in `dtype` and filled from the folder (M27)."""
    weights, vocab_path, _ = check_layout(folder)
    config = model_config(folder)
    modules = import_upstream()
    vocab = read_vocab(vocab_path)
    mel = config.get("mel_spec", {})
    arch = {k: v for k, v in config["arch"].items() if k != "checkpoint_activations"}
    mel_kwargs = dict(n_fft=mel.get("n_fft", 1024), hop_length=mel.get("hop_length", HOP),
                      win_length=mel.get("win_length", 1024), n_mel_channels=mel.get("n_mel_channels", 100),
                      target_sample_rate=mel.get("target_sample_rate", SAMPLE_RATE), mel_spec_type="vocos")

    def build() -> nn.Module:
        try:
            dit = modules.DiT(**arch, text_num_embeds=len(vocab), mel_dim=mel_kwargs["n_mel_channels"])
        except TypeError as exc:
            raise CheckpointError(f"{folder}: model.arch does not fit F5-TTS's DiT ({exc})") from exc
        return modules.CFM(transformer=dit, mel_spec_kwargs=mel_kwargs, odeint_kwargs={"method": "euler"},
                           vocab_char_map=vocab)

    cfm = build_on_meta(build, dtype)
    load_safetensors(cfm, weights, prefix=EMA_PREFIX)
    # Upstream runs the model `.to(dtype)`: floating buffers (text positions, rotary frequencies)
    # in the run precision too, else half-precision convolutions meet float32 inputs. The
    # parameters are already in `dtype` (nothing is copied for them).
    return cfm.to(dtype).eval(), mel_kwargs


def load_vocoder(folder: Path) -> nn.Module:
    """Vocos from the published ``config.yaml`` + ``pytorch_model.bin``, float32 as shipped."""
    config = read_yaml(folder / "config.yaml")
    classes = vocos_classes()
    parts = {}
    for part in ("feature_extractor", "backbone", "head"):
        spec = config.get(part)
        if not isinstance(spec, dict) or spec.get("class_path") not in classes:
            raise CheckpointError(f"{folder / 'config.yaml'}: {part}.class_path must be one of "
                                  f"{', '.join(sorted(classes))}, got {spec.get('class_path') if isinstance(spec, dict) else spec!r}")
        parts[part] = (classes[spec["class_path"]], spec.get("init_args") or {})
    from vocos import Vocos

    def build() -> nn.Module:
        return Vocos(**{part: cls(**args) for part, (cls, args) in parts.items()})

    vocoder = build_on_meta(build, torch.float32)
    state = load_weights_only(folder / "pytorch_model.bin", mmap=True)
    expected = vocoder.state_dict(keep_vars=True)
    wanted = {k: v for k, v in state.items() if not k.startswith("feature_extractor.")}  # the mel is computed by F5
    missing = sorted(set(expected) - set(wanted) - {k for k in expected if k.startswith("feature_extractor.")})
    unexpected = sorted(set(wanted) - set(expected))
    mismatched = [f"{k}: checkpoint {tuple(v.shape)}, model {tuple(expected[k].shape)}"
                  for k, v in wanted.items() if k in expected and tuple(v.shape) != tuple(expected[k].shape)]
    if missing or unexpected or mismatched:
        raise CheckpointError(f"{folder / 'pytorch_model.bin'} does not match Vocos: " + "; ".join(
            [f"missing {k}" for k in missing] + [f"unexpected {k}" for k in unexpected] + mismatched))
    for name, tensor in expected.items():
        value = wanted.get(name)
        if value is None:  # feature-extractor buffers: computed at construction for real
            continue
        module_name, _, attr = name.rpartition(".")
        module = vocoder.get_submodule(module_name)
        copy = torch.empty(tensor.shape, dtype=tensor.dtype)
        copy.copy_(value)
        if attr in module._parameters:
            module._parameters[attr] = nn.Parameter(copy, requires_grad=False)
        else:
            module._buffers[attr] = copy
    left = [n for n, t in vocoder.state_dict().items() if t.is_meta]
    if left:
        raise CheckpointError(f"{folder / 'pytorch_model.bin'}: tensors not in the checkpoint: {', '.join(left)}")
    return vocoder.eval()


class F5TTSEngine(Engine):
    """F5-TTS in three phases: voice prompt, flow, vocoder (M1)."""

    id = "f5tts"
    title = "F5-TTS"
    PHASED = True
    sample_rate = SAMPLE_RATE
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
            raise CheckpointError("f5tts needs a checkpoint folder (the F5TTS_v1_Base layout: model_<step>.safetensors, "
                                  f"vocab.txt, {VOCODER_FOLDER}/)")
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
            raise MizuotoError("f5tts: the voice has no reference mel; make it with voice_prompt(reference=…, transcript=…)")
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

    # ---- vocoder ---------------------------------------------------------------------------
    def vocoder_memory(self, frames: int) -> int:
        """M45: Vocos's working memory for `frames` mel frames (float32)."""
        backbone = self.vocos.backbone
        width = backbone.embed.out_channels
        inner = backbone.convnext[0].pwconv1.out_features if len(backbone.convnext) else width
        per_frame = 4 * (VOCOS_BLOCK_COPIES * width + 2 * inner + self.vocos.head.out.out_features)
        return frames * (per_frame + VOCOS_BYTES_PER_SAMPLE * self.hop)

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
