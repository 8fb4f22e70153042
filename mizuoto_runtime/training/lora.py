"""LoRA: low-rank adapters on `nn.Linear` layers, for training, and the file they are saved in.

Training wraps each target `nn.Linear` in a `LoraLinear` (the base layer frozen, ``lora_A``
Kaiming-initialised and ``lora_B`` zero, so training starts from the base model exactly):
``y = base(x) + (alpha / rank) · B(A(x))``.

The file (safetensors): for every adapted layer, by its path in the engine's model
(``talker.model.layers.0.self_attn.q_proj``), ``<path>.lora_A.weight`` (rank × in) and
``<path>.lora_B.weight`` (out × rank), float32; metadata ``format = mizuoto-lora``,
``version``, ``engine``, ``rank``, ``alpha``, and what trained it. Applying it merges
``W + strength · (alpha / rank) · B @ A`` into the weights (`merged_weight`): the model then
runs its plain layers, so every placement computes exactly the same (M57).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import nn

from ..errors import CheckpointError, MizuotoError

FORMAT = "mizuoto-lora"
VERSION = "1"
_A, _B = ".lora_A.weight", ".lora_B.weight"


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
        tensors[name + _A] = a.lora_A.weight.detach().float().cpu().contiguous()
        tensors[name + _B] = a.lora_B.weight.detach().float().cpu().contiguous()
    meta = {"format": FORMAT, "version": VERSION, "rank": str(first.rank), "alpha": repr(first.alpha),
            **{k: str(v) for k, v in metadata.items()}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)  # a reader never sees half a file
    return path


@dataclasses.dataclass(frozen=True)
class LoraFile:
    """A LoRA file's adapters: per layer path, (A, B) in float32."""

    path: Path
    rank: int
    alpha: float
    metadata: dict[str, str]
    layers: dict[str, tuple[torch.Tensor, torch.Tensor]]

    def delta(self, layer: str, strength: float) -> torch.Tensor:
        """The layer's weight update, float32: strength · (alpha / rank) · B @ A."""
        a, b = self.layers[layer]
        return (b @ a) * (strength * self.alpha / self.rank)


def read_lora(path: str | Path, engine: str) -> LoraFile:
    """Read and check a LoRA file made for `engine`; one `CheckpointError` names what is wrong."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"LoRA file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path}: not a safetensors file ({exc})") from exc
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a Mizuoto LoRA file (metadata format={meta.get('format')!r}, "
                              f"expected {FORMAT!r})")
    if meta.get("engine") != engine:
        raise CheckpointError(f"{path}: a LoRA for engine {meta.get('engine')!r}, not {engine!r}")
    try:
        rank, alpha = int(meta["rank"]), float(meta["alpha"])
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"{path}: metadata rank/alpha missing or not numbers ({exc})") from exc
    layers: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key in sorted(tensors):
        if not key.endswith(_A):
            if not key.endswith(_B):
                raise CheckpointError(f"{path}: unexpected tensor {key!r}")
            continue
        name = key[: -len(_A)]
        a, b = tensors[key].float(), tensors.get(name + _B)
        if b is None:
            raise CheckpointError(f"{path}: {key} has no {name + _B}")
        b = b.float()
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank or b.shape[1] != rank:
            raise CheckpointError(f"{path}: {name}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} "
                                  f"do not have rank {rank}")
        layers[name] = (a, b)
    unpaired = [k for k in tensors if k.endswith(_B) and k[: -len(_B)] not in layers]
    if unpaired:
        raise CheckpointError(f"{path}: {unpaired[0]} has no {unpaired[0][: -len(_B)] + _A}")
    if not layers:
        raise CheckpointError(f"{path}: no LoRA layers")
    return LoraFile(path, rank, alpha, meta, layers)


def merged_weight(weight: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """`weight + delta`, summed in float32 and rounded once to the weight's dtype."""
    return (weight.float() + delta.to(weight.device)).to(weight.dtype)
