"""The host the pack's nodes share: one `Runtime` per ComfyUI process, engines referenced by
sockets, and the idle and RAM rules run where users are (M29, M34). Never imports `comfy`:
joining ComfyUI's accounting is `comfy_bridge.install`, passed in as `join` (the pack's
`PROCESS` uses it; tests pass their own or none).

**Idle and RAM policy inside ComfyUI.** A ComfyUI process is a server, so
`compute.unload_after_minutes` applies (M34): every Mizuoto node calls `node_started()` when
it begins, which unloads engines idle for longer than that, and `node_finished()` when it
ends (also after an error), which relieves host RAM (M29) — for the phase nodes as much as
for the all-in-one TTS. Both run on the thread that executes nodes, the only thread on which
ComfyUI's `model_management` may be touched (it has no lock). A timer thread was rejected:
unloading an engine removes its entries from ComfyUI's list, and a timer would do that while
the prompt worker iterates it.

**RAM-pressure cache.** Newer ComfyUI evicts its node cache by the host bytes each cached
output holds, and sizes objects it does not know through `_comfy_cache_tensors()`.
`EngineRef` answers with its engine's host tensors, so a multi-GB engine counts as multi-GB
there and not as an unknown small object (issue 17, item 2).
"""
from __future__ import annotations

import collections
import functools
import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from ..engines import Engine, LoraChoice
from ..engines.voice_store import VoicePromptStore
from ..memory.policy import VramPolicy
from ..memory.service import RuntimeService
from .runtime import Runtime
from .ui_settings import Layers

log = logging.getLogger(__name__)

EngineKey = tuple[str, str | None, str, str, str | None]  # engine, folder, dtype, device, weights (None: the setting)
T = TypeVar("T")


class Accounting:
    """What the host needs of the accounting it joins (`comfy_bridge.ComfyAccounting`)."""

    def prune(self) -> None: ...
    def forget_all(self) -> None: ...


Join = Callable[[Runtime], Accounting]


class EngineRef:
    """The value of a `MIZUOTO_ENGINE` socket: which engine, resolved in the process runtime.

    The engine lives as long as any reference to it lives — ComfyUI's node cache holds the
    loader's output — so "Free model and node cache" (or removing the loader from the graph)
    unloads it from RAM too, like ComfyUI's own models.
    """

    def __init__(self, owner: ProcessRuntime, engine_id: str, model_dir: str | Path | None, dtype: str,
                 device: str = "auto", weights: str | None = None, lora: LoraChoice | None = None) -> None:
        self.owner = owner
        self.key: EngineKey = (engine_id, str(model_dir) if model_dir else None, dtype, device, weights)
        self.lora = lora
        owner._acquire(self.key)
        weakref.finalize(self, owner._release, self.key).atexit = False

    @property
    def engine(self) -> Engine:
        """The engine, loaded in the current runtime (again, after the runtime was replaced);
        `Runtime.engine` builds it outside ComfyUI's inference mode. Its weights are this
        reference's: a LoRA node's reference applies its LoRA, a plain one gives the engine its
        checkpoint's weights back (both do nothing when the engine already has them)."""
        engine = self.owner.runtime().engine(*self.key)
        engine.use_lora(self.lora)
        return engine

    def with_lora(self, lora: LoraChoice | None) -> EngineRef:
        """The same engine, with `lora` applied whenever it is used through the new reference."""
        return EngineRef(self.owner, *self.key, lora=lora)

    @property
    def runtime(self) -> Runtime:
        return self.owner.runtime()

    def _comfy_cache_tensors(self) -> list[torch.Tensor]:
        """The engine's host tensors, for ComfyUI's RAM-pressure cache (see the module doc).
        Nothing is loaded to answer: an engine not loaded now holds no RAM."""
        engine = self.owner.loaded_engine(self.key)
        if engine is None:
            return []
        return [t for h in engine.handles() for t in h.host_tensors()]

    def __repr__(self) -> str:
        engine_id, model_dir, dtype, device, weights = self.key
        lora = f", LoRA {self.lora.path.name} x{self.lora.strength:g}" if self.lora else ""
        stored = f", weights {weights}" if weights else ""
        return f"EngineRef({engine_id}, {model_dir or 'built-in weights'}, {dtype}, {device}{stored}{lora})"


