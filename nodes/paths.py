"""Checkpoint folders under ComfyUI's models directory: `models/mizuoto/<name>/`, and extra roots
from `extra_model_paths.yaml` under the key `mizuoto`; what each engine can load there is the
runtime's `checkpoints.scan`.

ComfyUI builds a node's definition on every `/object_info` and validates every prompt against
it, so the scan is kept for a moment (`FRESH_S`): one request builds every node from one scan,
and a folder copied in shows up at the next refresh.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import folder_paths

from mizuoto_runtime.app.checkpoints import Catalog, scan

FOLDER = "mizuoto"
FRESH_S = 2.0

_lock = threading.Lock()
_cached: tuple[float, Catalog] | None = None


def register_folder() -> None:
    """Add `models/mizuoto` to ComfyUI's model folders (after any yaml entries for it)."""
    folder_paths.add_model_folder_path(FOLDER, os.path.join(folder_paths.models_dir, FOLDER))


def roots() -> list[Path]:
    return list(dict.fromkeys(Path(p) for p in folder_paths.get_folder_paths(FOLDER)))


def catalog() -> Catalog:
    """What every engine can load under the model roots (at most `FRESH_S` old)."""
    global _cached
    with _lock:
        now = time.monotonic()
        if _cached is None or now - _cached[0] > FRESH_S:
            _cached = (now, scan(roots()))
        return _cached[1]


def resolve(engine: str, value: str) -> Path | None:
    """The folder a checkpoint choice names for `engine`; None for its built-in weights."""
    return catalog().find(engine, value).folder
