"""The one-shot engines under the memory runtime, side by side in one run (issue 11).

Per engine (F5-TTS, OmniVoice; tiny random checkpoints in their published layouts, written to a
temporary folder), one request of each placement, repeated and interleaved:

* resident — every component whole on the device (simulated: a device larger than the model);
* streamed — `compute.vram_mode = none` on the simulated strict device: every unit streamed.

It prints the streamed/resident time ratio (medians) and `meta.memory.streamed_mb` per request.
``--peaks`` instead measures every phase of every engine (Qwen3-TTS, F5-TTS, OmniVoice, VoxCPM 2,
the demo) on the plain CPU at the request sizes its tests use: the peak of CPU tensor storage the
phase creates (`PeakTracker`) against the engine's working-memory estimate for it (M45: between
1.0x and 1.3x, `tests/test_engine_estimates.py` asserts it).
``--device cuda`` runs on a real GPU instead of the simulated device, and compares prefetch
(``compute.async_offload`` 1: the next unit copies on a side stream) with none (0).

    python bench/engines.py [--repeat 5] [--steps 8] [--peaks] [--device cuda]
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mizuoto_runtime import Runtime  # noqa: E402
from mizuoto_runtime.audio import Audio  # noqa: E402
from mizuoto_runtime.engines import Sampling  # noqa: E402
from mizuoto_runtime.phases import RequestContext  # noqa: E402


def _peak_tracker() -> type:
    spec = importlib.util.spec_from_file_location("bench_voxcpm2", Path(__file__).with_name("voxcpm2.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PeakTracker  # type: ignore[no-any-return]


PeakTracker = _peak_tracker()

REFERENCE = Audio(0.3 * torch.sin(torch.arange(24000) / 6.0).unsqueeze(0), 24000)
TRANSCRIPT = "a reference sentence."
TEXT = "The runtime streams every block, step after step."
WRITERS = {"f5tts": "mizuoto_runtime.engines.f5tts_tiny", "omnivoice": "mizuoto_runtime.engines.omnivoice_tiny",
           "voxcpm2": "mizuoto_runtime.engines.voxcpm2_tiny", "qwen3tts": "mizuoto_runtime.engines.qwen3tts_tiny"}
MB = 1 << 20
PEAK_STEPS = 4  # ODE / diffusion steps of the estimate tests' requests


def placements(device: str) -> dict[str, dict[str, Any]]:
    if device == "cpu":
        return {"resident": {"compute.simulate_vram_mb": 4096},
                "streamed": {"compute.simulate_vram_mb": 4096, "compute.vram_mode": "none"}}
    return {"resident": {},
            "streamed, prefetch": {"compute.vram_mode": "none", "compute.async_offload": 1},
            "streamed, no prefetch": {"compute.vram_mode": "none", "compute.async_offload": 0}}


def request(rt: Runtime, engine_id: str, folder: Path, steps: int, device: str) -> tuple[float, float]:
    engine = rt.engine(engine_id, folder, device=None if device == "cpu" else device)
    engine.steps = steps
    engine.voices.clear()  # the voice prompt runs every time
    if device != "cpu":
        torch.cuda.synchronize()
    start = time.perf_counter()
    _, meta = rt.say(engine, TEXT, reference=REFERENCE, transcript=TRANSCRIPT,
                     sampling=Sampling(seed=1, language="English"))
    if device != "cpu":
        torch.cuda.synchronize()
    return time.perf_counter() - start, meta["memory"]["streamed_mb"]


def time_engines(folders: dict[str, Path], steps: int, repeat: int, device: str) -> None:
    print(f"\n{'engine':10} {'placement':22} {'median s':>9} {'vs resident':>12} {'streamed MB':>12}")
    for engine_id, folder in folders.items():
        runtimes = {name: Runtime(settings) for name, settings in placements(device).items()}
        times: dict[str, list[float]] = {name: [] for name in runtimes}
        streamed: dict[str, float] = {}
        for name, rt in runtimes.items():
            request(rt, engine_id, folder, steps, device)  # warm-up: load, learn the unit order
        for _ in range(repeat):
            for name, rt in runtimes.items():  # interleaved, so machine noise hits all alike
                seconds, streamed[name] = request(rt, engine_id, folder, steps, device)
                times[name].append(seconds)
        base = statistics.median(times["resident"])
        for name in runtimes:
            median = statistics.median(times[name])
            print(f"{engine_id:10} {name:22} {median:9.3f} {median / base:11.2f}x {streamed[name]:12.1f}")


@dataclasses.dataclass(frozen=True)
class PeakRequest:
    """One request of the sizes an engine's tests use: reference seconds, text, new tokens."""

    seconds: float
    text: str = TEXT
    max_new_tokens: int = 2048

    def label(self) -> str:
        return f"{self.seconds:g} s ref, {len(self.text)} chars" + (
            f", {self.max_new_tokens} tokens" if self.max_new_tokens != 2048 else "")


