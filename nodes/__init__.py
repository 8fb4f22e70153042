"""The pack's ComfyUI nodes (V3 `io.ComfyNode`): Memory Settings, Engine Loader, Voice Prompt,
Talker, Codec Decoder and the all-in-one TTS. Imported by the pack's root `__init__.py` only."""
from __future__ import annotations

from comfy_api.latest import io

from . import paths
from .engine_nodes import NODES as _ENGINE_NODES
from .phase_nodes import NODES as _PHASE_NODES

paths.register_folder()

NODES: list[type[io.ComfyNode]] = [*_ENGINE_NODES, *_PHASE_NODES]

__all__ = ["NODES"]
