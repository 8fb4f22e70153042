"""`training.memory`: presets of the memory tools a training phase uses (M61).

The tools:

* **gradient checkpointing** — each decoder layer keeps only its input for the backward pass
  and recomputes the rest (Hugging Face's `gradient_checkpointing_enable`, non-reentrant);
* **activation offload** — every tensor autograd saves for the backward pass goes to host
  memory (pinned on CUDA) and comes back when the backward pass needs it
  (`torch.autograd.graph.save_on_cpu`);
* **the host-side optimizer** (`HostAdamW`, M62) — float32 master weights, gradients and
  AdamW moments live in host RAM; the device keeps only the weights in their run precision;
* **the CPU allocator** of the training process (`compute.cpu_allocator`, M62) — `lowest`
  runs without torch's huge pages.

The presets: ``default`` (none of them: fastest), ``low`` (checkpointing and the host-side
optimizer), ``lowest`` (all of them). 8-bit or paged optimizer states are not offered: no
package that provides them (bitsandbytes) installs with any engine here.

A method's own hyperparameters win (M61): a key of `MemoryPlan` set in the method's
parameters replaces the preset's value. `lowest` and `low` change numbers slightly — float32
master weights round differently from an optimizer on half-precision weights — so the result
names the preset in force.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from ...errors import MizuotoError
from ...memory.policy import CPU_ALLOCATORS
from .host_optimizer import HostAdamW

PRESET_NAMES = ("default", "low", "lowest")


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Which memory tools a training phase uses (one preset, after the method's overrides)."""

    preset: str
    gradient_checkpointing: bool
    activation_offload: bool
    host_optimizer: bool
    cpu_allocator: str  # a `compute.cpu_allocator` value; "auto" leaves torch's default

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


PRESETS: dict[str, MemoryPlan] = {
    "default": MemoryPlan("default", gradient_checkpointing=False, activation_offload=False,
                          host_optimizer=False, cpu_allocator="auto"),
    "low": MemoryPlan("low", gradient_checkpointing=True, activation_offload=False,
                      host_optimizer=True, cpu_allocator="auto"),
    "lowest": MemoryPlan("lowest", gradient_checkpointing=True, activation_offload=True,
                         host_optimizer=True, cpu_allocator="no_hugepages"),
}
TOOLS = ("gradient_checkpointing", "activation_offload", "host_optimizer", "cpu_allocator")  # overridable


def memory_plan(preset: str, method_params: Mapping[str, Any] | None = None) -> MemoryPlan:
    """The preset `preset`, with every tool the method's own parameters set taken from them."""
    if preset not in PRESETS:
        raise MizuotoError(f"training.memory must be one of {', '.join(PRESET_NAMES)}, got {preset!r}")
    overrides = {k: v for k, v in (method_params or {}).items() if k in TOOLS and v is not None}
    for key, value in overrides.items():
        if key == "cpu_allocator":
            if value not in CPU_ALLOCATORS:
                raise MizuotoError(f"training parameter 'cpu_allocator' must be one of {', '.join(CPU_ALLOCATORS)}, "
                                   f"got {value!r}")
        elif not isinstance(value, bool):
            raise MizuotoError(f"training parameter {key!r} must be true or false, got {value!r}")
    return dataclasses.replace(PRESETS[preset], **overrides)


def enable_checkpointing(model: nn.Module, plan: MemoryPlan) -> None:
    """Gradient checkpointing on every Hugging Face model under `model` that supports it."""
    if not plan.gradient_checkpointing:
        return
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if enable is None:
        raise MizuotoError(f"{type(model).__name__} has no gradient checkpointing; "
                           "use training.memory=default or set gradient_checkpointing=false")
    enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@contextlib.contextmanager
def activations(plan: MemoryPlan, device: torch.device) -> Iterator[None]:
    """The forward pass of a training step: with activation offload, what autograd saves for
    the backward pass lives in host memory (pinned when the device is CUDA)."""
    if plan.activation_offload and device.type != "cpu":
        with torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda"):
            yield
    else:
        yield  # on the CPU the activations already are in host memory


class DeviceAdamW:
    """`torch.optim.AdamW` on the device, with the same `step(max_grad_norm)` as `HostAdamW`."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float, weight_decay: float) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)

    def step(self, max_grad_norm: float | None = None) -> float | None:
        norm = None
        if max_grad_norm is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_grad_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm


def make_optimizer(params: Iterable[nn.Parameter], plan: MemoryPlan, lr: float,
                   weight_decay: float) -> DeviceAdamW | HostAdamW:
    """AdamW where the plan keeps its state: on the device, or in host RAM (M62)."""
    if plan.host_optimizer:
        return HostAdamW(params, lr=lr, weight_decay=weight_decay)
    return DeviceAdamW(params, lr=lr, weight_decay=weight_decay)


def trainable_dtype(plan: MemoryPlan, run_dtype: torch.dtype) -> torch.dtype:
    """The dtype of trained parameters on the device: float32 when the optimizer runs there
    (AdamW on half-precision weights loses small updates); the run dtype when the host keeps
    float32 masters (M62)."""
    return run_dtype if plan.host_optimizer else torch.float32
