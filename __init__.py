"""Mizuoto's ComfyUI entry: the nodes (V3 `comfy_entrypoint`), the web extension and read-only
routes under `/mizuoto/`. ComfyUI imports this folder as a package named after its path; the
runtime inside it is imported by its own top-level name (see `_import_runtime`).

A second copy of the pack in `custom_nodes` (a clone beside a Manager install) is loaded by
ComfyUI too, under another name. Only the first copy registers anything; later ones log one
line and load as an empty pack (`NODE_CLASS_MAPPINGS = {}`, no web directory). Registering the
routes twice would stop ComfyUI's startup ("Added route will never be executed, method HEAD is
already registered"), and the nodes and web extension would clash.

Outside ComfyUI importing it does nothing: pytest imports it as the package that holds
`tests/` (the repository root has this `__init__.py`), so it must not need ComfyUI.
"""
from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("mizuoto")

RUNTIME_PACKAGE = "mizuoto_runtime"
#: Where the first copy of the pack loaded in this process leaves its module (`_claim`).
ACTIVE_PACK_KEY = "mizuoto_runtime:active_comfyui_pack"


def _import_runtime() -> None:
    """Import this pack's `mizuoto_runtime` under its top-level name.

    The engine table imports engine modules by absolute name (`mizuoto_runtime.engines.demo.engine`),
    so the package must be `mizuoto_runtime`, not `<pack path>.mizuoto_runtime`: two copies
    would mean two sets of classes. It is loaded from this folder without putting the folder on
    `sys.path`, where the pack's `nodes/` package would shadow ComfyUI's `nodes` module.
    """
    folder = Path(__file__).resolve().parent / RUNTIME_PACKAGE
    loaded = sys.modules.get(RUNTIME_PACKAGE)
    if loaded is not None:
        where = Path(loaded.__file__ or "").resolve().parent
        if where != folder:
            log.warning("Mizuoto: %s was already imported from %s; the pack at %s uses that copy",
                        RUNTIME_PACKAGE, where, folder.parent)
        return
    spec = importlib.util.spec_from_file_location(RUNTIME_PACKAGE, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    if spec is None or spec.loader is None:
        raise ImportError(f"Mizuoto: cannot import {RUNTIME_PACKAGE} from {folder}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[RUNTIME_PACKAGE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[RUNTIME_PACKAGE]
        raise


def _inside_comfyui() -> bool:
    """ComfyUI imports `folder_paths` before it loads custom nodes; pytest (which imports this
    file as the package of `tests/`) and other tools do not, and then nothing here runs."""
    return "folder_paths" in sys.modules


def _claim() -> Path | None:
    """Make this copy of the pack the active one; the folder of the copy already active, if any."""
    this = sys.modules[__name__]
    active = sys.modules.setdefault(ACTIVE_PACK_KEY, this)
    if active is this:
        return None
    return Path(active.__file__ or "").resolve().parent


WEB_DIRECTORY: str | None = "./web"


async def comfy_entrypoint() -> Any:
    """ComfyUI's V3 entry point: the pack's nodes."""
    from comfy_api.latest import ComfyExtension, io

    from .nodes import NODES

    class MizuotoExtension(ComfyExtension):
        async def get_node_list(self) -> list[type[io.ComfyNode]]:
            return list(NODES)

    return MizuotoExtension()


def _add_routes() -> None:
    """Read-only routes (ComfyUI also serves them under /api/)."""
    from aiohttp import web
    from server import PromptServer

    from mizuoto_runtime.app.host import PROCESS

    instance = getattr(PromptServer, "instance", None)
    if instance is None:
        log.debug("Mizuoto: no ComfyUI server in this process; routes not added")
        return

    @instance.routes.get("/mizuoto/runtime")
    async def runtime_route(request: web.Request) -> web.Response:
        """M51: per model loaded, streamed and host bytes."""
        return web.json_response(PROCESS.runtime().describe())

    @instance.routes.get("/mizuoto/checkpoints")
    async def checkpoints_route(request: web.Request) -> web.Response:
        """Per engine, the checkpoints it can load with their speakers and languages (the
        dropdowns of the web extension); no input, no absolute path."""
        from .nodes import paths

        return web.json_response(paths.catalog().as_dict())


def _current_prompt() -> tuple[str, dict[str, Any]] | None:
    """The prompt ComfyUI's worker runs now: (prompt id, API prompt), or None (no server, or
    between prompts). Queue items are (number, prompt id, prompt, extra data, outputs) in
    v0.3.64 through v0.8.0 and newer."""
    from server import PromptServer

    queue = getattr(getattr(PromptServer, "instance", None), "prompt_queue", None)
    if queue is None:
        return None
    # The volatile read copies no queued prompt (this runs as each Mizuoto node starts).
    running, _ = getattr(queue, "get_current_queue_volatile", queue.get_current_queue)()
    return (str(running[0][1]), running[0][2]) if running else None


def _read_settings_dialog() -> None:
    """Mizuoto nodes apply the `compute.*` values of ComfyUI's settings dialog, read from the
    file ComfyUI's user manager writes them to (see `mizuoto_runtime.app.ui_settings`)."""
    import folder_paths

    from mizuoto_runtime.app.host import PROCESS
    from mizuoto_runtime.app.ui_settings import ComfyUISettings

    PROCESS.use_layers(ComfyUISettings(Path(folder_paths.get_user_directory()), _current_prompt))


if _inside_comfyui():
    _active = _claim()
    if _active is None:
        try:
            _import_runtime()
            from .nodes import NODES  # noqa: F401  (registers models/mizuoto before ComfyUI lists folders)

            _add_routes()
            _read_settings_dialog()
        except BaseException:
            sys.modules.pop(ACTIVE_PACK_KEY, None)  # a copy that failed to load is not the active one
            raise
    else:
        log.warning("Mizuoto: another copy of this pack is already loaded from %s; skipping the copy at %s "
                    "(remove one of the two folders from custom_nodes)",
                    _active, Path(__file__).resolve().parent)
        WEB_DIRECTORY = None
        NODE_CLASS_MAPPINGS: dict[str, Any] = {}  # ComfyUI loads this copy as a pack without nodes

__all__ = ["WEB_DIRECTORY", "comfy_entrypoint"]
