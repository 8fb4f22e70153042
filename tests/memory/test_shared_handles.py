"""Two requests on one engine and one handle at once (issue 9, M8, M17, M31).

The choice: requests may share a handle. While any request uses it, its placement is frozen
(nothing re-places, yields or caps it); the hooks' state is per call (per thread); threads
inside the same unit share its copy, and a thread needing a new copy while the handle's
copies are all in use by other threads waits for one, so concurrent calls stay within the
minimum working set. Torch's global RNG is one per process: phases where an engine's upstream
code samples from it (`Engine.seeded`) take turns. Threads on the simulated strict device (M55,
M56).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

from mizuoto_runtime import CancelledError, DeviceService, ModelManager, OomInjector, VramPolicy
from mizuoto_runtime.engines import Sampling
from mizuoto_runtime.engines.demo.engine import DemoEngine

from support.threads import run_on_threads

CPU = torch.device("cpu")
REQUESTS = {"left": ("hi", 1), "right": ("yo", 2)}  # text, seed: the two threads' requests


def sampling(seed: int) -> Sampling:
    return Sampling(seed=seed, max_new_tokens=8)


def say(m: ModelManager, engine: DemoEngine, text: str, seed: int,
        cancel_check: Callable[[], None] | None = None,
        on_progress: Callable[[int, int], None] | None = None) -> tuple[torch.Tensor, dict]:
    ctx = m.request(generator=torch.Generator().manual_seed(seed), cancel_check=cancel_check, on_progress=on_progress)
    voice = engine.voice_prompt(ctx, None, speaker=f"speaker{seed}")
    return engine.synthesize(ctx, text, voice, sampling(seed)).waveform, ctx.meta


@pytest.fixture(scope="module")
def plain() -> dict[str, torch.Tensor]:
    """The plain CPU runs, with one torch thread like the tests (results depend on the count)."""
    m = ModelManager(DeviceService(), VramPolicy())
    engine = DemoEngine(m)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {name: say(m, engine, text, seed)[0] for name, (text, seed) in REQUESTS.items()}
    finally:
        torch.set_num_threads(threads)


def threads(target: Callable[[str], None]) -> list[BaseException]:
    """Run `target(name)` for both requests on two threads; what they raised."""
    return run_on_threads([lambda name=name: target(name) for name in REQUESTS])


def assert_nothing_held(m: ModelManager, engine: DemoEngine) -> None:
    """After the requests: no unit entered, no copy, the device counter equals the placements."""
    for h in engine.handles():
        assert h.in_use == 0
        assert h.streamer.live_copies(h) == 0 and h.streamer.cached_bytes(h) == 0
        assert all(h.streamer.users(h, u) == 0 for u in h.units)
    assert m.devices.counted_bytes(CPU) == sum(h.loaded_bytes for h in engine.handles())


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize(("gpu_jobs", "mode", "device_mb", "iterations"), [
    (1, "none", 14, 50),  # requests take turns, every unit streams
    (2, "none", 14, 50),  # both inside the talker at once, sharing its copies
    (2, "normal", 10, 20),  # partial placements frozen while the other request runs them
])
def test_two_requests_on_one_handle_stay_exact(plain: dict[str, torch.Tensor], gpu_jobs: int, mode: str,
                                               device_mb: int, iterations: int) -> None:
    m = ModelManager(DeviceService(simulate={"cpu": device_mb << 20}, strict=True),
                     VramPolicy({"compute.gpu_jobs": gpu_jobs, "compute.vram_mode": mode}))
    engine = DemoEngine(m)
    together = [0]

    def watch(done: int, total: int) -> None:
        together[0] = max(together[0], engine.talker.in_use)

    def run(name: str) -> None:
        text, seed = REQUESTS[name]
        for _ in range(iterations):
            got, meta = say(m, engine, text, seed, on_progress=watch)
            assert torch.equal(got, plain[name]), f"{name} differs from its plain run"
            assert meta["applied"]["oom_retries"] == 0

    assert threads(run) == []
    assert together[0] == gpu_jobs  # with two jobs the requests really ran the talker together
    assert m.devices.peak_counted_bytes(CPU) <= device_mb << 20
    assert_nothing_held(m, engine)


@pytest.mark.usefixtures("one_torch_thread")
def test_an_interrupted_request_leaves_the_other_exact(plain: dict[str, torch.Tensor]) -> None:
    """One request is cancelled mid-stream (its own cancel check, run before its copies and
    per token); the other, in the same handle at the same time, finishes exact."""
    m = ModelManager(DeviceService(simulate={"cpu": 14 << 20}, strict=True),
                     VramPolicy({"compute.gpu_jobs": 2, "compute.vram_mode": "none"}))
    engine = DemoEngine(m)
    cancelled = [0]

    def interrupt_at(step: int) -> tuple[Callable[[], None], Callable[[int, int], None]]:
        """A cancel check that raises once the talker passed `step`: at its next streamed copy
        or step, whichever comes first (how many copies it makes itself depends on sharing)."""
        interrupted = [False]

        def check() -> None:
            if interrupted[0]:
                raise CancelledError("interrupted mid-stream")

        def progress(done: int, total: int) -> None:
            interrupted[0] = interrupted[0] or done >= step

        return check, progress

    def run(name: str) -> None:
        text, seed = REQUESTS[name]
        for i in range(10):
            if name == "left":
                check, progress = interrupt_at(i % 6)
                with pytest.raises(CancelledError):
                    say(m, engine, text, seed, cancel_check=check, on_progress=progress)
                cancelled[0] += 1
            else:
                got, _ = say(m, engine, text, seed)
                assert torch.equal(got, plain[name]), "the other request differs from its plain run"

    assert threads(run) == []
    assert cancelled[0] == 10
    assert_nothing_held(m, engine)
    got, _ = say(m, engine, *REQUESTS["left"])  # the interrupted request's next run is exact
    assert torch.equal(got, plain["left"])


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("mode", ["none", "normal"])
def test_an_oom_while_two_requests_share_the_handles_is_retried_exactly(plain: dict[str, torch.Tensor],
                                                                        mode: str) -> None:
    """M40 with M8: out-of-memory errors hit whichever request allocates then; each reruns its
    phase exactly (the other request's handles keep their placement), and both stay exact."""
    m = ModelManager(DeviceService(simulate={"cpu": (14 if mode == "none" else 10) << 20}, strict=True),
                     VramPolicy({"compute.gpu_jobs": 2, "compute.vram_mode": mode}))
    engine = DemoEngine(m)
    injector = OomInjector(at=[3, 20])
    m.devices.fault_hook = injector
    retries: list[int] = []

    def run(name: str) -> None:
        for _ in range(4):
            got, meta = say(m, engine, *REQUESTS[name])
            assert torch.equal(got, plain[name]), f"{name} differs from its plain run"
            retries.append(meta["applied"]["oom_retries"])

    assert threads(run) == []
    assert injector.raised == 2 and sum(retries) == 2
    assert_nothing_held(m, engine)


def test_draws_from_torchs_global_rng_never_interleave_across_requests() -> None:
    """Upstream engines sample from torch's one global RNG inside `Engine.seeded`: two requests
    at once take turns there, so each sees exactly its own seed's sequence (M8, M57)."""
    engine = DemoEngine(ModelManager(DeviceService(), VramPolicy()))
    first_drawn, second_drawn, first_done = threading.Event(), threading.Event(), threading.Event()

    def draws(seed: int) -> list[torch.Tensor]:
        with engine.seeded(seed):
            return [torch.randn(4), torch.randn(4)]

    expected = {1: draws(1), 2: draws(2)}
    got: dict[int, list[torch.Tensor]] = {}

    def first() -> None:
        with engine.seeded(1):
            one = torch.randn(4)
            first_drawn.set()
            second_drawn.wait(0.5)  # the other request draws now, if it can get in
            got[1] = [one, torch.randn(4)]
        first_done.set()

    def second() -> None:
        first_drawn.wait(5)
        with engine.seeded(2):
            one = torch.randn(4)
            second_drawn.set()
            first_done.wait(0.5)  # and the first one finishes meanwhile, if it could
            got[2] = [one, torch.randn(4)]

    assert run_on_threads([first, second]) == []
    for seed in (1, 2):
        assert all(torch.equal(a, b) for a, b in zip(got[seed], expected[seed])), f"seed {seed} saw other draws"


@pytest.mark.usefixtures("one_torch_thread")
def test_two_qwen3tts_requests_at_once_stay_exact(qwen3tts_checkpoint: Callable[[str], object]) -> None:
    """A real engine whose upstream loop samples from the global RNG: two requests on one engine
    and its handles at once (gpu_jobs = 2, every unit streamed) each give their plain run."""
    from mizuoto_runtime import Runtime
    from mizuoto_runtime.audio import Audio

    folder = qwen3tts_checkpoint("base")
    reference = Audio(0.3 * torch.sin(torch.arange(16000) / 6.0).unsqueeze(0), 16000)
    texts = {1: "hello there.", 2: "another one here."}

    together = [0]

    def say_qwen(rt: Runtime, seed: int, meet: bool = False) -> torch.Tensor:
        engine = rt.engine("qwen3tts", folder)  # type: ignore[arg-type]

        def watch(done: int, total: int) -> None:
            deadline = time.monotonic() + 10
            while meet and together[0] < 2 and engine.talker.in_use < 2 and time.monotonic() < deadline:
                time.sleep(0.01)  # the first request to get here waits until the other has the talker too
            together[0] = max(together[0], engine.talker.in_use)

        sampling = Sampling(seed=seed, max_new_tokens=4, language="english")
        return rt.say(engine, texts[seed], reference=reference, sampling=sampling, on_progress=watch)[0].waveform

    plain_rt = Runtime()
    expected = {seed: say_qwen(plain_rt, seed) for seed in texts}
    rt = Runtime({"compute.simulate_vram_mb": 256, "compute.vram_mode": "none", "compute.gpu_jobs": 2})
    mismatches: list[int] = []

    def run(seed: int) -> None:
        for _ in range(2):
            if not torch.equal(say_qwen(rt, seed, meet=True), expected[seed]):
                mismatches.append(seed)

    assert run_on_threads([lambda seed=seed: run(seed) for seed in texts]) == []
    assert mismatches == [] and together[0] == 2  # both requests were in the talker's phase at once
    assert len(rt.manager.handles) == 4  # both asked for the engine at once: it was loaded once
