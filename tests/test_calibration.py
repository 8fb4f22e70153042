"""M47: working-memory calibration — ratio × 1.1 (max 16), per phase key, format version 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import make_manager
from models import TinyLM
from mizuoto_runtime import calibration as cal
from mizuoto_runtime.calibration import Calibration


def test_observe_remembers_ratio_with_margin_and_cap(tmp_path: Path) -> None:
    c = Calibration(tmp_path / "memory" / "calibration.json")
    assert c.observe("qwen3tts:talker", 100, 90) is None  # within the estimate: nothing learned
    assert c.observe("qwen3tts:talker", 100, 200) == pytest.approx(2.2)
    assert c.factor("qwen3tts:talker") == pytest.approx(2.2)
    assert c.observe("demo:decoder", 1, 1000) == 16.0
    data = json.loads((tmp_path / "memory" / "calibration.json").read_text())
    assert data["version"] == 2 and data["ratios"]["qwen3tts:talker"] == pytest.approx(2.2)
    assert Calibration(tmp_path / "memory" / "calibration.json").factor("demo:decoder") == 16.0


def test_other_format_versions_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"version": 1, "ratios": {"a:b": 3.0}}))
    assert Calibration(path).factor("a:b") == 1.0
    path.write_text("{broken")
    assert Calibration(path).factor("a:b") == 1.0


class FakeMeter:
    """Stands in for a CUDA device's allocator statistics (this machine has no GPU)."""

    def __init__(self, working: int) -> None:
        self.working = working

    def placed_now(self) -> None:
        return None

    def working_bytes(self, copies_bytes: int) -> int:
        return self.working


def test_a_phase_over_its_estimate_reserves_more_next_time(monkeypatch: pytest.MonkeyPatch) -> None:
    m = make_manager(64)
    h = m.register(TinyLM(), engine="eng", name="lm", kind="sequence")
    monkeypatch.setattr(cal.PhaseMeter, "for_device", staticmethod(lambda device, simulated: FakeMeter(3 << 20)))
    ctx = m.request()
    with ctx.use([h], 1 << 20, "talker") as first:
        pass
    assert m.calibration.factor("eng:talker") == pytest.approx(3.3)
    with ctx.use([h], 1 << 20, "talker") as second:
        pass
    assert first[0].working_bytes == 1 << 20
    assert second[0].working_bytes == int((1 << 20) * 3.3)  # M6: estimate × calibration factor
