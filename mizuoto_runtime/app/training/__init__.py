"""Training under the memory runtime (M60–M63).

* `job.TrainingJob` — a training run in its own process that owns its device while it runs
  (exclusive slots, idle models released, allocator settings in its environment), M60;
* `memory` — the `training.memory` presets ``default``, ``low``, ``lowest`` (M61);
* `host_optimizer.HostAdamW` — float32 state in host RAM, one staging buffer per device dtype
  (M62); `cpu_allocator` — `compute.cpu_allocator` in the training process (M62);
* `estimate` — `MethodInfo.memory_mb` from measured peaks, and the advice when it does not fit
  (M63); `meter` — every phase's `memory/peak_mb`;
* methods (`methods.METHODS`): `qwen3tts_lora`, LoRA of the Qwen3-TTS talker; `lora` holds the
  adapters it trains and saves as a LoRA file (`nn.lora` reads and merges one), which the
  engine applies (`Engine.use_lora`).

Importing this package imports no engine package; a method's module imports its engine's.
"""
from __future__ import annotations

from .estimate import MethodInfo, PeakRow, estimate_mb, fit_advice
from .host_optimizer import HostAdamW
from .memory import PRESET_NAMES, PRESETS, MemoryPlan, memory_plan

__all__ = [
    "PRESETS", "PRESET_NAMES", "HostAdamW", "MemoryPlan", "MethodInfo", "PeakRow", "estimate_mb", "fit_advice",
    "memory_plan",
]
