"""The accounting protocol against the real `comfy/model_management.py` and `model_patcher.py`
of every ComfyUI release listed in `versions/VERSIONS.txt` (issue 17): `free_memory`,
`load_models_gpu`, `unload_all_models`, `cleanup_models`, `unload_model_and_clones` over a
ComfyUI `ModelPatcher` entry plus our adapters (`accounting_checks.py` says what each check shows).

The releases' files come from a folder named by `COMFYUI_VERSIONS_DIR`, prepared by hand and never
committed: one subfolder per line of VERSIONS.txt, holding that commit's `comfy/`, `comfy_api/`,
`comfy_execution/`, `utils/`, `node_helpers.py`, `comfyui_version.py` and a `COMMIT` file (or a
whole tree: the 0.38.1 overlay is a copy of v0.33.0's with 0.38.1's accounting files laid over
it). Its Python (`COMFYUI_VERSIONS_PYTHON`, else `COMFYUI_PYTHON`, else this one) needs what those
releases import: torch, comfy-aimdo, comfy-kitchen, and ComfyUI's plain requirements (the v0.33.0
lab's venv has them all). Without the variable, or
for a release whose folder is missing, the test skips and says why.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from comfyui_harness import run_checks

HERE = Path(__file__).resolve().parent
VERSIONS_FILE = HERE / "versions" / "VERSIONS.txt"
VERSIONS_DIR = os.environ.get("COMFYUI_VERSIONS_DIR", "")
PYTHON = os.environ.get("COMFYUI_VERSIONS_PYTHON") or os.environ.get("COMFYUI_PYTHON") or sys.executable
TIMEOUT_S = 300


def listed() -> list[tuple[str, str]]:
    """(folder, commit) for each release in VERSIONS.txt."""
    rows = []
    for line in VERSIONS_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            folder, commit = line.split()[:2]
            rows.append((folder, commit))
    return rows


def test_versions_file_lists_full_commit_ids() -> None:
    rows = listed()
    assert len(rows) >= 3 and all(len(commit) == 40 and int(commit, 16) >= 0 for _, commit in rows)


@pytest.mark.skipif(not VERSIONS_DIR, reason="COMFYUI_VERSIONS_DIR is not set: the version harness needs a "
                                               "folder of ComfyUI releases (see this file's docstring)")
@pytest.mark.parametrize(("folder", "commit"), listed(), ids=[f for f, _ in listed()])
def test_the_protocol_holds_on_this_release(folder: str, commit: str) -> None:
    where = Path(VERSIONS_DIR) / folder
    if not (where / "comfy" / "model_management.py").is_file():
        pytest.skip(f"{where} has no comfy/model_management.py: release {folder} ({commit}) not prepared")
    stamp = (where / "COMMIT").read_text().strip() if (where / "COMMIT").is_file() else ""
    assert commit.startswith(stamp) and stamp, f"{where}/COMMIT says {stamp!r}, VERSIONS.txt says {commit}"
    results = run_checks([PYTHON, str(HERE / "version_check.py"), str(where)], where, TIMEOUT_S, dict(os.environ))
    failed = {name: r["error"] for name, r in results.items() if not r["ok"]}
    assert not failed, "\n".join(f"{name}:\n{error}" for name, error in failed.items())
