"""M60: a training job owns its device through the manager's exclusive slots (`own_device`):
running phases end first, new phases wait until it ends (checking for cancellation), idle
components and the host's other models leave the device, and the placement log shows it. The
job's whole run (a real training process) is in test_training_qwen3tts.py."""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from mizuoto_runtime import CancelledError, DeviceService, ModelManager
from mizuoto_runtime.app.training.job import own_device

from conftest import make_manager
from support.models import TinyLM

CPU = torch.device("cpu")
HOLD_S = 0.4
JOB = "training:job"


def hold_for(m: ModelManager, seconds: float, started: threading.Event, who: str = JOB) -> None:
    with own_device(m, CPU, who):
        started.set()
        time.sleep(seconds)


def actions(m: ModelManager) -> list[str]:
    return [a for a, _, _ in m.events]


def test_a_phase_waits_while_a_job_holds_the_device() -> None:
    m = make_manager(64)
    lm = m.register(TinyLM(layers=3), engine="e", name="lm", kind="sequence")
    started = threading.Event()
    job = threading.Thread(target=hold_for, args=(m, HOLD_S, started))
    job.start()
    assert started.wait(5)
    began = time.monotonic()
    with m.request().use([lm], 0, "p"):
        waited = time.monotonic() - began
    job.join(5)
    assert waited > HOLD_S / 2
    assert actions(m) == ["exclusive", "exclusive_end", "place"]  # placed only once the job ended


def test_the_job_waits_for_a_running_phase_to_end() -> None:
    m = make_manager(64)
    lm = m.register(TinyLM(layers=3), engine="e", name="lm", kind="sequence")
    order: list[str] = []
    in_phase, leave = threading.Event(), threading.Event()

    def request() -> None:
        with m.request().use([lm], 0, "p"):
            in_phase.set()
            leave.wait(5)
            order.append("phase ended")

    runner = threading.Thread(target=request)
    runner.start()
    assert in_phase.wait(5)
    threading.Timer(HOLD_S, leave.set).start()
    with own_device(m, CPU, JOB):
        order.append("job holds")
        assert lm.in_use == 0
    runner.join(5)
    assert order == ["phase ended", "job holds"]


class OtherModels:
    """Another host's accounting on the device (ComfyUI's, M35): gives back what it is asked."""

    def __init__(self, holds: int) -> None:
        self.holds = holds
        self.asked: list[tuple[torch.device, int, tuple[Any, ...]]] = []

    def free_for(self, device: torch.device, nbytes: int, keep: Sequence[Any]) -> int:
        self.asked.append((device, nbytes, tuple(keep)))
        freed, self.holds = min(nbytes, self.holds), max(0, self.holds - nbytes)
        return freed

    def on_placed(self, handles: Any) -> None:
        pass


def test_the_job_moves_every_idle_model_off_first() -> None:
    m = make_manager(64)
    lm = m.register(TinyLM(layers=3), engine="e", name="lm", kind="sequence")
    with m.request().use([lm], 0, "p"):
        pass
    placed = lm.loaded_bytes
    assert placed > 0
    m.external = others = OtherModels(holds=3 << 20)
    with own_device(m, CPU, JOB) as freed:
        assert m.devices.counted_bytes(CPU) == 0 and lm.loaded_bytes == 0
        assert freed == placed + (3 << 20)  # ours, and the other host's
    assert others.asked == [(CPU, m.devices.total_bytes(CPU), ())]  # the whole device
    log = list(m.events)
    assert log[log.index(("exclusive", JOB, 0)) + 1] == ("yield", "e:lm", placed)  # released inside the hold
    assert log[-1] == ("exclusive_end", JOB, 0)


def test_a_waiting_phase_checks_for_cancellation() -> None:
    m = make_manager(64)
    lm = m.register(TinyLM(layers=3), engine="e", name="lm", kind="sequence")
    started = threading.Event()
    job = threading.Thread(target=hold_for, args=(m, 2.0, started))
    job.start()
    assert started.wait(5)
    deadline = time.monotonic() + 0.3

    def cancel() -> None:
        if time.monotonic() > deadline:
            raise CancelledError("interrupted")

    began = time.monotonic()
    with pytest.raises(CancelledError):
        with m.request(cancel_check=cancel).use([lm], 0, "p"):
            pass
    assert time.monotonic() - began < 1.5 and lm.in_use == 0
    job.join(5)
    with m.request().use([lm], 0, "p"):  # the job ended: phases run again
        pass


def test_a_second_job_waits_for_the_first() -> None:
    m = make_manager(64)
    started = threading.Event()
    first = threading.Thread(target=hold_for, args=(m, HOLD_S, started, "training:first"))
    first.start()
    assert started.wait(5)
    began = time.monotonic()
    with own_device(m, CPU, "training:second"):
        waited = time.monotonic() - began
    first.join(5)
    assert waited > HOLD_S / 2
    assert list(m.events) == [("exclusive", "training:first", 0), ("exclusive_end", "training:first", 0),
                              ("exclusive", "training:second", 0), ("exclusive_end", "training:second", 0)]


def test_on_the_plain_cpu_nothing_is_held() -> None:
    """M5: nothing moves on the plain CPU, so a job there holds nothing and phases run beside it."""
    m = ModelManager(DeviceService())
    lm = m.register(TinyLM(layers=3), engine="e", name="lm", kind="sequence", device=CPU)
    with own_device(m, CPU, JOB) as freed:
        done = threading.Thread(target=lambda: m.request().run("p", [lm], lambda: None))
        done.start()
        done.join(5)
        assert not done.is_alive() and freed == 0
    assert list(m.events) == []
