"""LoRA for training: low-rank adapters on `nn.Linear` layers, and saving them as a LoRA file
(the format `nn.lora` reads and merges).

Training wraps each target `nn.Linear` in a `LoraLinear` (the base layer frozen, ``lora_A``
Kaiming-initialised and ``lora_B`` zero, so training starts from the base model exactly):
``y = base(x) + (alpha / rank) · B(A(x))``.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import nn

from ...errors import MizuotoError
from ...nn.lora import A_SUFFIX, B_SUFFIX, FORMAT, VERSION


class LoraLinear(nn.Module):
    """A frozen `nn.Linear` plus a trainable low-rank update."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.base = base
        self.rank, self.alpha = rank, alpha
        self.scale = alpha / rank
        device = base.weight.device
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, device=device, dtype=dtype)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, device=device, dtype=dtype)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))) * self.scale
        return self.base(x) + update.to(x.dtype)


def inject(root: nn.Module, prefix: str, wanted: Callable[[str, nn.Linear], bool], rank: int, alpha: float,
           dtype: torch.dtype) -> dict[str, LoraLinear]:
    """Wrap every `nn.Linear` under `root` that `wanted(path, layer)` picks; freeze the rest.
    Returns the adapters by their path in the engine's model (`prefix` + path under `root`)."""
    if rank < 1:
        raise MizuotoError(f"LoRA rank must be at least 1, got {rank}")
    for p in root.parameters():
        p.requires_grad_(False)
    found = [(name, m) for name, m in root.named_modules() if isinstance(m, nn.Linear) and wanted(name, m)]
    if not found:
        raise MizuotoError(f"no linear layer under {prefix or type(root).__name__} matches the LoRA targets")
    adapters: dict[str, LoraLinear] = {}
    for name, layer in found:
        parent_name, _, attr = name.rpartition(".")
        parent = root.get_submodule(parent_name) if parent_name else root
        adapter = LoraLinear(layer, rank, alpha, dtype)
        setattr(parent, attr, adapter)
        adapters[prefix + name] = adapter
    return adapters


def lora_parameters(adapters: Mapping[str, LoraLinear]) -> list[nn.Parameter]:
    return [p for a in adapters.values() for p in (a.lora_A.weight, a.lora_B.weight)]


def save_lora(path: str | Path, adapters: Mapping[str, LoraLinear], metadata: Mapping[str, str]) -> Path:
    """Write the adapters as a LoRA file (float32; see the module docstring)."""
    from safetensors.torch import save_file

    first = next(iter(adapters.values()))
    tensors: dict[str, torch.Tensor] = {}
    for name, a in adapters.items():
        tensors[name + A_SUFFIX] = a.lora_A.weight.detach().float().cpu().contiguous()
        tensors[name + B_SUFFIX] = a.lora_B.weight.detach().float().cpu().contiguous()
    meta = {"format": FORMAT, "version": VERSION, "rank": str(first.rank), "alpha": repr(first.alpha),
            **{k: str(v) for k, v in metadata.items()}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)  # a reader never sees half a file
    return path
