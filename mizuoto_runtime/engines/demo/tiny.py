"""The demo engine's checkpoint writer: its random weights as one safetensors file per component."""
from __future__ import annotations

from pathlib import Path

import torch

from ..tiny import one_version
from .model import random_weights


def write(directory: str | Path, *, version: str | None = None, seed: int = 1234,
          dtype: torch.dtype | None = None) -> Path:
    """Write the demo's components as `<name>.safetensors` (for the loading path, M27);
    `dtype`: float32 when None."""
    from safetensors.torch import save_file

    one_version(version)
    dtype = torch.float32 if dtype is None else dtype
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, module in random_weights(seed).items():
        state = {k: v.to(dtype).contiguous() for k, v in module.state_dict().items()}
        save_file(state, str(directory / f"{name}.safetensors"))
    return directory
