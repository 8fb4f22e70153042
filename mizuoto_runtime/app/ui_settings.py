"""The `compute.*` settings from ComfyUI's settings dialog, applied to the next request, and the
Memory Settings node's values over them for its own graph (issue 15 item 3; M9, M10).

**Precedence** (lowest first): each setting's default (`VramPolicy`); the value set in
ComfyUI's settings dialog (Settings → Mizuoto); the TTS Memory Settings node of the graph being
run. A graph without that node runs with the dialog's values; the next graph with one runs with
its values. Every layer is validated by `VramPolicy`, so a bad value gets the same error as
anywhere else, saying where it was set.

**How the dialog's values get here.** The route stays GET-only with no input, so the page does
not send them. ComfyUI's frontend stores every setting a user changes in
``<user directory>/<user>/comfy.settings.json`` (POST /settings/<id>, ComfyUI's user
manager), in v0.3.64 as in v0.8.0 and newer frontends alike, under the id the extension
registered (`DIALOG_PREFIX` + key). The pack reads that file when a Mizuoto node starts, on
the thread that runs nodes, so a change applies to the next request — also to prompts queued
through the API or from another tab, with no hook into how a frontend version queues prompts
(`extra_data` would need one per frontend, and the API would skip it). ComfyUI does not record
which user queued a prompt: with `--multi-user` the "default" user's settings apply.

**Why the graph's node is read from the prompt.** ComfyUI does not run a node again whose
inputs did not change (its output is cached), so a Memory Settings node runs in the first
prompt of a graph only. Its widget values are therefore read from the prompt being run
(`graph_settings`); values it computes from links apply when the node itself runs
(`ProcessRuntime.set_graph_settings`).

No ComfyUI import here: the pack's entry (`__init__.py`) passes in where the file is and which
prompt runs.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import SettingError
from ..memory.policy import VramPolicy

log = logging.getLogger(__name__)

#: A dialog setting's id in ComfyUI: "Mizuoto.compute.vram_mode" is `compute.vram_mode`.
DIALOG_PREFIX = "Mizuoto."
SETTINGS_FILE = "comfy.settings.json"
DEFAULT_USER = "default"
MEMORY_SETTINGS_NODE = "MizuotoMemorySettings"

#: Number fields cannot be empty: there this value means "automatic" / "no limit" / "off"
#: (`None` in `VramPolicy`), in the dialog and on the Memory Settings node alike.
UNSET: dict[str, int] = {
    "compute.vram_reserve_mb": -1,
    "compute.vram_limit_mb": 0,
    "compute.max_pinned_mb": -1,
    "compute.ram_reserve_mb": -1,
    "compute.simulate_vram_mb": 0,
}

#: The settings the dialog offers (web/settings.js registers these ids). Left out:
#: `compute.cuda_allocator` (ComfyUI sets its allocator before any pack loads) and
#: `compute.cpu_allocator` (training processes only).
DIALOG_KEYS: tuple[str, ...] = (
    "compute.vram_mode", "compute.vram_reserve_mb", "compute.vram_limit_mb", "compute.gpu_jobs",
    "compute.async_offload", "compute.max_pinned_mb", "compute.host_copies", "compute.ram_reserve_mb",
    "compute.max_resident_models", "compute.unload_after_minutes", "compute.oom_retry",
    "compute.oom_fallback", "compute.kv_cache", "compute.simulate_vram_mb", "compute.weights",
)


def from_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """Field values (dialog or Memory Settings node) as `compute.*` settings: the `UNSET`
    number of a field becomes None."""
    return {key: None if key in UNSET and value == UNSET[key] else value for key, value in values.items()}


def read_dialog(path: Path) -> dict[str, Any]:
    """The Mizuoto `compute.*` values stored in one user's ComfyUI settings file, validated;
    {} when the file is absent. A file that is not a JSON object, or a bad value, raises one
    `SettingError` naming the file (and the key, as `VramPolicy` names it)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise SettingError(f"ComfyUI's settings file {path} cannot be read: {exc}") from exc
    try:
        stored = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SettingError(f"ComfyUI's settings file {path} is not valid JSON: {exc}") from exc
    if not isinstance(stored, dict):
        raise SettingError(f"ComfyUI's settings file {path} must hold a JSON object, got {type(stored).__name__}")
    ours = {key.removeprefix(DIALOG_PREFIX): value for key, value in stored.items()
            if key.startswith(DIALOG_PREFIX + "compute.")}
    unknown = sorted(set(ours) - set(DIALOG_KEYS))
    if unknown:
        raise SettingError(f"ComfyUI's settings file {path} has {DIALOG_PREFIX}{unknown[0]}, which is not a "
                           f"setting of the dialog; known: {', '.join(DIALOG_KEYS)}")
    settings = from_fields(ours)
    _validated(settings, f"set in ComfyUI's settings dialog (Settings → Mizuoto, stored in {path})")
    return settings


def graph_settings(prompt: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Memory Settings node's widget values in an API-format prompt, as settings; inputs
    fed by a link (a list `[node, slot]`) are left to the node. Two such nodes in one graph:
    the one with the larger id wins, as the node that runs last would."""
    found: dict[str, Any] = {}
    nodes = sorted((prompt or {}).items(), key=lambda item: _node_order(item[0]))
    for node_id, node in nodes:
        if not isinstance(node, Mapping) or node.get("class_type") != MEMORY_SETTINGS_NODE:
            continue
        inputs = node.get("inputs") or {}
        values = {f"compute.{name}": value for name, value in inputs.items() if not isinstance(value, list)}
        settings = from_fields(values)
        _validated(settings, f"on the TTS Memory Settings node {node_id}")
        found.update(settings)
    return found


def _node_order(node_id: str) -> tuple[int, str]:
    return (int(node_id), "") if node_id.isdigit() else (1 << 62, node_id)


def _validated(settings: Mapping[str, Any], where: str) -> None:
    try:
        VramPolicy(settings)
    except SettingError as exc:
        raise SettingError(f"{exc} ({where})") from exc


@dataclasses.dataclass(frozen=True)
class Layers:
    """What the next request runs with: the dialog's settings and its graph's, and which
    prompt that graph is (None outside a running prompt)."""

    prompt_id: str | None
    dialog: dict[str, Any]
    graph: dict[str, Any]


#: The prompt ComfyUI runs now: (prompt id, API prompt), or None.
CurrentPrompt = Callable[[], "tuple[str, Mapping[str, Any]] | None"]


class ComfyUISettings:
    """The layers inside ComfyUI: the dialog's file under `user_dir`, the prompt `current` runs."""

    def __init__(self, user_dir: Path, current: CurrentPrompt, user: str = DEFAULT_USER) -> None:
        self.path = Path(user_dir) / user / SETTINGS_FILE
        self.current = current

    def __call__(self) -> Layers:
        running = self.current()
        prompt_id, prompt = running if running is not None else (None, None)
        return Layers(prompt_id, read_dialog(self.path), graph_settings(prompt))


__all__ = ["DIALOG_KEYS", "DIALOG_PREFIX", "UNSET", "ComfyUISettings", "Layers", "from_fields", "graph_settings",
           "read_dialog"]
