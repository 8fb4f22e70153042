"""M47: working-memory calibration — ratio × 1.1 (max 16), per engine and component, format version 2."""
from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import pytest
import torch

from mizuoto_runtime import Runtime
from mizuoto_runtime.memory import calibration as cal
from mizuoto_runtime.memory.calibration import Calibration, PhaseMeter

from conftest import MB, make_manager
from support.models import TinyLM


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

    def placed_now(self, copies_held: int = 0) -> None:
        return None

    def working_bytes(self, copies_peak: int, copies_held: int = 0) -> int:
        return self.working


def test_a_phase_over_its_estimate_reserves_more_next_time(monkeypatch: pytest.MonkeyPatch) -> None:
    m = make_manager(64)
    h = m.register(TinyLM(), engine="eng", name="lm", kind="sequence")
    monkeypatch.setattr(cal.PhaseMeter, "for_device", staticmethod(lambda device, simulated: FakeMeter(3 << 20)))
    ctx = m.request()
    with ctx.use([h], 1 << 20, "talker") as first:
        pass
    assert m.calibration.factor("eng:lm") == pytest.approx(3.3)  # engine and component
    with ctx.use([h], 1 << 20, "talker") as second:
        pass
    assert first[0].working_bytes == 1 << 20
    assert second[0].working_bytes == int((1 << 20) * 3.3)  # M6: estimate × calibration factor


def test_two_components_in_phases_of_one_name_keep_their_own_factors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen3-TTS runs its codec and speaker encoders each in a phase named "voice prompt"."""
    m = make_manager(64)
    codec = m.register(TinyLM(layers=1), engine="qwen3tts", name="codec_encoder")
    speaker = m.register(TinyLM(layers=1), engine="qwen3tts", name="speaker_encoder")
    ctx = m.request()
    for handle, used in ((codec, 3 << 20), (speaker, 5 << 20)):
        monkeypatch.setattr(cal.PhaseMeter, "for_device",
                            staticmethod(lambda device, simulated, used=used: FakeMeter(used)))
        with ctx.use([handle], 1 << 20, "voice prompt"):
            pass
    assert m.calibration.factor("qwen3tts:codec_encoder") == pytest.approx(3.3)
    assert m.calibration.factor("qwen3tts:speaker_encoder") == pytest.approx(5.5)
    with ctx.use([codec], 1 << 20, "voice prompt") as placed:
        pass
    assert placed[0].working_bytes == int((1 << 20) * 3.3)  # not the speaker encoder's factor


class StandInAllocator:
    """`torch.cuda`'s allocator statistics with a scripted history: `alloc` and `free` move the
    current count; the peak follows it until `reset_peak_memory_stats`."""

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0

    def alloc(self, nbytes: int) -> None:
        self.current += nbytes
        self.peak = max(self.peak, self.current)

    def free(self, nbytes: int) -> None:
        self.current -= nbytes

    def synchronize(self, device: torch.device) -> None:
        return None

    def memory_allocated(self, device: torch.device) -> int:
        return self.current

    def max_memory_allocated(self, device: torch.device) -> int:
        return self.peak

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        self.peak = self.current


WEIGHTS, COPY, WORK, POOL = 100 * MB, 20 * MB, 30 * MB, 5 * MB


@pytest.mark.parametrize("story", [
    "resident: no copies",
    "streamed: the copy buffers stay for the next phase",
    "streamed: copies freed at the end",
    "streamed, and a CUDA Graph pool left behind",
    "streamed with copies held from the phase before",
])
def test_phase_meter_measures_working_memory_against_known_peaks(story: str) -> None:
    """The peak above the weights, minus the streamer copies once, minus what is left behind."""
    api = StandInAllocator()
    api.alloc(WEIGHTS)
    streamed = story.startswith("streamed")
    held_before = COPY if "phase before" in story else 0
    api.alloc(held_before)
    meter = PhaseMeter(torch.device("cuda"), api)
    meter.placed_now(held_before)
    if streamed and not held_before:
        api.alloc(COPY)  # the unit's copy, made on entry
    if "Graph pool" in story:
        api.alloc(POOL)  # captured on the first step, kept with the model after the phase
    api.alloc(WORK)  # activations while it runs
    api.free(WORK)
    held = COPY if streamed else 0
    if "freed at the end" in story:
        api.free(COPY)
        held = 0
    assert meter.working_bytes(COPY if streamed else 0, held) == WORK


def test_calibration_on_a_streamed_phase_learns_the_working_memory_it_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: the simulated device's counter stands in for CUDA's allocator. The talker streams
    every layer (one copy stays cached after the phase); the phase uses 2 MB of working memory for an
    estimate of 1 MB and leaves 1 MB behind (like a graph pool): the factor learned is 2 × 1.1."""
    m = make_manager(64, vram_mode="none")
    devices, cpu = m.devices, torch.device("cpu")
    h = m.register(TinyLM(), engine="eng", name="talker", kind="sequence")

    class Counter:
        def synchronize(self, device: torch.device) -> None:
            return None

        def memory_allocated(self, device: torch.device) -> int:
            return devices.counted_bytes(device)

        def max_memory_allocated(self, device: torch.device) -> int:
            return devices.peak_counted_bytes(device)

        def reset_peak_memory_stats(self, device: torch.device) -> None:
            devices.reset_peak(device)

    monkeypatch.setattr(cal.PhaseMeter, "for_device",
                        staticmethod(lambda device, simulated: PhaseMeter(device, Counter())))

    def talk() -> None:
        devices.allocate(cpu, 1 * MB)  # left behind, as a graph pool captured on the first step
        with torch.no_grad():
            h.module.step(torch.zeros(1, 3, dtype=torch.long), [[] for _ in h.module.layers])
        devices.allocate(cpu, 2 * MB)  # working memory, while the last layer's copy is still cached
        devices.release(cpu, 2 * MB)
        held.append(h.streamer.cached_bytes(h))

    held: list[int] = []
    m.request().run("talker", [h], talk, 1 * MB)
    devices.release(cpu, 1 * MB)
    assert held[0] > 0  # the copy the old meter counted twice (dropped once the phase ends)
    assert m.calibration.factor("eng:talker") == pytest.approx(2.2)


