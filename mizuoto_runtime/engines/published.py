"""Published models as data: each engine's published checkpoints, built on the meta device by
the engine's own loader, and what the memory runtime makes of them (issue 35).

Placement depends only on shapes. A model built on `meta` costs no memory and has the same
units, fixed part and minimum working set as the real one, so the runtime can say before any
download what a published model needs and how it will be placed.

The interface (stable; a new engine joins by adding one module and one class attribute):

* The engine class says ``PUBLISHED = "published"`` (the default, None: no published models,
  as the demo and dummy) and its package has ``published.py`` with one name, ``MODELS``: a
  tuple of `PublishedModel`. Each gives the model's name (as its model card), its repo, the
  precision it is published in (the build's dtype), the engine's checkpoint version, and
  ``files``: its checkpoint folder as the loader needs it, path -> content —
  - a dict: a config file as the publisher ships it (JSON; YAML for ``.yaml``), the facts;
  - a str: a text file (CosyVoice's HyperPyYAML);
  - a callable ``(path) -> None`` that writes the file: a torch file whose config or whose
    tensors' shapes the loader reads (GPT-SoVITS' ``.ckpt`` / ``.pth`` hold their configs;
    Fish Speech's ``codec.pth`` and IndexTTS-2's CAM++ have none but their tensors' shapes),
    written with the tensors' names and shapes and no data (``torch.zeros(()).expand(shape)``);
  - None: an empty file the loader only checks is there (weights, tokenizers).
* `build(model, manager)` writes those files into a temporary folder and constructs the
  engine class on it (or on the file ``choice`` names in it, where a user picks a file, as
  Chatterbox Multilingual's T3) exactly as a user's load does (its ``__init__``: the same loader, the same
  components, kinds and marks, registered with `manager`), inside `nn.loading.shapes_only`:
  every parameter is created on `meta` and no weight is read (`load_safetensors` and
  ``nn.Module.load_state_dict`` keep the meta tensors). Where a loader reads more than configs
  (a tokenizer, a feature extractor, a weights file it checks by hand), it skips that when
  `nn.loading.reading_weights()` is false. The handles' plans are then the real model's. The
  engine places on a simulated device (meta tensors are "copied" as meta tensors and counted)
  but cannot run a request.
* ``Engine.typical_phases(seconds)`` (each engine, `base.PhaseEstimate`): the phases of a
  typical request giving `seconds` of speech — each phase's handles and the working-memory
  estimate the engine's own phase code passes for it — from the engine's own estimate
  functions and `base.TYPICAL_*` (a 10 s reference, 15 characters a second).
  `app.fit` (the fit table, ``mizuoto doctor --fit``, the loader node's memory output) places
  each phase with the manager's own budget split (`ModelManager.planned_budgets`) and each
  handle's own unit choice (`ModelHandle.planned_units`).
* `shapes(engine)` reports per handle: units, size, fixed part and minimum working set (the
  runtime's numbers: `memory.units`, `ModelHandle`), and each phase's estimate for a 20 s line
  and a 2-minute script (`TYPICAL_SECONDS`).

A new engine (VibeVoice, Higgs Audio, Chatterbox, Dia, CSM) joins with: ``PUBLISHED =
"published"`` and ``published.py`` whose ``MODELS`` carry its published config files as dicts;
a loader that builds its modules with `build_on_meta` or plain constructors (both give meta
parameters under `shapes_only`) and fills weights through `nn.loading.load_safetensors` or
``load_state_dict`` (both keep meta tensors there), with any other file read behind
``reading_weights()``; and ``typical_phases``. Its builds are then tested with every other
engine's: ``tests/engines/test_published.py`` (every published model builds on meta and
reports), ``tests/app/test_fit.py`` (predicted placement = the manager's, on its tiny
checkpoint), and the README's fit table (``python tools/fit_table.py``) gains its rows.

For bench/full_size.py: `build` gives the meta engine; its handles' modules hold every tensor
with its published shape and dtype, named as the engine's modules name them (the loaders map
checkpoint key names onto these: `load_safetensors`' ``prefix`` / ``rename``, the engines' own
``fill`` functions), and `PublishedModel.write` writes the configs the folder needs beside the
weights.
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
    # What the loader is given, where it is a file inside the folder rather than the folder
    # (Chatterbox Multilingual: its T3 file in the shared repository); None: the folder.
    choice: str | None = None

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
        engine = cls(manager, folder / model.choice if model.choice else folder, model.dtype, device)
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

