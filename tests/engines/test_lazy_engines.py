"""Engine packages are imported only when an engine is loaded (issue 23 item 6): the CLI, the
ComfyUI host's modules, the engine table and the checkpoint scan (what ComfyUI's node
definitions and dropdowns run at start-up) import no upstream package, so neither ComfyUI's
start nor `mizuoto say` with the demo engine pays for engines it does not run. Behaviour, not
time: the start-up times are measured by hand (the closing note of issue 23)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Upstream packages of the engines, and the heavy libraries they bring (transformers alone
#: imports torchvision and torch._dynamo where they are installed).
UPSTREAM = ("qwen_tts", "f5_tts", "x_transformers", "vocos", "omnivoice", "voxcpm", "chatterbox", "perth", "diffusers",
            "transformers", "librosa", "scipy", "torchaudio", "torchvision")

START_UP = '''
import json, sys
from pathlib import Path
from support.layouts import qwen_layout
import mizuoto_runtime.app.host, mizuoto_runtime.app.comfy_bridge  # the ComfyUI pack's runtime side
from mizuoto_runtime.app.checkpoints import scan
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.engines import ENGINES, engine_class

root = Path(sys.argv[1])
qwen_layout(root / "qwen", "custom_voice")
for engine in ENGINES:
    engine_class(engine)
choices = scan([root]).as_dict()
assert main(["say", "Hello", "-o", str(root / "x.wav"), "--setting", "compute.simulate_vram_mb=10"]) == 0
print(json.dumps({"upstream": sorted(m for m in sys.modules if m.split(".")[0] in UPSTREAM_NAMES),
                  "qwen3tts": [c["path"] for c in choices["engines"]["qwen3tts"]["choices"]]}), file=sys.stderr)
'''


def test_start_up_and_a_demo_request_import_no_engine_package(tmp_path: Path) -> None:
    code = f"UPSTREAM_NAMES = {UPSTREAM!r}\n" + textwrap.dedent(START_UP)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={"PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "PATH": "/usr/bin:/bin",
                                             "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stderr.strip().splitlines()[-1])
    assert seen["qwen3tts"] == ["qwen"]  # the scan read the folder's configs
    assert seen["upstream"] == []
