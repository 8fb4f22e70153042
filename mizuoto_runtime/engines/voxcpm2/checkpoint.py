"""VoxCPM 2's checkpoint folder: the official layout (`check_layout`), and loading it through the
`voxcpm` package's model classes (`load_model`: everything but the audio VAE built on meta in the
run dtype and filled from ``model.safetensors``; the VAE in float32 from its own file, M27)."""
from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from ...errors import CheckpointError, MizuotoError
from ...nn.checkpoint import load_weights_only
from ...nn.dtypes import DTYPE_NAMES
from ...nn.loading import load_safetensors, parameters_on_meta, reading_weights
from ..checkpoint_files import read_json
from ..upstream import TORCH_JIT_SCRIPT, ImportNoise, quiet_import

ARCHITECTURE = "voxcpm2"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
VAE_FILES = ("audiovae.safetensors", "audiovae.pth")  # the package's order of preference


# ---- the upstream package ------------------------------------------------------------------
def import_upstream() -> None:
    """Import `voxcpm` (an optional extra); its VAE module's `torch.jit.script` warns (dropped)."""
    quiet_import("voxcpm", ImportNoise(warnings=(TORCH_JIT_SCRIPT,)))


def check_layout(folder: Path) -> dict[str, Any]:
    """The folder's config.json, after checking it is an official VoxCPM 2 folder."""
    if not folder.is_dir():
        raise CheckpointError(f"VoxCPM 2 checkpoint folder not found: {folder}")
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if not any((folder / name).is_file() for name in VAE_FILES):
        missing.append(" or ".join(VAE_FILES))
    if missing:
        raise CheckpointError(f"{folder}: not a VoxCPM 2 checkpoint folder, missing {', '.join(missing)} "
                              "(expected the layout of openbmb/VoxCPM2)")
    config = read_json(folder / "config.json")
    arch = str(config.get("architecture", "voxcpm")).lower()
    if arch != ARCHITECTURE:
        raise CheckpointError(f"{folder / 'config.json'}: architecture is {arch!r}, expected {ARCHITECTURE!r} "
                              "(VoxCPM 1.x checkpoints are not supported by this engine)")
    return config


def _model_config(folder: Path, dtype: torch.dtype) -> Any:
    from pydantic import ValidationError
    from voxcpm.model.voxcpm2 import VoxCPMConfig

    try:
        config = VoxCPMConfig.model_validate_json((folder / "config.json").read_text(encoding="utf-8"))
    except ValidationError as exc:
        raise CheckpointError(f"{folder / 'config.json'}: not a valid VoxCPM 2 config ({exc})") from exc
    config.dtype = DTYPE_NAMES[dtype]  # the package casts its inputs to this
    config.max_length = 0  # no cache at construction: each generate phase builds its own
    return config


def weight_norm_names(module: nn.Module) -> list[str]:
    """The weights legacy weight norm computes for `module` (not its children) before each forward."""
    from torch.nn.utils.weight_norm import WeightNorm

    return [h.name for h in module._forward_pre_hooks.values() if isinstance(h, WeightNorm)]


def drop_computed_weights(module: nn.Module) -> None:
    """Replace the weights legacy weight norm computed for `module` with meta placeholders: its
    pre-hook computes them again before the next forward."""
    for name in weight_norm_names(module):
        computed = getattr(module, name)
        setattr(module, name, torch.empty(computed.shape, dtype=computed.dtype, device="meta"))


def _load_vae(vae: nn.Module, folder: Path) -> None:
    """The VAE's weights: `audiovae.safetensors` memory-mapped, else `audiovae.pth` (weights only)."""
    if not reading_weights():  # a shapes-only build (engines.published)
        return
    safetensors = folder / VAE_FILES[0]
    if safetensors.is_file():
        load_safetensors(vae, safetensors)
        return
    path = folder / VAE_FILES[1]
    loaded = load_weights_only(path, mmap=True)
    state = loaded.get("state_dict", loaded) if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a state dict of tensors")
    try:
        vae.load_state_dict(state, strict=True)  # copies out of the mapping, tensor by tensor
    except RuntimeError as exc:
        raise CheckpointError(f"{path}: does not match the audio VAE: {' '.join(str(exc).split())}") from exc


def load_model(folder: Path, dtype: torch.dtype, device: torch.device) -> Any:
    """A `voxcpm` `VoxCPM2Model` built on meta in `dtype` and filled from the folder (M27)."""
    if dtype not in DTYPE_NAMES:
        raise MizuotoError(f"voxcpm2 runs in {', '.join(DTYPE_NAMES.values())}, not {dtype}")
    check_layout(folder)
    import_upstream()
    from transformers import LlamaTokenizerFast
    from voxcpm.model.voxcpm2 import VoxCPM2Model
    from voxcpm.modules.audiovae import AudioVAEConfigV2, AudioVAEV2

    config = _model_config(folder, dtype)
    try:
        # A shapes-only build (engines.published) reads configs alone: the model's constructor
        # only lists the vocabulary's tokens, of which it then has none.
        tokenizer = LlamaTokenizerFast.from_pretrained(str(folder)) if reading_weights() else SimpleNamespace(vocab={})
    except (OSError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{folder / 'tokenizer.json'}: cannot be loaded as the model's tokenizer "
                              f"({exc})") from exc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.nn.utils.weight_norm is deprecated
        # Float32, as it runs, and built for real: weight norm's set-up is slow on meta tensors
        # (~50 ms a conv), and a float32 module has no precision to save.
        vae = AudioVAEV2(config=config.audio_vae_config or AudioVAEConfigV2())
        for module in vae.modules():
            # Weight norm computed every normed layer's weight at construction, from the initial
            # values: a second copy of the VAE (0.35 GB published) until its first forward (issue 35).
            drop_computed_weights(module)
        with parameters_on_meta():
            model = VoxCPM2Model(config, tokenizer, vae, device="cpu")
    # As the package's from_local: everything but the VAE in the run dtype, on meta, so
    # converting costs nothing; floating buffers (rotary tables) convert for real.
    view = nn.ModuleDict({name: child for name, child in model.named_children() if name != "audio_vae"})
    view.to(dtype)
    load_safetensors(view, folder / "model.safetensors")
    _load_vae(model.audio_vae, folder)
    for lm in (model.base_lm, model.residual_lm):
        lm.kv_cache = None  # built per generate phase, at the request's size
    model.device = str(device)  # the package moves its inputs there
    model.eval()
    return model
