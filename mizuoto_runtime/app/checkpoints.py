"""Checkpoint folders a host offers: which engine can load each, and what each is.

A checkpoint is a folder (configs and safetensors files), not a file, so a host lists the
checkpoint roots under its model folders, at most two levels deep (`qwen3tts/Qwen3-TTS-0.6B`),
never a checkpoint's own subfolders (Qwen's `speech_tokenizer/` has a config.json of its own).
Every engine of `ENGINES` says of each folder whether it can load it, and what it is
(`Engine.describe_checkpoint`, configs only, no weights read); engines that run without a
folder offer their built-in weights as the choice `none`.

A folder may also offer several choices, one per file (`Engine.checkpoint_entries`: a folder
of GPT-SoVITS voices); such a choice's path is the file's (`gptsovits/SoVITS_weights_v2/x.pth`).

A choice's `value` is what a dropdown shows and a workflow saves: the folder's relative path,
followed by the type in parentheses when the folder name does not already say it
(`qwen3tts/tiny (CustomVoice)`; `Qwen3-TTS-12Hz-0.6B-Base` stays as it is). `Catalog.find`
accepts the value or the bare path, so workflows saved either way keep loading.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..engines import ENGINES, CheckpointInfo, Engine, engine_class
from ..errors import MizuotoError

log = logging.getLogger(__name__)

#: The choice of an engine's built-in weights (no folder).
NONE = "none"
MAX_DEPTH = 2

#: A folder with one of these files, a `*.safetensors` or a `*.pth` file at its top level is a
#: checkpoint root (the official Qwen3-TTS layout has a config.json; the demo engine writes bare
#: safetensors; CosyVoice's published folders have their model yaml and .pt state_dicts;
#: GPT-SoVITS's voices are .pth files).
CHECKPOINT_CONFIG = "config.json"
CHECKPOINT_MARKERS = (CHECKPOINT_CONFIG, "cosyvoice2.yaml", "cosyvoice3.yaml")
CHECKPOINT_WEIGHTS = ("*.safetensors", "*.pth")


def is_checkpoint_root(folder: Path) -> bool:
    return any((folder / name).is_file() for name in CHECKPOINT_MARKERS) or \
        any(p.is_file() for pattern in CHECKPOINT_WEIGHTS for p in folder.glob(pattern))


def _subfolders(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError as exc:
        # A host lists the choices when it builds its node list: one unreadable folder must
        # not take the node list down with it.
        log.warning("Mizuoto: cannot list checkpoint folder %s (%s)", folder, exc)
        return []


def checkpoint_folders(root: Path, max_depth: int = MAX_DEPTH) -> list[str]:
    """The checkpoint roots under `root`, as POSIX paths relative to it, at most `max_depth`
    levels down (`qwen3tts/Qwen3-TTS-12Hz-0.6B-Base`), in sorted order.

    The search stops at a root: a checkpoint's own subfolders are part of it, never a choice.
    Folders that are not roots (grouping folders, half-copied downloads) are searched but not
    listed; hidden ones are skipped.
    """
    found: list[str] = []
    for child in _subfolders(root):
        if is_checkpoint_root(child):
            found.append(child.name)
        elif max_depth > 1:
            found.extend(f"{child.name}/{name}" for name in checkpoint_folders(child, max_depth - 1))
    return found


@dataclasses.dataclass(frozen=True)
class Choice:
    """One thing an engine can load: a folder (`path` relative to its root) or, with `path`
    None, the engine's built-in weights."""

    engine: str
    value: str
    path: str | None
    folder: Path | None
    info: CheckpointInfo

    def as_dict(self) -> dict[str, Any]:
        """What a frontend needs to fill its dropdowns; no absolute path."""
        return {"value": self.value, "path": self.path, "label": self.info.label,
                "speakers": list(self.info.speakers), "languages": list(self.info.languages)}


def choice_value(path: str, label: str) -> str:
    return path if label.lower() in path.lower() else f"{path} ({label})"


