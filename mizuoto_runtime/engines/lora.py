"""A LoRA on a loaded engine: merged into one of its components through its handle (M28).

An engine that takes LoRA files declares its `LoraAdapter` on its class (`Engine.LORA`: which
component, which checkpoint file holds that component's weights, under which prefix), and
`engine.use_lora(LoraChoice(path, strength))` sets each adapted weight to its checkpoint value
plus the LoRA's update, merged in float32 and rounded once to the run dtype;
`engine.use_lora(None)` gives the component its checkpoint weights back. The original weights
are read again from the memory-mapped checkpoint file (the same conversion the load did), so no
second copy of the component is kept and removing a LoRA restores the exact checkpoint.

The change goes through the component's handle: it is moved off the device, the module gets its
host tensors, the merged weights replace the adapted ones, and `handle.replace` plans the
component again, so host copies, streamed units and resident units all hold the merged weights
(M28). The component then runs its plain layers: every placement computes the same (M57).
Setting the same LoRA again does nothing.
"""
from __future__ import annotations

import dataclasses
import logging
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from ..errors import MizuotoError
from ..memory.small_weights import PUBLISHED
from ..nn.loading import SafetensorsFile
from ..nn.lora import LoraFile, merged_weight, read_lora

if TYPE_CHECKING:
    from ..memory.handle import ModelHandle


class Engine(Protocol):
    """What an adapter reads of the engine it adapts (an `engines.base.Engine`; a protocol, so
    that the base class may import this module and no cycle forms): its id and model folder; the
    component's handle is the attribute the adapter names."""

    @property
    def id(self) -> str: ...

    @property
    def model_dir(self) -> Path | None: ...

log = logging.getLogger(__name__)


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


@dataclasses.dataclass(frozen=True)
class LoraAdapter:
    """Where an engine's LoRA files go: the engine attribute holding the component's handle
    (``talker``), the checkpoint file of its weights (relative to the model folder) and the
    prefix of its weights there and of the layer paths in the LoRA files (``talker.``)."""

    component: str
    checkpoint: str
    prefix: str

    def use(self, engine: Engine, choice: LoraChoice | None) -> None:
        """Give `engine`'s component its checkpoint weights plus `choice` (None: none)."""
        current = _APPLIED.get(engine)
        if choice is None and current is None:
            return
        stamp = _stamp(choice.path) if choice is not None else (0, 0)
        if current is not None and choice == current.choice and stamp == current.stamp:
            return
        handle: ModelHandle = getattr(engine, self.component)
        if choice is not None and handle.weights != PUBLISHED:
            raise MizuotoError(f"{engine.id}: LoRA files apply to weights as published; the {self.component} stores "
                               f"its weights as {handle.weights}: load the engine with weights 'as published' "
                               "to use one")
        lora = read_lora(choice.path, engine.id) if choice is not None else None
        layers = set(lora.layers) if lora is not None else set()
        restore = set(current.layers) if current is not None else set()
        weights = self._weights(engine, handle, lora, choice.strength if choice else 0.0, layers | restore)
        replace_weights(handle, weights)
        if choice is None:
            del _APPLIED[engine]
            log.info("%s: LoRA removed; the %s has its checkpoint weights", engine.id, self.component)
        else:
            _APPLIED[engine] = _Applied(choice, stamp, frozenset(layers))
            log.info("%s: LoRA %s applied at strength %g (%d layers)", engine.id, choice.path.name,
                     choice.strength, len(layers))

    def _weights(self, engine: Engine, handle: ModelHandle, lora: LoraFile | None, strength: float,
                 layers: set[str]) -> dict[str, torch.Tensor]:
        """The new value of every weight to set, by its name in the component's module: the
        checkpoint's, plus the LoRA's update where it adapts that layer."""
        module = handle.module
        checkpoint = Path(engine.model_dir or "") / self.checkpoint
        out: dict[str, torch.Tensor] = {}
        with SafetensorsFile(checkpoint) as f:
            for layer in sorted(layers):
                if not layer.startswith(self.prefix):
                    raise MizuotoError(f"LoRA layer {layer!r} is not in the {self.component} (names start with "
                                       f"{self.prefix!r})")
                name = layer[len(self.prefix):] + ".weight"
                try:
                    param = module.get_parameter(name)
                except AttributeError as exc:
                    raise MizuotoError(f"LoRA layer {layer!r}: the {self.component} has no weight {name!r}") from exc
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


_APPLIED: weakref.WeakKeyDictionary[Engine, _Applied] = weakref.WeakKeyDictionary()


def applied_lora(engine: Engine) -> LoraChoice | None:
    """The LoRA `engine` runs with now (None: its checkpoint weights)."""
    state = _APPLIED.get(engine)
    return None if state is None else state.choice


def _stamp(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError as exc:
        raise MizuotoError(f"LoRA file not found: {path} ({exc})") from exc
    return st.st_mtime_ns, st.st_size


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
