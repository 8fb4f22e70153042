"""A LoRA on a loaded Qwen3-TTS engine: merged into the talker through its handle (M28).

`use_lora(engine, LoraChoice(path, strength))` sets each adapted talker weight to its
checkpoint value plus the LoRA's update, merged in float32 and rounded once to the run dtype;
`use_lora(engine, None)` gives the talker its checkpoint weights back. The original weights
are read again from the memory-mapped `model.safetensors` (the same conversion the load did),
so no second copy of the talker is kept and removing a LoRA restores the exact checkpoint.

The change goes through the talker's handle: it is moved off the device, the module gets its
host tensors, the merged weights replace the adapted ones, and `handle.replace` plans the
component again, so host copies, streamed units and resident units all hold the merged weights
(M28). The talker then runs its plain layers: every placement computes the same (M57).
Setting the same LoRA again does nothing.
"""
from __future__ import annotations

import dataclasses
import logging
import weakref
from pathlib import Path

import torch

from ...errors import MizuotoError
from ...handle import ModelHandle
from ...loading import SafetensorsFile
from ...training.lora import LoraFile, merged_weight, read_lora
from ..base import Engine

log = logging.getLogger(__name__)

ENGINE = "qwen3tts"
TALKER_PREFIX = "talker."  # the talker's weights in model.safetensors


@dataclasses.dataclass(frozen=True)
class LoraChoice:
    """A LoRA file and how strongly to apply it (1.0: as trained)."""

    path: Path
    strength: float = 1.0


@dataclasses.dataclass(frozen=True)
class _Applied:
    choice: LoraChoice
    stamp: tuple[int, int]  # the file's (mtime_ns, size) when applied: a retrained file applies again
    layers: frozenset[str]  # paths in the engine's model, e.g. talker.model.layers.0.mlp.up_proj


_APPLIED: weakref.WeakKeyDictionary[Engine, _Applied] = weakref.WeakKeyDictionary()


def applied_lora(engine: Engine) -> LoraChoice | None:
    state = _APPLIED.get(engine)
    return None if state is None else state.choice


def use_lora(engine: Engine, choice: LoraChoice | None) -> None:
    """Give `engine`'s talker its checkpoint weights plus `choice` (None: none)."""
    current = _APPLIED.get(engine)
    if choice is None and current is None:
        return
    if choice is not None and engine.id != ENGINE:
        raise MizuotoError(f"LoRA files apply to the {ENGINE} engine only, not {engine.id!r}")
    stamp = _stamp(choice.path) if choice is not None else (0, 0)
    if current is not None and choice == current.choice and stamp == current.stamp:
        return
    lora = read_lora(choice.path, ENGINE) if choice is not None else None
    handle: ModelHandle = engine.talker  # type: ignore[attr-defined]
    layers = set(lora.layers) if lora is not None else set()
    restore = set(current.layers) if current is not None else set()
    weights = _weights(engine, handle, lora, choice.strength if choice else 0.0, layers | restore)
    replace_weights(handle, weights)
    if choice is None:
        del _APPLIED[engine]
        log.info("%s: LoRA removed; the talker has its checkpoint weights", engine.id)
    else:
        _APPLIED[engine] = _Applied(choice, stamp, frozenset(layers))
        log.info("%s: LoRA %s applied at strength %g (%d layers)", engine.id, choice.path.name,
                 choice.strength, len(layers))


def _stamp(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError as exc:
        raise MizuotoError(f"LoRA file not found: {path} ({exc})") from exc
    return st.st_mtime_ns, st.st_size


def _weights(engine: Engine, handle: ModelHandle, lora: LoraFile | None, strength: float,
             layers: set[str]) -> dict[str, torch.Tensor]:
    """The new value of every weight to set, by its name in the talker module: the checkpoint's,
    plus the LoRA's update where it adapts that layer."""
    module = handle.module
    checkpoint = Path(engine.model_dir or "") / "model.safetensors"
    out: dict[str, torch.Tensor] = {}
    with SafetensorsFile(checkpoint) as f:
        for layer in sorted(layers):
            if not layer.startswith(TALKER_PREFIX):
                raise MizuotoError(f"LoRA layer {layer!r} is not in the talker (names start with {TALKER_PREFIX!r})")
            name = layer[len(TALKER_PREFIX):] + ".weight"
            try:
                param = module.get_parameter(name)
            except AttributeError as exc:
                raise MizuotoError(f"LoRA layer {layer!r}: the talker has no weight {name!r}") from exc
            key = layer + ".weight"
            if key not in f.entries:
                raise MizuotoError(f"{checkpoint}: no tensor {key!r} to apply the LoRA to")
            original = torch.empty(param.shape, dtype=param.dtype)
            original.copy_(f.view(key))  # the load's own conversion (M27): exactly the loaded weight
            f.release(key)
            if lora is not None and layer in lora.layers:
                delta = lora.delta(layer, strength)
                if delta.shape != param.shape:
                    raise MizuotoError(f"LoRA layer {layer!r}: update {tuple(delta.shape)} does not fit the "
                                       f"weight {tuple(param.shape)}")
                original = merged_weight(original, delta)
            out[name] = original
    return out


def replace_weights(handle: ModelHandle, weights: dict[str, torch.Tensor]) -> None:
    """M28: new values for some of a component's parameters, through its handle: off the device,
    the module holds its host tensors, the new ones go in, and `replace` plans it again."""
    if handle.in_use:
        raise MizuotoError(f"{handle.name} is in use; apply a LoRA between requests")
    handle.offload()
    for slot in handle.plan.fixed + [s for u in handle.plan.units for s in u.slots]:
        if slot.host is not None:
            slot.hold(slot.host)  # strict mode: the module held stand-ins off the device (M56)
    with torch.no_grad():
        for name, value in weights.items():
            handle.module.get_parameter(name).data = value
    handle.replace(handle.module)
