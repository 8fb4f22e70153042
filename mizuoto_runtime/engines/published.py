"""Published models as data: each engine's published checkpoints, built on the meta device by
the engine's own loader, and what the memory runtime makes of them (issue 35).

Placement depends only on shapes. A model built on `meta` costs no memory and has the same
units, fixed part and minimum working set as the real one, so the runtime can say before any
download what a published model needs and how it will be placed.

The interface (stable; a new engine joins by adding one module):

* An engine package has a module ``published.py`` (the engine class names it: ``PUBLISHED =
  "published"``; the default None: no published models, the demo and dummy) with one name,
  ``MODELS``: a tuple of `PublishedModel`. Each gives the model's name and Hugging Face repo,
  its run precision, the engine's checkpoint version it is, and ``files``: the checkpoint
  folder's files its loader reads configuration from, as the publisher ships them — a dict
  (written as JSON, or YAML for ``.yaml``), a str (written as text), a callable that writes
  the file (a torch file holding a config: GPT-SoVITS), or None (an empty file the loader
  only checks is there: the weights). Only configuration goes in: the facts the loader reads.
* `build(model, manager)` writes those files into a temporary folder and constructs the
  engine class on it exactly as a user's load does (its ``__init__``: the same loader, the same
  components, kinds and marks, registered with `manager`), inside `nn.loading.shapes_only`:
  parameters are created on `meta` and no weight is read (`load_safetensors` and
  ``nn.Module.load_state_dict`` keep the meta tensors). A loader that reads more than configs
  and weights (a tokenizer, a feature extractor) skips that where `nn.loading.reading_weights()`
  is false. The handles' plans are then the real model's.
* ``Engine.typical_phases(seconds)`` (each engine, `base.PhaseEstimate`): the phases of a
  typical request giving `seconds` of speech — each phase's handles and the working-memory
  estimate the engine's own phase code asks for — from the engine's own estimate functions.
  `fit.py` (the fit table, ``mizuoto doctor --fit``) places each phase with the manager's own
  budget split and each handle's own unit choice.
* `shapes(engine)` reports per handle: units, size, fixed part and minimum working set (the
  runtime's numbers: `memory.units`, `ModelHandle`), and each phase's estimate for a 20 s line
  and a 2-minute script (`TYPICAL_SECONDS`).

A new engine (VibeVoice, Higgs Audio, Chatterbox, Dia, CSM) joins with: ``published.py`` whose
``MODELS`` carry its published config files as dicts; a loader that fills weights through
`nn.loading.load_safetensors` (or ``load_state_dict``) and builds its modules with
`build_on_meta` or plain constructors (both give meta parameters under `shapes_only`), with
any tokenizer load behind ``reading_weights()``; and ``typical_phases``. Its meta build is then
tested with every other engine's (``tests/engines/test_published.py`` lists the engines).

For bench/full_size.py: `build` gives the meta engine; its handles' modules name every tensor
with its published shape and dtype, and `PublishedModel.files` are the configs to write beside
the weights.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import MizuotoError
from ..nn.loading import shapes_only

if TYPE_CHECKING:
    from ..memory.manager import ModelManager
    from .base import Engine

log = logging.getLogger(__name__)

#: A typical request: a 20 s line, and a 2-minute script.
TYPICAL_SECONDS = (20.0, 120.0)

FileContent = Mapping[str, Any] | str | Callable[[Path], None] | None


@dataclasses.dataclass(frozen=True)
class PublishedModel:
    """One published checkpoint of an engine, as data."""

    engine: str  # the engine id (its package's name)
    name: str  # as its model card names it
    repo: str  # where it is published (a Hugging Face repo id)
    files: Mapping[str, FileContent]  # path in the checkpoint folder -> its content (see the module docstring)
    dtype: torch.dtype = torch.bfloat16  # the precision it runs in by default
    version: str | None = None  # the engine's checkpoint version (its VERSIONS) this model is

    def write(self, folder: Path) -> Path:
        """Its config files, and empty stand-ins for its weight files, in `folder`."""
        for relative, content in self.files.items():
            path = folder / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            if content is None:
                path.write_bytes(b"")
            elif callable(content):
                content(path)
            elif isinstance(content, str):
                path.write_text(content, encoding="utf-8")
            elif path.suffix in (".yaml", ".yml"):
                import yaml

                path.write_text(yaml.safe_dump(dict(content), sort_keys=False), encoding="utf-8")
            else:
                path.write_text(json.dumps(content, indent=2), encoding="utf-8")
        return folder


def published_models(engine_id: str) -> tuple[PublishedModel, ...]:
    """The published models of an engine (empty where it declares none)."""
    from . import engine_class

    cls = engine_class(engine_id)
    if cls.PUBLISHED is None:
        return ()
    models: tuple[PublishedModel, ...] = cls.package_module(cls.PUBLISHED).MODELS
    return models


def find(name: str) -> PublishedModel:
    """The published model called `name` (as `PublishedModel.name`), in any engine."""
    from . import ENGINES

    known = [m for e in ENGINES for m in published_models(e)]
    for model in known:
        if model.name == name:
            return model
    raise MizuotoError(f"unknown published model {name!r}; known: {', '.join(m.name for m in known)}")


@contextmanager
def written(model: PublishedModel) -> Iterator[Path]:
    """A temporary checkpoint folder holding `model`'s config files (removed after the block)."""
    with tempfile.TemporaryDirectory(prefix=f"mizuoto-{model.engine}-") as tmp:
        yield model.write(Path(tmp))


def build(model: PublishedModel, manager: ModelManager, device: torch.device | None = None) -> Engine:
    """`model`'s engine built on meta by its own loader and registered with `manager` (see the
    module docstring). It places and reports like the real model; it cannot run a request."""
    from . import engine_class

    cls = engine_class(model.engine)
    with written(model) as folder, shapes_only():
        engine = cls(manager, folder, model.dtype, device)
    engine.model_dir = None  # the folder is gone: nothing may read it again
    return engine


@dataclasses.dataclass(frozen=True)
class HandleShape:
    """One component as the runtime plans it (`memory.units`, `ModelHandle`)."""

    name: str
    kind: str
    units: int
    size_bytes: int
    fixed_bytes: int
    min_working_set: int


@dataclasses.dataclass(frozen=True)
class PhaseShape:
    """A phase of a typical request: its components and working-memory estimate."""

    name: str
    seconds: float
    handles: tuple[str, ...]
    estimate: int


@dataclasses.dataclass(frozen=True)
class Shapes:
    """What `shapes` reports of one built engine."""

    handles: tuple[HandleShape, ...]
    phases: tuple[PhaseShape, ...]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def shapes(engine: Engine, seconds: tuple[float, ...] = TYPICAL_SECONDS) -> Shapes:
    """Per handle: units, size, fixed part and minimum working set; per phase of a typical
    request of each of `seconds`: its components and the engine's estimate."""
    handles = tuple(HandleShape(h.name, h.kind, len(h.units), h.size_bytes, h.plan.fixed_bytes, h.min_working_set)
                    for h in engine.handles())
    phases = tuple(PhaseShape(p.name, s, tuple(h.name for h in p.handles), p.memory)
                   for s in seconds for p in engine.typical_phases(s))
    return Shapes(handles, phases)

