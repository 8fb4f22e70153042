"""`mizuoto say | runtime | doctor` (M50–M52)."""
from __future__ import annotations

import importlib.util
import json
import wave
from pathlib import Path

import pytest

from mizuoto_runtime.cli import main


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
