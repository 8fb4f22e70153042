"""LoRA files: reading them and merging their updates into weights (shared by the engines that
apply a LoRA and by the training that writes one, which `training.lora` does).

The file (safetensors): for every adapted layer, by its path in the engine's model
(``talker.model.layers.0.self_attn.q_proj``), ``<path>.lora_A.weight`` (rank × in) and
``<path>.lora_B.weight`` (out × rank), float32; metadata ``format = mizuoto-lora``,
``version``, ``engine``, ``rank``, ``alpha``, and what trained it. Applying it merges
``W + strength · (alpha / rank) · B @ A`` into the weights (`merged_weight`): the model then
runs its plain layers, so every placement computes exactly the same (M57).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ..errors import CheckpointError

FORMAT = "mizuoto-lora"
VERSION = "1"
A_SUFFIX, B_SUFFIX = ".lora_A.weight", ".lora_B.weight"


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
        if not key.endswith(A_SUFFIX):
            if not key.endswith(B_SUFFIX):
                raise CheckpointError(f"{path}: unexpected tensor {key!r}")
            continue
        name = key[: -len(A_SUFFIX)]
        a, b = tensors[key].float(), tensors.get(name + B_SUFFIX)
        if b is None:
            raise CheckpointError(f"{path}: {key} has no {name + B_SUFFIX}")
        b = b.float()
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank or b.shape[1] != rank:
            raise CheckpointError(f"{path}: {name}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} "
                                  f"do not have rank {rank}")
        layers[name] = (a, b)
    unpaired = [k for k in tensors if k.endswith(B_SUFFIX) and k[: -len(B_SUFFIX)] not in layers]
    if unpaired:
        raise CheckpointError(f"{path}: {unpaired[0]} has no {unpaired[0][: -len(B_SUFFIX)] + A_SUFFIX}")
    if not layers:
        raise CheckpointError(f"{path}: no LoRA layers")
    return LoraFile(path, rank, alpha, meta, layers)


def merged_weight(weight: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """`weight + delta`, summed in float32 and rounded once to the weight's dtype."""
    return (weight.float() + delta.to(weight.device)).to(weight.dtype)
