"""Reading IndexTTS-2's published folder: config.yaml and the .pth / .pt files.

Every torch file loads with `weights_only=True`. Layout (as users download it):
config.yaml, gpt.pth, s2mel.pth ({"net": {...}}), bpe.model, feat1.pt, feat2.pt,
wav2vec2bert_stats.pt, qwen0.6bemo4-merge/, and the auxiliary models under hf_cache/.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import MizuotoError
from ...nn.checkpoint import load_weights_only
from ...nn.weight_norm import fold_state_dict

# Keys a real gpt.pth may hold that the model does not read: GPT-2's unused token and position
# tables, the causal-mask buffers older transformers saved, the inference wrapper's aliases.
IGNORED_GPT_KEYS = re.compile(r"^(inference_model\.|gpt\.wte\.|gpt\.wpe\.|gpt\.h\.\d+\.attn\.(bias|masked_bias)$)")


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.yaml"
    if not path.is_file():
        raise MizuotoError(f"IndexTTS-2 checkpoint folder {folder} has no config.yaml")
    import yaml  # an engine requirement: imported when a checkpoint loads, not when the engine table does

    with path.open(encoding="utf-8") as f:
        cfg = yaml.safe_load(f)
    if not isinstance(cfg, dict) or "gpt" not in cfg:
        raise MizuotoError(f"{path}: not an IndexTTS-2 config (no 'gpt' section)")
    return cfg


def load_torch(path: Path) -> Any:
    if not path.is_file():
        raise MizuotoError(f"IndexTTS-2 checkpoint file missing: {path}")
    return load_weights_only(path)


def load_into(module: nn.Module, state: dict[str, torch.Tensor], source: str,
              ignore: re.Pattern[str] | None = None) -> None:
    """Strict load with one clear error naming missing, unexpected and mis-shaped tensors.
    Weight-norm pairs are folded into plain weights first (the models hold plain layers)."""
    state = fold_state_dict(state)
    own = module.state_dict()
    unexpected = [k for k in state if k not in own and not (ignore and ignore.match(k))]
    missing = [k for k in own if k not in state]
    shapes = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
              for k in own if k in state and state[k].shape != own[k].shape]
    if unexpected or missing or shapes:
        raise MizuotoError(f"{source}: does not match the model built from config.yaml: "
                           f"missing {missing[:8]}, unexpected {unexpected[:8]}, shapes {shapes[:8]}")
    module.load_state_dict({k: v for k, v in state.items() if k in own}, strict=True)
