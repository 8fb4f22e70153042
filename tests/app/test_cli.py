"""`mizuoto say | runtime | doctor` (M50–M52)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import wave
from pathlib import Path

import pytest

from mizuoto_runtime.app.cli import main
from mizuoto_runtime.memory.cuda_allocator import from_arguments


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out) if code == 0 else {}


def test_say_writes_a_wav_and_prints_the_memory_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "hello.wav"
    code, result = run(capsys, "say", "Hello there", "-o", str(out), "--seed", "3",
                       "--setting", "compute.simulate_vram_mb=10")
    assert code == 0
    with wave.open(str(out)) as f:
        assert f.getframerate() == 16000 and f.getnframes() > 1000
    memory = result["memory"]
    assert memory["streamed_mb"] > 0 and "demo:talker" in memory["partial"]
    assert memory["partial"]["demo:talker"]["reason"] == "budget too small"


def test_same_seed_same_audio(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, sim in (("a.wav", "10"), ("b.wav", "64")):
        run(capsys, "say", "same seed", "-o", str(tmp_path / name), "--seed", "4",
            "--setting", f"compute.simulate_vram_mb={sim}")
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()


def test_voice_cloning_from_a_wav(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "say", "reference", "-o", str(tmp_path / "ref.wav"))
    code, result = run(capsys, "say", "cloned", "-o", str(tmp_path / "out.wav"), "--voice", str(tmp_path / "ref.wav"))
    assert code == 0 and "demo:speaker_encoder" in result["memory"]["components"]


def test_bad_setting_is_one_clear_error(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    assert main(["say", "x", "--setting", "compute.vram_mode=tiny"]) == 2
    assert "compute.vram_mode" in caplog.text


def test_doctor_lists_the_memory_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code, result = run(capsys, "doctor")
    assert code == 0
    assert {"mode", "reserve_mb", "limit_mb", "ram_reserve_mb", "host_copies", "pinned_budget_mb",
            "copy_streams", "oom_retry", "oom_fallback"} <= set(result["memory"])
    assert result["engines"]["demo"] == "ok"
    for engine, package in (("qwen3tts", "qwen_tts"), ("f5tts", "f5_tts"), ("omnivoice", "omnivoice")):
        installed = importlib.util.find_spec(package) is not None
        assert (result["engines"][engine] == "ok") == installed, result["engines"]
        assert installed or f"requirements/{engine}.txt" in result["engines"][engine]


def test_runtime_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, result = run(capsys, "runtime", "--setting", "compute.simulate_vram_mb=32")
    assert code == 0 and result["device"]["simulated"] is True and result["models"] == []


#: Run in a fresh process: records PYTORCH_CUDA_ALLOC_CONF at the moment torch is first
#: imported (a meta-path finder that only watches), then runs the command line's entry point.
WATCH_TORCH_IMPORT = """
import json, os, sys

class Watch:
    seen = None
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and Watch.seen is None:
            Watch.seen = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "<unset>")
        return None

sys.meta_path.insert(0, Watch())
from mizuoto_runtime.entry import main
code = main(sys.argv[1:])
sys.stderr.write("\\nTORCH-SAW " + json.dumps(Watch.seen) + "\\n")
raise SystemExit(code)
"""


@pytest.mark.parametrize("form", [["--setting", "compute.cuda_allocator=async"],
                                  ["--setting=compute.cuda_allocator=async"]])
def test_the_entry_point_sets_the_allocator_before_torch_loads(form: list[str]) -> None:
    """M54, issue 27: torch reads PYTORCH_CUDA_ALLOC_CONF as its CUDA library loads; the entry
    point writes it first, and the runtime then reports it in force (a fresh process)."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", WATCH_TORCH_IMPORT, "doctor", *form], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.rsplit("TORCH-SAW ", 1)[1].strip() == '"backend:cudaMallocAsync"'
    report = json.loads(done.stdout)["cuda_allocator"]
    assert report["applied"] == "async (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync)"


def test_importing_the_package_does_not_import_torch() -> None:
    """What lets the entry point run before torch loads."""
    root = Path(__file__).resolve().parents[2]
    code = "import sys, mizuoto_runtime, mizuoto_runtime.entry; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]


def test_allocator_setting_is_read_from_the_arguments() -> None:
    assert from_arguments(["say", "x", "--setting", "compute.cuda_allocator=async"]) == "async"
    assert from_arguments(["--setting=compute.cuda_allocator = expandable", "--setting", "compute.gpu_jobs=2"]) \
        == "expandable"
    assert from_arguments(["say", "compute.cuda_allocator=async"]) is None  # not a --setting
