"""Reading an engine's checkpoint folder: its JSON and YAML files and its transformers configs, each
failure one `CheckpointError` naming the file (shared by the engines in their official layouts)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import CheckpointError


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot be read as JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping, read safely (no object construction from the file)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CheckpointError(f"{path}: cannot be read as YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a YAML mapping")
    return data


def config_from(cls: Any, folder: Path) -> Any:
    """A transformers config class read from ``folder/config.json`` (no weights)."""
    try:
        return cls.from_pretrained(str(folder))
    except (OSError, TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{folder / 'config.json'}: not a valid {cls.__name__} ({exc})") from exc


SAFETENSORS_INDEX = "model.safetensors.index.json"


def safetensors_files(folder: Path) -> list[Path]:
    """A transformers folder's weight files: the shards ``model.safetensors.index.json`` lists,
    else ``model.safetensors``; one `CheckpointError` naming what is missing."""
    index_path = folder / SAFETENSORS_INDEX
    if not index_path.is_file():
        single = folder / "model.safetensors"
        if not single.is_file():
            raise CheckpointError(f"{folder}: no model.safetensors or {SAFETENSORS_INDEX}")
        return [single]
    weight_map = read_json(index_path).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_path}: not a safetensors index with a weight_map")
    shards = [folder / name for name in sorted(set(map(str, weight_map.values())))]
    missing = [s.name for s in shards if not s.is_file()]
    if missing:
        raise CheckpointError(f"{folder}: missing {', '.join(missing)} (listed in {SAFETENSORS_INDEX})")
    return shards


def cache_root() -> Path:
    """The user's cache folder for what Mizuoto derives from model files once per machine:
    ``$XDG_CACHE_HOME/mizuoto``, else ``~/.cache/mizuoto``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mizuoto"