# The request sizes each engine's tests use (tests/test_engine_estimates.py, test_qwen3tts.py).
PEAK_REQUESTS: dict[str, list[PeakRequest]] = {
    "f5tts": [PeakRequest(1), PeakRequest(3)],
    "omnivoice": [PeakRequest(1), PeakRequest(3)],
    "voxcpm2": [PeakRequest(1, TEXT, 4), PeakRequest(2, TEXT * 3, 8)],
    "qwen3tts": [PeakRequest(1, TEXT, 4), PeakRequest(3, TEXT, 4)],
    "demo": [PeakRequest(1, TEXT, 16), PeakRequest(3, TEXT * 2, 48)],
}


@dataclasses.dataclass
class PhasePeak:
    """A phase as it ran: its components, its working-memory estimate, and the peak of CPU tensor
    storage it created (`PeakTracker`: each tensor counted until freed; on the plain CPU nothing
    is placed or streamed, so that is the phase's working memory plus what it returns)."""

    engine: str
    phase: str
    request: str
    estimate: int
    peak: int

    @property
    def ratio(self) -> float:
        return self.estimate / max(self.peak, 1)


@contextlib.contextmanager
def metered_phases(engine_id: str, request: str) -> Iterator[list[PhasePeak]]:
    """Measure every phase with components (`ctx.run` and `ctx.use`) run in the block."""
    rows: list[PhasePeak] = []
    run, use = RequestContext.run, RequestContext.use

    def key(name: str, handles: Sequence[Any]) -> str:
        return f"{name} ({'+'.join(h.name for h in handles)})"

    def metered_run(self: RequestContext, name: str, handles: Sequence[Any], fn: Callable[[], Any],
                    memory: int = 0, *args: Any, **kwargs: Any) -> Any:
        def measured() -> Any:
            with PeakTracker() as tracker:
                out = fn()
            if handles:
                rows.append(PhasePeak(engine_id, key(name, handles), request, memory, tracker.peak))
            return out

        return run(self, name, handles, measured, memory, *args, **kwargs)

    @contextlib.contextmanager
    def metered_use(self: RequestContext, handles: Sequence[Any], memory: int = 0,
                    name: str = "phase") -> Iterator[Any]:
        with use(self, handles, memory, name) as placements, PeakTracker() as tracker:
            yield placements
        if handles:
            rows.append(PhasePeak(engine_id, key(name, handles), request, memory, tracker.peak))

    RequestContext.run, RequestContext.use = metered_run, metered_use  # type: ignore[method-assign]
    try:
        yield rows
    finally:
        RequestContext.run, RequestContext.use = run, use  # type: ignore[method-assign]


def phase_peaks(folders: dict[str, Path | None], steps: int = PEAK_STEPS) -> list[PhasePeak]:
    """Every phase of every engine, at the request sizes its tests use, on the plain CPU."""
    rows: list[PhasePeak] = []
    for engine_id, folder in folders.items():
        rt = Runtime()
        engine = rt.engine(engine_id, folder)
        if hasattr(engine, "steps"):
            engine.steps = steps
        for req in PEAK_REQUESTS[engine_id]:
            reference = Audio(0.3 * torch.sin(torch.arange(int(req.seconds * 24000)) / 6.0).unsqueeze(0), 24000)
            engine.voices.clear()  # the voice prompt runs every time
            sampling = Sampling(seed=1, language="English", max_new_tokens=req.max_new_tokens)
            with metered_phases(engine_id, req.label()) as measured:
                rt.say(engine, req.text, reference=reference, transcript=TRANSCRIPT, sampling=sampling)
            rows += measured
    return rows


def print_peaks(rows: list[PhasePeak]) -> None:
    print(f"\n{'engine':10} {'phase':34} {'request':30} {'estimate MB':>12} {'CPU peak MB':>12} {'estimate/peak':>14}")
    for r in rows:
        print(f"{r.engine:10} {r.phase:34} {r.request:30} {r.estimate / MB:12.3f} {r.peak / MB:12.3f} "
              f"{r.ratio:13.2f}x")


def checkpoint_folders(engines: Sequence[str], tmp: Path) -> dict[str, Path | None]:
    """Tiny random checkpoints in each engine's published layout (the demo engine needs none)."""

    folders: dict[str, Path | None] = {}
    for engine_id in engines:
        writer = WRITERS.get(engine_id)
        folders[engine_id] = None if writer is None else importlib.import_module(writer).write_tiny_checkpoint(
            tmp / engine_id)
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="ODE / diffusion steps per request (upstream: 32)")
    parser.add_argument("--peaks", action="store_true",
                        help="instead: each phase's working-memory estimate / its measured CPU peak, every engine")
    parser.add_argument("--device", default="cpu", help="cpu (the simulated device) or cuda")
    parser.add_argument("--engines", default=None, help="comma-separated (default: f5tts,omnivoice; with --peaks all)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steady on a shared machine)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    engines = (args.engines or (",".join(PEAK_REQUESTS) if args.peaks else "f5tts,omnivoice")).split(",")
    with tempfile.TemporaryDirectory(prefix="mizuoto-bench-") as tmp:
        folders = checkpoint_folders(engines, Path(tmp))
        if args.peaks:
            print(f"torch {torch.__version__}, plain CPU, {PEAK_STEPS} steps per request")
            print_peaks(phase_peaks(folders))
            return
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, "
              f"{args.steps} steps per request, {args.repeat} requests per placement")
        time_engines({e: f for e, f in folders.items() if f is not None}, args.steps, args.repeat, args.device)


if __name__ == "__main__":
    main()
