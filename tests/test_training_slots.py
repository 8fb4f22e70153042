"""M60: a training job takes every slot of its device: running phases end first, new phases
wait until it ends (checking for cancellation), and the placement log shows it."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from conftest import make_manager
from models import TinyLM
from mizuoto_runtime import CancelledError
from mizuoto_runtime.training.slots import JobSpec, gate_of

CPU = torch.device("cpu")
HOLD_S = 0.4


def hold_for(gate: object, seconds: float, started: threading.Event) -> None:
    with gate.hold(JobSpec(CPU, "job")):  # type: ignore[attr-defined]
        started.set()
        time.sleep(seconds)


def test_a_phase_waits_while_a_job_holds_the_device() -> None:
    m = make_manager(64)
    lm = m.register(TinyLM(layers=3), engine="e", name="lm", kind="sequence")
    gate = gate_of(m)
    assert gate_of(m) is gate  # one gate per manager
    started = threading.Event()
    job = threading.Thread(target=hold_for, args=(gate, HOLD_S, started))
    job.start()
    started.wait(5)
    began = time.monotonic()
    with m.request().use([lm], 0, "p"):
        waited = time.monotonic() - began
    job.join(5)
    assert waited > HOLD_S / 2
    actions = [a for a, _, _ in m.events]
    assert actions.index("train_end") < actions.index("place")  # placed only once the job ended


def test_the_job_waits_for_a_running_phase_to_end() -> None:
    m = make_manager(64)
    lm = m.register(TinyLM(layers=3), engine="e", name="lm", kind="sequence")
    gate = gate_of(m)
    order: list[str] = []
    in_phase, leave = threading.Event(), threading.Event()

    def request() -> None:
        with m.request().use([lm], 0, "p"):
            in_phase.set()
            leave.wait(5)
            order.append("phase ended")

    runner = threading.Thread(target=request)
    runner.start()
    in_phase.wait(5)
    threading.Timer(HOLD_S, leave.set).start()
    with gate.hold(JobSpec(CPU, "job")):
        order.append("job holds")
        assert lm.in_use == 0
    runner.join(5)
    assert order == ["phase ended", "job holds"]


def test_a_waiting_phase_checks_for_cancellation() -> None:
    m = make_manager(64)
    lm = m.register(TinyLM(layers=3), engine="e", name="lm", kind="sequence")
    gate = gate_of(m)
    started = threading.Event()
    job = threading.Thread(target=hold_for, args=(gate, 2.0, started))
    job.start()
    started.wait(5)
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
    gate = gate_of(m)
    started = threading.Event()
    first = threading.Thread(target=hold_for, args=(gate, HOLD_S, started))
    first.start()
    started.wait(5)
    began = time.monotonic()
    with gate.hold(JobSpec(CPU, "second")):
        waited = time.monotonic() - began
    first.join(5)
    assert waited > HOLD_S / 2
    assert [a for a, _, _ in m.events] == ["train", "train_end", "train", "train_end"]
