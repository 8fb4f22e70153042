"""What a native engine's reference stages work with (issue 22): the reference folder, the
`Check` of one computed output beside its recorded one, and the `Stage` that yields them.

An engine's package provides its stages in the module its class names (`Engine.REFERENCE`) as
``stages(ref: Reference) -> Iterable[Stage]``; the command that runs them and compares each
check is the application's (`mizuoto check-reference`, `reference_check`). The tolerances
(the fixture READMEs' rule): ``module`` (one module or one step) ``1e-4 * max(1, max|ref|)``,
``chain`` (a chained solve or a whole pipeline) ``1e-3``, ``exact`` (ids, lengths, flags).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from ..errors import MizuotoError

Kind = Literal["module", "chain", "exact"]
TOLERANCE: dict[str, float] = {"module": 1e-4, "chain": 1e-3, "exact": 0.0}


class Reference:
    """One reference folder: its tensors, its json and its checkpoint folder."""

    def __init__(self, folder: str | Path) -> None:
        from safetensors.torch import load_file

        self.folder = Path(folder)
        missing = [n for n in ("ckpt", "reference.safetensors", "reference.json") if not (self.folder / n).exists()]
        if missing:
            raise MizuotoError(f"reference folder {self.folder} lacks {', '.join(missing)}")
        self.ckpt = self.folder / "ckpt"
        self.tensors: dict[str, torch.Tensor] = load_file(str(self.folder / "reference.safetensors"))
        with open(self.folder / "reference.json", encoding="utf-8") as f:
            self.meta: dict[str, Any] = json.load(f)
        self.cache: dict[str, Any] = {}  # what stages share (a loaded model, a run's outputs)

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise KeyError(f"reference.safetensors has no tensor {name!r}")
        return self.tensors[name]

    def has(self, name: str) -> bool:
        return name in self.tensors

    def shared(self, key: str, make: Callable[[], Any]) -> Any:
        """`make()` once per folder, for what several stages use."""
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]

    def outputs(self) -> list[str]:
        return sorted(n for n in self.tensors if ".out." in n)


@dataclasses.dataclass
class Check:
    """One computed output beside its reference: `want` defaults to the tensor `name`."""

    name: str
    got: torch.Tensor | Sequence[int] | int | None
    kind: Kind = "module"
    want: torch.Tensor | Sequence[int] | int | None = None
    # How far the same computation moves when its recorded input changes by about one float32
    # ulp (for ill-conditioned outputs); shown beside the error, never changes PASS/FAIL.
    conditioning: float | None = None


@dataclasses.dataclass
class Stage:
    name: str
    run: Callable[[], Iterable[Check]]
