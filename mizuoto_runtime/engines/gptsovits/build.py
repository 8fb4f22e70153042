"""Building GPT-SoVITS's modules from their weight files: each module's sizes come from the file's
own config (the T2S ``config["model"]``, the SoVITS ``hps``, the speaker model's tensors), and its
tensors are checked against them, every mismatch one `CheckpointError` naming file and tensor."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ...errors import CheckpointError
from ...nn.checkpoint import load_weights_only
from .sv import ERes2NetV2, config_for
from .t2s import T2SConfig, Text2Semantic, load_state
from .vits import Synthesizer, VitsConfig
from .weights import GptFile, SovitsFile


def build_t2s(gpt: GptFile, dtype: torch.dtype = torch.float32) -> Text2Semantic:
    try:
        model = Text2Semantic(T2SConfig.from_checkpoint(gpt.config["model"], str(gpt.path)))
        load_state(model, gpt.weights, str(gpt.path))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    return model.to(dtype).eval()


def vits_config(sovits: SovitsFile) -> VitsConfig:
    try:
        sv = sovits.weights.get("sv_emb.weight")
        return VitsConfig.from_hparams(sovits.model, sovits.data, sovits.version, str(sovits.path),
                                       sv.shape[1] if sv is not None else 20480)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(str(exc)) from None


def build_vits(sovits: SovitsFile, dtype: torch.dtype = torch.float32) -> Synthesizer:
    model = Synthesizer(vits_config(sovits))
    fill_strict(model, sovits.weights, sovits.path)
    return model.to(dtype).eval()


def fill_strict(model: nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """``load_state_dict(strict=True)`` with one error naming the file and the first tensors at fault."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [f"{k} {tuple(state[k].shape)} (expected {tuple(t.shape)})" for k, t in expected.items()
             if k in state and state[k].shape != t.shape]
    if missing or unexpected or wrong:
        parts = [f"missing {', '.join(missing[:4])}" if missing else "",
                 f"unexpected {', '.join(unexpected[:4])}" if unexpected else "",
                 f"wrong shape {', '.join(wrong[:3])}" if wrong else ""]
        raise CheckpointError(f"{path}: tensors do not match the model its config describes: "
                              + "; ".join(p for p in parts if p))
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)


def read_sv_state(path: Path) -> dict[str, torch.Tensor]:
    """The speaker model's plain state dict (``sv/pretrained_eres2netv2w24s4ep4.ckpt``)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such speaker-verification (ERes2NetV2) file")
    state = load_weights_only(path)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: not an ERes2NetV2 state dict")
    return state


def build_sv(state: dict[str, torch.Tensor], path: Path, dtype: torch.dtype = torch.float32) -> ERes2NetV2:
    try:
        model = ERes2NetV2(config_for(state, str(path)))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    fill_strict(model, state, path)
    return model.to(dtype).eval()
