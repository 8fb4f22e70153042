"""Engines, imported lazily: an engine's upstream package is an optional extra.

One package per engine (issue 22): ``<id>/engine.py`` is the engine (an adapter over the upstream
package, or our own model code beside it), ``<id>/tiny.py`` writes its checkpoint layout with tiny
random weights. What engines share is here: `base`, `checkpoint_files`, `tiny`, and the `dummy`
engine; model blocks that more than one engine uses are in `mizuoto_runtime.nn`."""
from __future__ import annotations

import importlib
import sys

from ..errors import MizuotoError
from .base import CheckpointInfo, Codes, Engine, Sampling, Voice, check_request

# id -> (module, class, requirements file under requirements/ that provides its upstream package)
ENGINES: dict[str, tuple[str, str, str | None]] = {
    "demo": ("mizuoto_runtime.engines.demo.engine", "DemoEngine", None),
    "dummy": ("mizuoto_runtime.engines.dummy", "DummyEngine", None),
    "qwen3tts": ("mizuoto_runtime.engines.qwen3tts.engine", "Qwen3TTSEngine", "qwen3tts"),
    "voxcpm2": ("mizuoto_runtime.engines.voxcpm2.engine", "VoxCPM2Engine", "voxcpm2"),
    "f5tts": ("mizuoto_runtime.engines.f5tts.engine", "F5TTSEngine", "f5tts"),
    "omnivoice": ("mizuoto_runtime.engines.omnivoice.engine", "OmniVoiceEngine", "omnivoice"),
    "fishspeech": ("mizuoto_runtime.engines.fishspeech.engine", "FishSpeechEngine", "fishspeech"),
    "cosyvoice": ("mizuoto_runtime.engines.cosyvoice.engine", "CosyVoiceEngine", "cosyvoice"),
    "gptsovits": ("mizuoto_runtime.engines.gptsovits.engine", "GptSovitsEngine", "gptsovits"),
    "indextts2": ("mizuoto_runtime.engines.indextts.engine", "IndexTTS2Engine", "indextts2"),
}


def install_hint(extra: str) -> str:
    """How to install an engine's package into this environment: tools/install.sh, which installs
    requirements/<extra>.txt and the other engines without pip's resolver, under constraints
    that keep every installed package at its version (a bare `pip install -r` could move one)."""
    return (f"tools/install.sh --engines {sys.executable}, from the Mizuoto folder: every engine, "
            f"requirements/{extra}.txt among them, without changing any installed package")


def engine_class(engine_id: str) -> type[Engine]:
    if engine_id not in ENGINES:
        raise MizuotoError(f"unknown engine {engine_id!r}; known: {', '.join(ENGINES)}")
    module_name, cls_name, extra = ENGINES[engine_id]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f" (install it with: {install_hint(extra)})" if extra else ""
        raise MizuotoError(f"engine {engine_id!r} cannot be imported: {exc}{hint}") from exc
    return getattr(module, cls_name)


__all__ = [
    "ENGINES", "CheckpointInfo", "Codes", "Engine", "Sampling", "Voice", "check_request", "engine_class",
    "install_hint",
]
