"""`bench/shared_gpu.py --dry-run` against a real ComfyUI (issue 17's shared-GPU scenario, on the
CPU: the code path only; the measurement needs a GPU)."""
from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from comfyui_harness import COMFYUI_PATH, COMFYUI_PYTHON, REPO, comfyui_env, requires_comfyui

pytestmark = requires_comfyui
TIMEOUT_S = 1200


def test_the_shared_gpu_scenario_runs_dry() -> None:
    with tempfile.TemporaryDirectory(prefix="mizuoto-shared-") as folder:
        out = Path(folder) / "shared.json"
        done = subprocess.run([COMFYUI_PYTHON, str(REPO / "bench" / "shared_gpu.py"), "--comfyui", COMFYUI_PATH,
                               "--dry-run", "--out", str(out)], capture_output=True, text=True, timeout=TIMEOUT_S,
                              env={**comfyui_env(), "MIZUOTO_CACHE": str(Path(folder) / "cache")})
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        (result,) = json.loads(out.read_text())
    assert result["aimdo"] == "off" and result["checkpoint_reads_after_load"] == 0
    assert result["diffusion_entry_kept"] and not result["our_handles_unloaded"]
    assert result["tts_memory"]["components"], result["tts_memory"]
