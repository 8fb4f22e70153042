"""Checkpoint folders under ComfyUI's models directory: `models/mizuoto/<name>/`.

A Mizuoto checkpoint is a folder (safetensors files, configs), not a file, so the loader lists
checkpoint roots, two levels deep (`qwen3tts/Qwen3-TTS-0.6B`), never a checkpoint's own
subfolders (`comfy_bridge.checkpoint_folders`). Extra roots come from `extra_model_paths.yaml`
under the key `mizuoto`.
"""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import folder_paths

from mizuoto_runtime import MizuotoError
from mizuoto_runtime.comfy_bridge import checkpoint_folders

FOLDER = "mizuoto"
NONE = "none"  # the engine's built-in weights (the demo engine) or its own default
MAX_DEPTH = 2


def register_folder() -> None:
    """Add `models/mizuoto` to ComfyUI's model folders (after any yaml entries for it)."""
    folder_paths.add_model_folder_path(FOLDER, os.path.join(folder_paths.models_dir, FOLDER))


def roots() -> list[Path]:
    return [Path(p) for p in folder_paths.get_folder_paths(FOLDER)]


def checkpoint_choices() -> list[str]:
    found: set[str] = set()
    for root in roots():
        if root.is_dir():
            found.update(checkpoint_folders(root, MAX_DEPTH))
    return [NONE, *sorted(found)]


def resolve(name: str) -> Path | None:
    """The folder a `checkpoint` choice names; None for `none`."""
    if name == NONE:
        return None
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise MizuotoError(f"checkpoint {name!r}: must be a folder name under models/{FOLDER}")
    for root in roots():
        if (root / relative).is_dir():
            return root / relative
    raise MizuotoError(f"checkpoint {name!r}: no such folder under {', '.join(map(str, roots()))}")
