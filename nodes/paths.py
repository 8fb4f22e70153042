"""Checkpoint folders under ComfyUI's models directory: `models/mizuoto/<name>/`.

A Mizuoto checkpoint is a folder (safetensors files, configs), not a file, so the loader lists
folders that hold files, two levels deep (`qwen3tts/Qwen3-TTS-0.6B`). Extra roots come from
`extra_model_paths.yaml` under the key `mizuoto`.
"""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import folder_paths

from mizuoto_runtime import MizuotoError

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
            found.update(_folders_with_files(root, root, MAX_DEPTH))
    return [NONE, *sorted(found)]


def _folders_with_files(root: Path, folder: Path, depth: int) -> list[str]:
    out: list[str] = []
    for child in sorted(folder.iterdir()):
        if not child.is_dir() or child.name.startswith("."):
            continue
        if any(f.is_file() for f in child.iterdir()):
            out.append(child.relative_to(root).as_posix())
        if depth > 1:
            out.extend(_folders_with_files(root, child, depth - 1))
    return out


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
