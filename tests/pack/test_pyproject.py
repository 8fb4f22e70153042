"""The package's declared requirements match what the code needs (issue 9, item 6)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def test_the_torch_floor_has_the_out_of_memory_error_the_runtime_catches() -> None:
    """Phases retry on `torch.OutOfMemoryError` (M40), which torch has from 2.5 on."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirement = next(d for d in project["dependencies"] if re.match(r"torch\b", d))
    floor = re.search(r">=\s*(\d+)\.(\d+)", requirement)
    assert floor is not None, requirement
    assert (int(floor[1]), int(floor[2])) >= (2, 5), requirement
    assert issubclass(torch.OutOfMemoryError, RuntimeError)


def test_slow_tests_are_marked_and_skipped_by_default() -> None:
    tomllib = pytest.importorskip("tomllib")
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(m.startswith("soak:") for m in options["markers"]) and "not soak" in options["addopts"]