@pytest.mark.parametrize("content", [
    b"\xff\xfe not UTF-8",
    b'{"version": 2, "ratios": [1.5, 2.0]}',
    b'{"version": 2, "ratios": null}',
    b'{"version": 2, "ratios": "eng:lm=3"}',
    b"[" * 100_000,
])
def test_an_unusable_calibration_file_is_ignored_with_one_log_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, content: bytes) -> None:
    path = tmp_path / "memory" / "calibration.json"
    path.parent.mkdir()
    path.write_bytes(content)
    monkeypatch.setenv("MIZUOTO_CACHE", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="mizuoto_runtime.memory.calibration"):
        rt = Runtime()  # M47: a damaged cache file never stops the runtime
    assert rt.manager.calibration.ratios == {}
    lines = [r for r in caplog.records if r.name == "mizuoto_runtime.memory.calibration"]
    assert len(lines) == 1 and str(path) in lines[0].getMessage(), [r.getMessage() for r in lines]


def test_non_finite_and_out_of_range_ratios_are_ignored_with_one_log_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "calibration.json"
    # json writes NaN and Infinity as bare words, and Python's json reads them back.
    path.write_text(json.dumps({"version": 2, "ratios": {
        "a:nan": float("nan"), "a:inf": float("inf"), "a:low": 0.5, "a:high": 17.0, "a:negative": -2,
        "a:flag": True, "a:text": "2", "a:list": [2], "a:good": 2.5, "a:edge": 16}}))
    with caplog.at_level(logging.INFO, logger="mizuoto_runtime.memory.calibration"):
        c = Calibration(path)
    assert c.ratios == {"a:good": 2.5, "a:edge": 16.0}
    lines = [r.getMessage() for r in caplog.records if r.name == "mizuoto_runtime.memory.calibration"]
    assert len(lines) == 1 and "a:inf" in lines[0] and "a:nan" in lines[0] and "a:good" not in lines[0], lines
    assert c.factor("a:inf") == 1.0 and c.factor("a:nan") == 1.0


def _fail_writes(code: int) -> object:
    def write_text(self: Path, *args: object, **kwargs: object) -> int:
        raise OSError(code, f"{errno.errorcode[code]} (test)", str(self))
    return write_text


@pytest.mark.parametrize("failure", ["parent is a file", "disk full", "permission"])
def test_a_calibration_file_that_cannot_be_written_never_fails_the_phase(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, failure: str) -> None:
    blocker = tmp_path / "memory"
    path = blocker / "calibration.json"
    if failure == "parent is a file":
        blocker.write_text("not a folder")
    else:
        monkeypatch.setattr(Path, "write_text", _fail_writes(errno.ENOSPC if failure == "disk full" else errno.EACCES))
    m = make_manager(64)
    m.calibration = Calibration(path)
    h = m.register(TinyLM(layers=1), engine="eng", name="lm")
    monkeypatch.setattr(cal.PhaseMeter, "for_device", staticmethod(lambda device, simulated: FakeMeter(3 << 20)))
    with caplog.at_level(logging.WARNING, logger="mizuoto_runtime.memory.calibration"):
        for _ in range(2):
            assert m.request().run("lm", [h], lambda: "done", 1 << 20) == "done"
            m.calibration.ratios.clear()  # so the second phase learns (and writes) again
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and str(path) in warnings[0], warnings  # once, not once per phase
    assert not list(tmp_path.rglob("*.tmp"))  # no half-written file left


def test_a_phase_another_request_overlapped_teaches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu_jobs > 1: the allocator's peak is the device's, so a phase during which another
    request held the device is not measured; one that ran alone still is (M8, M47)."""
    import threading

    m = make_manager(64, gpu_jobs=2)
    a = m.register(TinyLM(layers=1), engine="eng", name="a")
    b = m.register(TinyLM(layers=1), engine="eng", name="b")
    monkeypatch.setattr(cal.PhaseMeter, "for_device", staticmethod(lambda device, simulated: FakeMeter(3 << 20)))
    inside, leave = threading.Event(), threading.Event()

    def other_request() -> None:
        with m.request().use([b], 1 << 20, "other"):
            inside.set()
            leave.wait(5)

    with m.request().use([a], 1 << 20, "started alone"):
        other = threading.Thread(target=other_request)
        other.start()
        assert inside.wait(5)  # another request runs on the device during this phase
        leave.set()
        other.join(5)
    assert m.calibration.ratios == {}  # neither phase ran alone: nothing learned
    with m.request().use([a], 1 << 20, "alone"):
        pass
    assert m.calibration.factor("eng:a") == pytest.approx(3.3)