class ProcessRuntime:
    """The one `Runtime` of a ComfyUI process, joined to ComfyUI's accounting by `join`."""

    def __init__(self, settings: Mapping[str, Any] | None = None, join: Join | None = None) -> None:
        self._settings = dict(settings or {})
        self._base = dict(settings or {})  # below the dialog's and the graph's layers
        self._join = join
        self._layers: Callable[[], Layers] | None = None
        self._node_graph: tuple[str | None, dict[str, Any]] = (None, {})  # set_graph_settings
        self._runtime: Runtime | None = None
        self._accounting: Accounting | None = None
        self._refs: collections.Counter[EngineKey] = collections.Counter()
        self._lock = threading.RLock()
        # Where engines keep prompted voices on disk; the pack points it into the voice library.
        self.prompt_store: VoicePromptStore | None = None

    def runtime(self) -> Runtime:
        with self._lock:
            if self._runtime is None:
                self._runtime = Runtime(self._settings)
                self._runtime.prompt_store = self.prompt_store
                self._accounting = self._join(self._runtime) if self._join is not None else None
            return self._runtime

    def configure(self, settings: Mapping[str, Any]) -> Runtime:
        """Apply `compute.*` settings (`VramPolicy.update`: all validated before any applies).
        A new `compute.simulate_vram_mb` needs a new device service: the runtime is rebuilt
        with the same policy and its engines load again on next use."""
        with self._lock:
            runtime = self.runtime()
            simulate = runtime.policy.simulate_vram_mb
            runtime.policy.update(settings)
            if runtime.policy.simulate_vram_mb != simulate:
                self._replace(runtime.policy.as_dict())
            return self.runtime()

    # ---- settings from the dialog and the graph (issue 15 item 3) --------------------------
    def use_layers(self, layers: Callable[[], Layers] | None) -> None:
        """Where the settings dialog's and the running graph's layers come from (the pack
        passes `ui_settings.ComfyUISettings`); each Mizuoto node applies them as it starts."""
        self._layers = layers

    def set_graph_settings(self, settings: Mapping[str, Any]) -> Runtime:
        """The Memory Settings node ran: its settings override the dialog's for the rest of
        the prompt running now (also values it took from links, which the prompt does not show)."""
        prompt_id = self._layers().prompt_id if self._layers is not None else None
        self._node_graph = (prompt_id, dict(settings))
        return self.apply_layers() if self._layers is not None else self.configure(settings)

    def apply_layers(self) -> Runtime:
        """Make the policy defaults < dialog < this graph's Memory Settings (see `ui_settings`);
        nothing changes (no engine reloads) when that is the policy already in force."""
        with self._lock:
            runtime = self.runtime()
            if self._layers is None:
                return runtime
            layers = self._layers()
            node_prompt, node_settings = self._node_graph
            graph = {**layers.graph, **(node_settings if node_prompt == layers.prompt_id else {})}
            wanted = VramPolicy({**self._base, **layers.dialog, **graph}).as_dict()
            if wanted != runtime.policy.as_dict():
                log.info("Mizuoto settings for this request: %s", ", ".join(
                    f"{key}={value}" for key, value in wanted.items() if runtime.policy.as_dict().get(key) != value))
                return self.configure(wanted)
            return runtime

    def _replace(self, settings: Mapping[str, Any]) -> None:
        old = self._runtime
        assert old is not None
        old.unload_engines()
        if self._accounting is not None:
            self._accounting.forget_all()
        log.info("Mizuoto runtime rebuilt for compute.simulate_vram_mb=%s", settings.get("compute.simulate_vram_mb"))
        self._settings = dict(settings)
        self._runtime = None
        self.runtime()

    def engine(self, engine_id: str, model_dir: str | Path | None = None, dtype: str = "float32",
               device: str = "auto", weights: str | None = None) -> EngineRef:
        """Load an engine now (errors surface at the loader node) and return a reference to it.
        `weights`: how its weights are stored (None: the `compute.weights` setting)."""
        ref = EngineRef(self, engine_id, model_dir, dtype, device, weights)
        _ = ref.engine
        return ref

    def loaded_engine(self, key: EngineKey) -> Engine | None:
        """The engine `key` names if the current runtime has it loaded (nothing is loaded)."""
        with self._lock:
            if self._runtime is None:
                return None
            return self._runtime.loaded_engine(*key)

    # ---- idle and RAM policy (M29, M34) ----------------------------------------------------
    def node_started(self) -> None:
        """A Mizuoto node begins: apply the dialog's and the graph's settings, then unload
        engines idle past `compute.unload_after_minutes`."""
        self.apply_layers()
        self._apply(RuntimeService.unload_idle)

    def node_finished(self) -> None:
        """A Mizuoto node ended (or failed): relieve host RAM below `compute.ram_reserve_mb`."""
        self._apply(RuntimeService.relieve_ram)

    def _apply(self, rule: Callable[[RuntimeService], object]) -> None:
        """Run one of the service's rules on the current runtime; drop ComfyUI entries of what it
        unloaded."""
        with self._lock:
            if self._runtime is not None and rule(self._runtime.service):
                self._prune()

    def around_node(self, execute: Callable[..., T]) -> Callable[..., T]:
        """Wrap a node's `execute` in `node_started` / `node_finished` (its signature is kept:
        ComfyUI reads it)."""

        @functools.wraps(execute)
        def wrapped(*args: Any, **kwargs: Any) -> T:
            self.node_started()
            try:
                return execute(*args, **kwargs)
            finally:
                self.node_finished()

        return wrapped

    # ---- references ------------------------------------------------------------------------
    def _acquire(self, key: EngineKey) -> None:
        with self._lock:
            self._refs[key] += 1

    def _release(self, key: EngineKey) -> None:
        with self._lock:
            self._refs[key] -= 1
            if self._refs[key] > 0:
                return
            del self._refs[key]
            if self._runtime is not None and self._runtime.unload_engine(*key):
                log.info("Mizuoto engine %s unloaded: ComfyUI no longer holds it", key[0])
                self._prune()

    def _prune(self) -> None:
        if self._accounting is not None:
            self._accounting.prune()


def fallback_switch(toggle: bool) -> bool | None:
    """M44: a node's `allow_fallback` toggle as the runtime's switch (`ctx.run(allow_fallback=)`).

    On: the engine's cheaper fallback is allowed whatever `compute.oom_fallback` says. Off: None,
    so that setting decides — a toggle left at its default never refuses what Memory Settings
    allow for the whole process."""
    return True if toggle else None


def _join_comfyui(runtime: Runtime) -> Accounting:
    from .comfy_bridge import install

    return install(runtime)


#: The process runtime of the ComfyUI pack (nodes and routes use it).
PROCESS = ProcessRuntime(join=_join_comfyui)


__all__ = ["PROCESS", "EngineKey", "EngineRef", "ProcessRuntime", "fallback_switch"]