class Catalog:
    """Every choice of every engine, in a stable order: engines as listed, built-in weights
    first, then folders in path order."""

    def __init__(self, choices: Sequence[Choice], engines: Sequence[str], roots: Sequence[Path] = ()) -> None:
        self.choices = list(choices)
        self.engines = list(engines)
        self.roots = list(roots)

    def of(self, engine: str) -> list[Choice]:
        return [c for c in self.choices if c.engine == engine]

    def values(self) -> list[str]:
        """Every value of every engine, once each (a static dropdown's options)."""
        return list(dict.fromkeys(c.value for c in self.choices))

    def speakers(self) -> list[str]:
        return sorted({s for c in self.choices for s in c.info.speakers})

    def languages(self) -> list[str]:
        found = {lang for c in self.choices for lang in c.info.languages}
        return ["auto", *sorted(found - {"auto"})]

    def find(self, engine: str, value: str) -> Choice:
        """The choice `value` names for `engine` (its value or its bare path); one error
        naming what this engine can load otherwise."""
        for choice in self.of(engine):
            if value in (choice.value, choice.path) or (choice.path is None and value == NONE):
                return choice
        raise MizuotoError(self._not_found(engine, value))

    def _not_found(self, engine: str, value: str) -> str:
        title = _title(engine)
        mine = [c.value for c in self.of(engine)]
        where = ", ".join(map(str, self.roots)) or "the model folder"
        others = sorted({c.engine for c in self.choices if c.path is not None and value in (c.value, c.path)})
        if value == NONE:
            head = f"{title} needs a checkpoint folder"
        elif others:
            head = f"checkpoint {value!r} is for {', '.join(_title(e) for e in others)}, not {title}"
        else:
            head = f"checkpoint {value!r}: no folder {title} can load by that name under {where}"
        if mine:
            return f"{head}; {title} can load: {', '.join(mine)}"
        return f"{head}; no {title} checkpoint was found under {where} (put one there in its official layout)"

    def as_dict(self) -> dict[str, Any]:
        """Per engine its title and choices (the read-only route behind the dropdowns)."""
        return {"engines": {e: {"title": _title(e), "choices": [c.as_dict() for c in self.of(e)]}
                            for e in self.engines}}


def _title(engine: str) -> str:
    try:
        return engine_class(engine).title or engine
    except MizuotoError:
        return engine


def _engine_classes(engines: Iterable[str]) -> dict[str, type[Engine]]:
    """Engines whose adapter imports (an adapter imports its upstream package lazily, so this
    holds without the package; one that cannot be imported offers nothing)."""
    classes = {}
    for engine_id in engines:
        try:
            classes[engine_id] = engine_class(engine_id)
        except MizuotoError as exc:
            log.debug("engine %s offers no checkpoints: %s", engine_id, exc)
    return classes


def _entries(cls: type[Engine], folder: Path) -> list[tuple[str, CheckpointInfo]]:
    try:
        return cls.checkpoint_entries(folder)
    except (OSError, ValueError) as exc:  # a folder being copied, a config half written
        log.warning("Mizuoto: %s cannot describe %s (%s)", cls.id, folder, exc)
        return []


def scan(roots: Sequence[Path], engines: Iterable[str] | None = None, max_depth: int = MAX_DEPTH) -> Catalog:
    """The catalog of the checkpoint folders under `roots` (the first root holding a relative
    path wins, as `find` resolves it) for `engines` (default: every engine of ENGINES)."""
    classes = _engine_classes(ENGINES if engines is None else engines)
    folders: dict[str, Path] = {}
    for root in roots:
        if root.is_dir():
            for path in checkpoint_folders(root, max_depth):
                folders.setdefault(path, root / path)
    choices: list[Choice] = []
    for engine_id, cls in classes.items():
        if cls.BUILTIN is not None:
            choices.append(Choice(engine_id, NONE, None, None, cls.BUILTIN))
        for path in sorted(folders):
            for name, info in _entries(cls, folders[path]):
                where = f"{path}/{name}" if name else path
                choices.append(Choice(engine_id, choice_value(where, info.label), where, folders[path] / name, info))
    return Catalog(choices, list(classes), roots)


__all__ = ["NONE", "Catalog", "Choice", "checkpoint_folders", "choice_value", "is_checkpoint_root", "scan"]
