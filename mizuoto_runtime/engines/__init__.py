"""The engines: one package per engine, each registered by itself (issues 22, 32).

Every subpackage of this folder is an engine, its id the package's name. The package follows
one template: ``config.py`` (its configuration read as data), ``checkpoint.py`` (its folder
layout and safe loading), its model files, ``engine.py`` (the `Engine` subclass: phases and
their estimates), ``tiny.py`` (``write(directory, *, version, seed, dtype)``) and
``reference.py`` (the stages of ``mizuoto check-reference``); an engine over an upstream
package has ``config.py`` and ``checkpoint.py`` only where it has something of its own to put
there. The engine class declares the rest (see `Engine`): requirements, versions, which of
those modules it has, its LoRA adapter. `ENGINES` is found by listing the packages, so adding
an engine is adding its package; no other file names it.

Engines are imported lazily: listing them imports none, and an engine module imports its
upstream package (an optional extra) only when it loads a model. What engines share is here:
`base`, `lora`, `checkpoint_files`, `tiny`; model blocks that more than one engine uses are in
`mizuoto_runtime.nn`."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys

from ..errors import MizuotoError
from .base import CheckpointInfo, Codes, Engine, Sampling, SmallWeights, TinyWriter, Turn, Voice, check_request
from .lora import LoraAdapter, LoraChoice

ENGINE_MODULE = "engine"  # the module of an engine package that defines its engine class


def discover() -> dict[str, str]:
    """Engine id -> its package, for every package in this folder, by name."""
    return {m.name: f"{__name__}.{m.name}" for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name)
            if m.ispkg}


ENGINES: dict[str, str] = discover()


def install_hint(extra: str) -> str:
    """How to install an engine's package into this environment: tools/install.sh, which installs
    requirements/<extra>.txt and the other engines without pip's resolver, under constraints
    that keep every installed package at its version (a bare `pip install -r` could move one)."""
    return (f"tools/install.sh --engines {sys.executable}, from the Mizuoto folder: every engine, "
            f"requirements/{extra}.txt among them, without changing any installed package")


def engine_class(engine_id: str) -> type[Engine]:
    """The engine class its package's ``engine`` module defines (the `Engine` subclass whose id
    is the package's name)."""
    if engine_id not in ENGINES:
        raise MizuotoError(f"unknown engine {engine_id!r}; known: {', '.join(ENGINES)}")
    module_name = f"{ENGINES[engine_id]}.{ENGINE_MODULE}"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        # A package it needs beyond the core is missing (its requirements file is named after it).
        third_party = bool(exc.name) and not str(exc.name).startswith(__name__.partition(".")[0])
        hint = f" (install it with: {install_hint(engine_id)})" if third_party else ""
        raise MizuotoError(f"engine {engine_id!r} cannot be imported: {exc}{hint}") from exc
    found = [cls for _, cls in inspect.getmembers(module, inspect.isclass)
             if issubclass(cls, Engine) and cls.__module__ == module_name and cls.__dict__.get("id") == engine_id]
    if len(found) != 1:
        raise MizuotoError(f"{module_name} must define one Engine subclass with id = {engine_id!r} "
                           f"(the package's name), found {len(found)}")
    return found[0]


__all__ = [
    "ENGINES", "CheckpointInfo", "Codes", "Engine", "LoraAdapter", "LoraChoice", "Sampling", "SmallWeights",
    "TinyWriter", "Turn", "Voice", "check_request", "discover", "engine_class", "install_hint",
]
