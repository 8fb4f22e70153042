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


def cache_root() -> Path:
    """The user's cache folder for what Mizuoto derives from model files once per machine:
    ``$XDG_CACHE_HOME/mizuoto``, else ``~/.cache/mizuoto``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mizuoto"
