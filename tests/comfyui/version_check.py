"""The accounting protocol against one ComfyUI release's real `comfy/model_management.py` and
`comfy/model_patcher.py` (issue 17): run by `test_comfyui_versions.py` as
`PYTHON version_check.py VERSION_DIR` where VERSION_DIR holds that release's `comfy/` package
(see the test's docstring). Runs every check of `accounting_checks.py` and prints one JSON line
per check: {"check", "ok", "error"}.
"""
from __future__ import annotations

import sys
from pathlib import Path

VERSION_DIR = Path(sys.argv[1]).resolve()
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(VERSION_DIR))
sys.path.append(str(REPO))
sys.argv = [sys.argv[0], "--cpu", "--reserve-vram", "4"]  # accounting_checks.COMFYUI_ARGS

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()

from accounting_checks import CHECKS, COMFYUI_ARGS, report  # noqa: E402

if __name__ == "__main__":
    assert sys.argv[1:] == COMFYUI_ARGS, sys.argv
    report(CHECKS)
