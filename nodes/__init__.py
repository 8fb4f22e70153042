"""The pack's ComfyUI nodes (V3 `io.ComfyNode`): Text to Speech, Load TTS Engine, TTS Memory
Settings, Save Audio (WAV), and the step-by-step Voice Clone / Voice Design, Text → Speech Codes
and Speech Codes → Audio, and IndexTTS-2's Emotion. Imported by the pack's root `__init__.py` only."""
from __future__ import annotations

from comfy_api.latest import io

from . import paths
from .audio_nodes import NODES as _AUDIO_NODES
from .engine_nodes import NODES as _ENGINE_NODES
from .indextts_nodes import NODES as _INDEXTTS_NODES
from .phase_nodes import NODES as _PHASE_NODES
from .training_nodes import NODES as _TRAINING_NODES

paths.register_folder()

NODES: list[type[io.ComfyNode]] = [*_ENGINE_NODES, *_PHASE_NODES, *_INDEXTTS_NODES, *_AUDIO_NODES, *_TRAINING_NODES]

__all__ = ["NODES"]
