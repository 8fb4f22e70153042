"""LoRA fine-tuning of the Qwen3-TTS talker, from a folder of (audio, transcript) clips.

The base is a **Base** checkpoint (it has the codec encoder and speaker encoder that turn the
clips into training targets). The LoRA it writes applies to that checkpoint's engine
(`Engine.use_lora`, its `LORA` adapter) and is used with voice cloning, as the clips were.

**Data** (phase ``prepare``, in the engine's own phases on the training device): each clip's
codec codes (the engine's codec encoder, 16 codebooks per 12.5 Hz frame) and its x-vector (the
speaker encoder). Then the talker's input for that clip is built **by the package itself**:
the engine's x-vector-clone prompt is passed to `Qwen3TTSForConditionalGeneration.generate`,
whose prefill is captured and stopped before any step runs. So training sees exactly the
sequence generation sees: the prompt (role, codec tags, x-vector, first text token + codec
BOS), then one position per frame, each the sum of the frame's 16 codebook embeddings plus the
next text token's embedding (the pad embedding once the text is used up).

**Loss** (the official recipe's): cross-entropy of the talker's codebook-0 logits (each
position predicts the next frame's first code, the last one end-of-speech) + 0.3 × the code
predictor's cross-entropy on codebooks 1–15, teacher-forced from the talker's hidden state
(`forward_sub_talker_finetune`'s inputs; the loss is computed here, codebook i against logit
i-1, because that method's own loss shifts labels like a causal LM).

**Adapters**: LoRA on every linear layer of the talker's decoder layers and of the code
predictor's layers (``targets``); everything else frozen. Memory tools per `training.memory`
(M61). The file records what trained it.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...engines.base import Voice
from ...engines.qwen3tts.checkpoint import check_layout, import_upstream
from ...errors import MizuotoError
from ...nn.dtypes import DTYPES
from ...nn.loading import SafetensorsFile
from ..runtime import Runtime
from .dataset import Clip, load_audio, read_clips
from .estimate import MethodInfo
from .lora import LoraLinear, inject, lora_parameters, save_lora
from .memory import TOOLS, MemoryPlan, activations, enable_checkpointing, make_optimizer, trainable_dtype
from .meter import PeakMeter, current_rss
from .peaks import QWEN3TTS_LORA_PEAKS

log = logging.getLogger(__name__)

METHOD = "qwen3tts_lora"
ENGINE = "qwen3tts"
TARGETS = ("talker", "code_predictor")
IGNORE = -100
Emit = Callable[..., None]

DEFAULTS: dict[str, Any] = {
    "steps": 200, "batch_size": 1, "lr": 1e-4, "rank": 8, "alpha": 16.0, "weight_decay": 0.0,
    "max_grad_norm": 1.0, "seed": 0, "language": "auto", "dtype": "auto", "targets": "talker,code_predictor",
    "sub_talker_weight": 0.3,
}
INFO = MethodInfo(
    id=METHOD, title="Qwen3-TTS talker LoRA", engine=ENGINE, defaults=DEFAULTS, peaks=QWEN3TTS_LORA_PEAKS,
    batch_scales=True,  # measured (peaks.py): the tiny talker's train peak grows 11-41 % from batch 1 to 2
)


# ---- parameters (checked by the host before the job starts) ------------------------------------
def check(params: Mapping[str, Any]) -> dict[str, Any]:
    """The job's parameters with defaults filled in; one error names a bad one."""
    known = {*DEFAULTS, *TOOLS, "model", "data", "output"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise MizuotoError(f"{METHOD}: unknown parameter {unknown[0]!r}; known: {', '.join(sorted(known))}")
    out = {**DEFAULTS, **{k: v for k, v in params.items() if v is not None}}
    for key in ("model", "data", "output"):
        if not out.get(key):
            raise MizuotoError(f"{METHOD}: parameter {key!r} is required")
    folder = Path(out["model"])
    config = check_layout(folder)
    if config.get("tts_model_type") != "base":
        raise MizuotoError(f"{METHOD}: {folder} is a {config.get('tts_model_type')!r} checkpoint; training needs a "
                           "Base checkpoint (its codec and speaker encoders turn the clips into targets)")
    read_clips(out["data"])
    if Path(out["output"]).suffix != ".safetensors":
        raise MizuotoError(f"{METHOD}: output {out['output']!r} must be a .safetensors file")
    for key in ("steps", "batch_size", "rank"):
        if not isinstance(out[key], int) or isinstance(out[key], bool) or out[key] < 1:
            raise MizuotoError(f"{METHOD}: parameter {key!r} must be a positive integer, got {out[key]!r}")
    for key in ("lr", "alpha", "weight_decay", "max_grad_norm", "sub_talker_weight"):
        if not isinstance(out[key], (int, float)) or isinstance(out[key], bool) or out[key] < 0:
            raise MizuotoError(f"{METHOD}: parameter {key!r} must be a number >= 0, got {out[key]!r}")
    if out["dtype"] != "auto" and out["dtype"] not in DTYPES:
        raise MizuotoError(f"{METHOD}: dtype must be auto or one of {', '.join(DTYPES)}, got {out['dtype']!r}")
    _targets(out["targets"])
    out["model"], out["data"], out["output"] = str(folder), str(out["data"]), str(out["output"])
    return out


def _targets(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in str(text).split(",") if t.strip())
    bad = [t for t in names if t not in TARGETS]
    if not names or bad:
        raise MizuotoError(f"{METHOD}: targets must be a comma-separated subset of {', '.join(TARGETS)}, got {text!r}")
    return names


def model_params(params: Mapping[str, Any]) -> int:
    """Parameters in the checkpoint's main weights (model.safetensors): the size estimates scale by."""
    with SafetensorsFile(Path(params["model"]) / "model.safetensors") as f:
        return sum(math.prod(shape) for _, shape, _, _ in f.entries.values())


# ---- data ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Sample:
    """One clip as the talker sees it: input embeddings and where the targets are."""

    name: str
    embeds: torch.Tensor  # (positions, hidden): the prompt, then one position per frame
    codes: torch.Tensor  # (frames, 16)
    prompt: int  # positions of the prompt

    @property
    def frames(self) -> int:
        return self.codes.shape[0]


class _Captured(Exception):
    """Stops `generate` at its prefill, once its inputs are known."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        super().__init__("prefill captured")
        self.kwargs = kwargs


def generation_inputs(model: nn.Module, inputs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prefill embeddings (1, P, D), trailing text embeddings (1, L, D) and pad embedding
    (1, 1, D) that the package's `generate` gives its talker for `inputs`."""
    def capture(_module: nn.Module, _args: Any, kwargs: dict[str, Any]) -> None:
        raise _Captured(kwargs)

    hook = model.talker.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        model.generate(**inputs, max_new_tokens=2, do_sample=False, subtalker_dosample=False)
    except _Captured as got:
        kw = got.kwargs
        return kw["inputs_embeds"], kw["trailing_text_hidden"], kw["tts_pad_embed"]
    finally:
        hook.remove()
    raise MizuotoError("qwen3tts: generate never ran its talker")


@torch.no_grad()
def frame_embeddings(talker: nn.Module, codes: torch.Tensor) -> torch.Tensor:
    """(frames, hidden): each frame's 16 codebook embeddings summed, as generation feeds them back."""
    groups = talker.config.num_code_groups
    parts = [talker.get_input_embeddings()(codes[:, :1])]
    parts += [talker.code_predictor.get_input_embeddings()[i](codes[:, i + 1:i + 2]) for i in range(groups - 1)]
    return torch.cat(parts, dim=1).sum(1)


def teacher_forced(prefill: torch.Tensor, trailing: torch.Tensor, pad: torch.Tensor,
                   frames: torch.Tensor) -> torch.Tensor:
    """The whole sequence: the prompt, then frame k's embedding plus text position k (or pad)."""
    count = frames.shape[0]
    text = trailing[0, :count]
    if text.shape[0] < count:
        text = torch.cat([text, pad[0].expand(count - text.shape[0], -1)])
    return torch.cat([prefill[0], frames.to(prefill.dtype) + text])


def prepare(engine: Any, runtime: Runtime, clips: list[Clip], language: str, seed: int) -> list[Sample]:
    """Codes and x-vector of each clip (the engine's voice-prompt phases), then the talker's
    inputs as generation builds them (a talker phase)."""
    samples = []
    for clip in clips:
        ctx = runtime.request(seed)
        voice = engine.encode_voice(ctx, load_audio(clip.audio), clip.transcript, None)  # ICL: codes + x-vector
        codes = voice["ref_code"]
        if codes is None or codes.shape[0] < 1:
            raise MizuotoError(f"{clip.audio}: too short to give a single codec frame")
        samples.append(ctx.run("talker", [engine.talker],
                               functools.partial(_sample, engine, clip, codes, voice["spk"], language), 0))
    return samples


def _sample(engine: Any, clip: Clip, codes: torch.Tensor, spk: torch.Tensor, language: str) -> Sample:
    """A clip's talker inputs: the engine's x-vector clone prompt, as `generate` builds it."""
    voice = Voice(f"train:{clip.name}", {"ref_code": None, "spk": spk, "ref_text": None}, ENGINE)
    model = engine.tts.model
    prefill, trailing, pad = generation_inputs(model, engine._prompt(clip.transcript, voice, language))
    frames = frame_embeddings(model.talker, codes.to(prefill.device))
    return Sample(clip.name, teacher_forced(prefill, trailing, pad, frames).cpu(), codes.cpu(), prefill.shape[1])


@dataclasses.dataclass
class Batch:
    embeds: torch.Tensor  # (B, S, D), right-padded
    mask: torch.Tensor  # (B, S)
    targets: torch.Tensor  # (B, S): what each position predicts (IGNORE where nothing)
    rows: torch.Tensor  # (N,) and
    cols: torch.Tensor  # (N,): the position that predicts each frame's first code
    codes: torch.Tensor  # (N, 16): those frames


def collate(samples: list[Sample], eos: int, device: torch.device, dtype: torch.dtype) -> Batch:
    length = max(s.embeds.shape[0] for s in samples)
    hidden = samples[0].embeds.shape[1]
    embeds = torch.zeros(len(samples), length, hidden, dtype=dtype)
    mask = torch.zeros(len(samples), length, dtype=torch.long)
    targets = torch.full((len(samples), length), IGNORE, dtype=torch.long)
    rows, cols, codes = [], [], []
    for i, s in enumerate(samples):
        n = s.embeds.shape[0]
        embeds[i, :n] = s.embeds
        mask[i, :n] = 1
        first = s.prompt - 1  # the prompt's last position predicts frame 0
        targets[i, first:first + s.frames] = s.codes[:, 0]
        targets[i, first + s.frames] = eos  # the last frame's position predicts the end
        rows.append(torch.full((s.frames,), i))
        cols.append(torch.arange(first, first + s.frames))
        codes.append(s.codes)
    return Batch(embeds.to(device), mask.to(device), targets.to(device), torch.cat(rows).to(device),
                 torch.cat(cols).to(device), torch.cat(codes).to(device))


def loss_of(talker: nn.Module, batch: Batch, sub_talker_weight: float) -> tuple[torch.Tensor, float, float]:
    """Codebook-0 cross-entropy + weight × codebooks 1–15 cross-entropy; also both parts."""
    out = talker(inputs_embeds=batch.embeds, attention_mask=batch.mask, use_cache=False, output_hidden_states=True)
    main = F.cross_entropy(out.logits.float().flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE)
    hidden = out.hidden_states[0][-1][batch.rows, batch.cols]
    sub_logits, _ = talker.forward_sub_talker_finetune(batch.codes, hidden)
    sub = F.cross_entropy(sub_logits.float().flatten(0, 1), batch.codes[:, 1:].flatten())
    return main + sub_talker_weight * sub, float(main.detach()), float(sub.detach())


# ---- training ------------------------------------------------------------------------------------
def add_adapters(talker: nn.Module, targets: tuple[str, ...], rank: int, alpha: float,
                 dtype: torch.dtype) -> dict[str, LoraLinear]:
    """LoRA on the linear layers of the talker's decoder layers and/or the code predictor's."""
    roots = {"talker": "model.layers.", "code_predictor": "code_predictor.model.layers."}
    wanted = tuple(roots[t] for t in targets)
    return inject(talker, "talker.", lambda name, _layer: name.startswith(wanted), rank, alpha, dtype)


def batches(count: int, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """Which samples each step trains on: shuffled epochs, a fixed order for a seed."""
    gen = torch.Generator().manual_seed(seed)
    order: list[int] = []
    out = []
    for _ in range(steps):
        if len(order) < batch_size:
            order += torch.randperm(count, generator=gen).tolist() * max(1, math.ceil(batch_size / count))
        out.append(order[:batch_size])
        order = order[batch_size:]
    return out


def train(talker: nn.Module, samples: list[Sample], params: Mapping[str, Any], plan: MemoryPlan,
          device: torch.device, emit: Emit) -> tuple[dict[str, LoraLinear], list[float]]:
    """Add the adapters and train them; returns them and the loss of every step."""
    run_dtype = next(talker.parameters()).dtype
    torch.manual_seed(params["seed"])
    adapters = add_adapters(talker, _targets(params["targets"]), params["rank"], params["alpha"],
                            trainable_dtype(plan, run_dtype))
    enable_checkpointing(talker, plan)
    # The code predictor's training forward leaves caching to its config: no KV cache in training.
    talker.config.use_cache = talker.code_predictor.config.use_cache = False
    talker.train()
    optimizer = make_optimizer(lora_parameters(adapters), plan, params["lr"], params["weight_decay"])
    eos = talker.config.codec_eos_token_id
    losses = []
    steps = params["steps"]
    for step, picked in enumerate(batches(len(samples), params["batch_size"], steps, params["seed"]), start=1):
        started = time.perf_counter()
        batch = collate([samples[i] for i in picked], eos, device, run_dtype)
        with activations(plan, device):
            loss, main, sub = loss_of(talker, batch, params["sub_talker_weight"])
        loss.backward()
        norm = optimizer.step(params["max_grad_norm"] or None)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise MizuotoError(f"{METHOD}: the loss is {value} at step {step}; lower lr")
        losses.append(value)
        emit(event="step", step=step, steps=steps, loss=value, talker_loss=main, code_predictor_loss=sub,
             grad_norm=norm, seconds=time.perf_counter() - started)
    talker.eval()
    return adapters, losses


def run(params: Mapping[str, Any], plan: MemoryPlan, device: torch.device, settings: Mapping[str, Any],
        emit: Emit) -> dict[str, Any]:
    """The training process's work: prepare, train, write the LoRA file."""
    import_upstream()
    baseline_rss = current_rss()  # peaks count from here: the packages are imported, no model yet
    dtype = params["dtype"] if params["dtype"] != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    runtime = Runtime(settings)
    clips = read_clips(params["data"])
    peaks: dict[str, float] = {}
    with PeakMeter(device, baseline_rss) as meter:
        engine = runtime.engine(ENGINE, params["model"], dtype, device)
        samples = prepare(engine, runtime, clips, "Auto" if params["language"] == "auto" else params["language"],
                          params["seed"])
    peaks["prepare"] = meter.peak_mb
    emit(event="phase", name="prepare", **{"memory/peak_mb": meter.peak_mb})
    runtime.service.release_device(device)  # the encoders leave; training owns the device
    talker = engine.tts.model.talker.to(device)
    with PeakMeter(device, baseline_rss) as meter:
        adapters, losses = train(talker, samples, params, plan, device, emit)
    peaks["train"] = meter.peak_mb
    emit(event="phase", name="train", **{"memory/peak_mb": meter.peak_mb})
    config = engine.tts.model.config.talker_config
    output = save_lora(params["output"], adapters, {
        "engine": ENGINE, "method": METHOD, "base_model": Path(params["model"]).name,
        "talker_hidden_size": config.hidden_size, "talker_layers": config.num_hidden_layers,
        "clips": len(samples), "steps": params["steps"], "final_loss": f"{losses[-1]:.6f}",
        "training_memory": plan.preset, "dtype": dtype,
    })
    return {"output": str(output), "losses": losses, "clips": len(samples), "dtype": dtype,
            "memory/peak_mb": peaks, "memory": plan.describe()}
