"""The pack's ComfyUI nodes (V3 `io.ComfyNode`): Text to Speech, Load TTS Engine, TTS Memory
Settings, Save Audio (WAV), the step-by-step Voice Clone / Voice Design, Text → Speech Codes
and Speech Codes → Audio, IndexTTS-2's Emotion and Emotion Options, and Script to Speech,
Subtitles to Speech, Character Voices and Save Voice. Imported by the pack's root `__init__.py` only."""
from __future__ import annotations

from comfy_api.latest import io

from mizuoto_runtime.app.host import PROCESS

from . import paths
from .audio_nodes import NODES as _AUDIO_NODES
from .engine_nodes import NODES as _ENGINE_NODES
from .indextts_nodes import NODES as _INDEXTTS_NODES
from .phase_nodes import NODES as _PHASE_NODES
from .script_nodes import NODES as _SCRIPT_NODES
from .script_nodes import prompt_store
from .training_nodes import NODES as _TRAINING_NODES

paths.register_folder()
PROCESS.prompt_store = prompt_store()  # prompted voices kept in the voice library's .cache (across restarts)

NODES: list[type[io.ComfyNode]] = [*_ENGINE_NODES, *_PHASE_NODES, *_SCRIPT_NODES, *_INDEXTTS_NODES, *_AUDIO_NODES,
                                   *_TRAINING_NODES]

__all__ = ["NODES"]
