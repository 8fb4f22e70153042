"""Training methods by id. A method module has `INFO` (`MethodInfo`), `check(params)` (the host
validates and fills defaults before a job starts), `model_params(params)` (the base model's
size, for estimates) and `run(params, plan, device, settings, emit)` (the
training process's work). Modules are imported on first use: an engine's package is needed
only by its own methods."""
from __future__ import annotations

import importlib
from types import ModuleType

from ...errors import MizuotoError

METHODS: dict[str, str] = {
    "qwen3tts_lora": "mizuoto_runtime.app.training.qwen3tts_lora",
}


def method_module(method: str) -> ModuleType:
    if method not in METHODS:
        raise MizuotoError(f"unknown training method {method!r}; known: {', '.join(sorted(METHODS))}")
    return importlib.import_module(METHODS[method])
