"""Benchmark (not a test) of the VoxCPM 2 engine, issue 12, on a tiny random checkpoint in the
official layout (needs the `voxcpm2` extra). Three sections, printed as tables and written as
JSON (`--out`):

1. ``row`` — the engines table's VoxCPM 2 row: per patch (the marginal cost of 8 more patches,
   so the prompt's prefill is left out) the generate phase's time and streamed MB with the
   generator whole, half-way and fully streamed, on the simulated strict device (M55), and the
   streamed/resident time ratio; with a CUDA GPU, the same on it with prefetch on and off
   (`compute.async_offload` 1 vs 0 on a `oneshot` variant of the generator; ours is `sequence`,
   which never prefetches, M20). Every run's audio is compared with `torch.equal` to the plain run.
2. ``layouts`` — streamed MB per patch at the same device size for three ways to register the
   generate phase: ours (one `sequence` handle, the local DiT hot), the same without the hot
   mark, and the local encoder and DiT as `oneshot` handles of their own beside one `sequence`
   handle per LM (the manager splits the budget, M33).
3. ``estimates`` — each phase's working-memory estimate (M45) against the peak of tensors its
   run allocated on the plain CPU (every CPU tensor storage created during the phase, tracked
   until freed), at two request sizes.

    .venv/bin/python bench/voxcpm2.py [--out bench/out/voxcpm2.json]

Shaped to merge into ``bench/engines.py``: `voxcpm2_row()` returns the row as a dict.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TQDM_DISABLE", "1")  # the package's per-patch progress bar

from mizuoto_runtime import Runtime  # noqa: E402
from mizuoto_runtime.audio import Audio  # noqa: E402
from mizuoto_runtime.engines import Sampling  # noqa: E402
from mizuoto_runtime.engines.voxcpm2.engine import GeneratorModules, VoxCPM2Engine  # noqa: E402
from mizuoto_runtime.engines.voxcpm2.tiny import write as write_tiny_checkpoint  # noqa: E402

MB = 2**20
TEXT = "Hello from the tiny model is the model."
REFERENCE = Audio(0.3 * torch.sin(torch.arange(16000) / 6.0).unsqueeze(0), 16000)
SHORT, LONG = 4, 12  # patches: per-patch figures are (LONG - SHORT) differences


# ---- layouts of the generate phase ---------------------------------------------------------
class PackageOrder(torch.nn.Module):
    """The generate phase's modules in the package's own order (LMs first, the DiT last)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        for name, child in GeneratorModules(model).named_children():
            if name != "feat_decoder":
                self.add_module(name, child)
        self.feat_decoder = model.feat_decoder


class NothingHot(VoxCPM2Engine):
    """One `sequence` handle in the package's module order, no hot mark: units stay resident
    in that order only."""

    def register_generate(self) -> None:
        self.generator = self.register(PackageOrder(self.model), "generator", kind="sequence")


class OwnHandles(VoxCPM2Engine):
    """Each LM a `sequence` handle (the projections with the text-semantic LM), the local
    encoder and the local DiT `oneshot` handles of their own."""

    def register_generate(self) -> None:
        m = self.model
        lm = GeneratorModules(m)
        del lm.feat_encoder, lm.feat_decoder, lm.residual_lm
        self.generator = self.register(lm, "base_lm", kind="sequence")
        self.residual = self.register(m.residual_lm, "residual_lm", kind="sequence")
        self.encoder = self.register(m.feat_encoder, "local_encoder")
        self.dit = self.register(m.feat_decoder, "local_dit")

    def generate_handles(self) -> list[Any]:
        return [self.generator, self.residual, self.encoder, self.dit]


class PrefetchingGenerator(VoxCPM2Engine):
    """Ours as a `oneshot` handle, so it prefetches with `compute.async_offload` > 0 (GPU only)."""

    def register_generate(self) -> None:
        self.generator = self.register(GeneratorModules(self.model), "generator")
        self.generator.mark(self.model.feat_decoder, "hot")


# ---- measuring -----------------------------------------------------------------------------
def generate(rt: Runtime, engine: VoxCPM2Engine, patches: int, cap: Callable[[Any], int | None] | None = None
             ) -> tuple[float, int, torch.Tensor, int]:
    """One zero-shot generate + decode; returns (generate seconds, bytes the generate phase's
    handles streamed, audio, bytes they held resident in the generate phase)."""
    if cap is not None:
        for h in engine.generate_handles():
            h.cap_bytes = cap(h)
    ctx = rt.request(seed=5)
    voice = engine.voice_prompt(ctx)
    handles = engine.generate_handles()
    before = sum(h.streamer.streamed_bytes_of(h) for h in handles)
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    start = time.perf_counter()
    codes = engine.generate(ctx, TEXT, voice, Sampling(seed=5, max_new_tokens=patches))
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    seconds = time.perf_counter() - start
    streamed = sum(h.streamer.streamed_bytes_of(h) for h in handles) - before
    resident = sum(h.loaded_bytes for h in handles)
    return seconds, streamed, engine.decode(ctx, codes).waveform, resident


def per_patch(rt: Runtime, engine: VoxCPM2Engine, cap: Callable[[Any], int | None] | None,
              reference: dict[int, torch.Tensor], repeats: int = 3) -> dict[str, Any]:
    """Marginal time and streamed MB per patch (best of `repeats`), and whether the audio equals
    the plain run's at both lengths."""
    runs = {n: [generate(rt, engine, n, cap) for _ in range(repeats)] for n in (SHORT, LONG)}
    best = {n: min(r[0] for r in rs) for n, rs in runs.items()}
    streamed = {n: rs[0][1] for n, rs in runs.items()}
    return {
        "s_per_patch": round((best[LONG] - best[SHORT]) / (LONG - SHORT), 5),
        "streamed_mb_per_patch": round((streamed[LONG] - streamed[SHORT]) / (LONG - SHORT) / MB, 3),
        "equal": all(torch.equal(r[2], reference[n]) for n, rs in runs.items() for r in rs),
        "resident_mb": round(runs[LONG][0][3] / MB, 2),
    }


def build(rt: Runtime, cls: type[VoxCPM2Engine], folder: Path, device: str | None = None) -> VoxCPM2Engine:
    """An engine of one of the layouts above, in `rt` (outside inference mode, as `Runtime.engine`)."""
    with torch.inference_mode(False):
        return cls(rt.manager, folder, torch.float32, rt.device(device))


def half(h: Any) -> int:
    return (h.min_working_set + h.size_bytes) // 2


def voxcpm2_row(folder: Path) -> dict[str, Any]:
    """The engines table's row: per-patch time and streamed MB, whole / half / none."""
    plain_rt = Runtime()
    plain = plain_rt.engine("voxcpm2", folder)
    reference = {n: generate(plain_rt, plain, n)[2] for n in (SHORT, LONG)}
    row: dict[str, Any] = {"engine": "voxcpm2", "device": "simulated (CPU, strict)", "runs": {}}
    for name, mode, cap in (("resident", "normal", None), ("half", "normal", half), ("none", "none", None)):
        rt = Runtime({"compute.simulate_vram_mb": 256, "compute.vram_mode": mode})
        row["runs"][name] = per_patch(rt, rt.engine("voxcpm2", folder), cap, reference)
    resident = row["runs"]["resident"]["s_per_patch"]
    for run in row["runs"].values():
        run["vs_resident"] = round(run["s_per_patch"] / resident, 2) if resident > 0 else None
    if torch.cuda.is_available():
        row["gpu"] = gpu_runs(folder)
    else:
        row["gpu"] = "skipped: no CUDA device here"
    return row


def gpu_runs(folder: Path, device: str = "cuda:0") -> dict[str, Any]:
    """On the GPU, the generator half-way: ours (`sequence`, never prefetching) and a `oneshot`
    variant with prefetch on (async_offload 1) and off (0); and resident, whose audio the others
    must equal (the GPU's, not the CPU's: their kernels differ)."""
    resident_rt = Runtime()
    resident = build(resident_rt, VoxCPM2Engine, folder, device)
    reference = {n: generate(resident_rt, resident, n)[2] for n in (SHORT, LONG)}
    out: dict[str, Any] = {"resident": per_patch(resident_rt, resident, None, reference)}
    resident.unload()
    for name, cls, offload in (("sequence", VoxCPM2Engine, 1), ("oneshot/prefetch", PrefetchingGenerator, 1),
                               ("oneshot/no-prefetch", PrefetchingGenerator, 0)):
        rt = Runtime({"compute.async_offload": offload})
        engine = build(rt, cls, folder, device)
        out[name] = per_patch(rt, engine, half, reference)
        engine.unload()
    base = out["resident"]["s_per_patch"]
    for run in out.values():
        run["vs_resident"] = round(run["s_per_patch"] / base, 2) if base > 0 else None
    return out


def layouts(folder: Path) -> dict[str, Any]:
    """Streamed MB per patch for each layout at the same simulated device sizes."""
    out: dict[str, Any] = {}
    plain_rt = Runtime()
    plain = plain_rt.engine("voxcpm2", folder)
    reference = {n: generate(plain_rt, plain, n)[2] for n in (SHORT, LONG)}
    for device_mb in (14, 18, 22, 26, 30):
        for name, cls in (("ours: one handle, DiT hot", VoxCPM2Engine), ("one handle, nothing hot", NothingHot),
                          ("own handles: LMs sequence, encoder and DiT oneshot", OwnHandles)):
            rt = Runtime({"compute.simulate_vram_mb": device_mb})
            engine = build(rt, cls, folder)
            try:
                result = per_patch(rt, engine, None, reference, repeats=1)
            except torch.OutOfMemoryError:
                # Below the layout's minimum working sets the load is tried anyway (M7) and fails.
                result = {"streamed_mb_per_patch": None, "equal": None, "error": "out of memory", "resident_mb": None}
            result["min_working_set_mb"] = round(sum(h.min_working_set for h in engine.generate_handles()) / MB, 2)
            out.setdefault(f"{device_mb} MB", {})[name] = result
    return out


class PeakTracker(TorchDispatchMode):
    """Peak bytes of CPU tensor storages created while active (each counted until it is freed).
    An output that shares an input's storage (a view: a slice of a model's buffer, say) is no
    new memory and is not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = self.peak = 0

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and not t.is_meta}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.is_meta:
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if storage.nbytes() == 0 or key in self.live or key in inputs:
                    continue
                self.live[key] = storage.nbytes()
                self.current += storage.nbytes()
                self.peak = max(self.peak, self.current)
                weakref.finalize(storage, self._free, key)
        return out


def estimates(folder: Path) -> dict[str, Any]:
    """Each phase's estimate vs the measured CPU peak, at two request sizes (plain CPU)."""
    rt = Runtime()
    engine = rt.engine("voxcpm2", folder)
    out: dict[str, Any] = {}
    for seconds, text, patches in ((1.0, TEXT, 8), (4.0, TEXT * 6, 32)):
        reference = Audio(REFERENCE.waveform.repeat(1, int(seconds)), REFERENCE.sample_rate)
        ctx = rt.request(seed=5)
        samples = reference.waveform.shape[-1]
        estimate_vp = engine.voice_prompt_memory(samples, samples)
        with PeakTracker() as vp:
            voice = engine.voice_prompt(ctx, reference, "a reference")
        target = engine.target_text(text, voice)
        plan = engine.plan(target, voice.data["prompt"], patches)
        estimate_gen = sum(engine.generate_memory(plan).values())
        with PeakTracker() as gen:
            codes = engine.generate(ctx, text, voice, Sampling(seed=5, max_new_tokens=patches))
        estimate_dec = engine.decoder_memory(codes.tokens.shape[-1])
        with PeakTracker() as dec:
            engine.decode(ctx, codes)
        out[f"{seconds:.0f} s reference, {patches} patches"] = {
            phase: {"estimate_mb": round(e / MB, 2), "measured_mb": round(m.peak / MB, 2),
                    "estimate_over_measured": round(e / m.peak, 2) if m.peak else None}
            for phase, e, m in (("voice prompt", estimate_vp, vp), ("generate", estimate_gen, gen),
                                ("decoder", estimate_dec, dec))
        }
        engine.voices.clear()
    return out


# ---- report --------------------------------------------------------------------------------
def print_report(result: dict[str, Any]) -> None:
    row = result["row"]
    print(f"\nVoxCPM 2 row ({row['device']}; per patch, marginal over {LONG - SHORT} patches):")
    print(f"{'placement':<12}{'s/patch':>10}{'vs resident':>13}{'streamed MB':>13}  equal")
    for name, r in row["runs"].items():
        print(f"{name:<12}{r['s_per_patch']:>10.4f}{r['vs_resident']:>13}{r['streamed_mb_per_patch']:>13}"
              f"  {r['equal']}")
    print(f"GPU: {row['gpu'] if isinstance(row['gpu'], str) else json.dumps(row['gpu'])}")
    print("\nLayouts of the generate phase (streamed MB per patch at one device size):")
    for size, runs in result["layouts"].items():
        for name, r in runs.items():
            streamed = r.get("error") or f"{r['streamed_mb_per_patch']} MB"
            resident = "-" if r["resident_mb"] is None else f"{r['resident_mb']} MB"
            print(f"  {size:>6}  {name:<52}{streamed:>14}  loaded {resident:>9}"
                  f"  min working set {r['min_working_set_mb']:>6} MB  equal {r['equal']}")
    print("\nWorking-memory estimates vs measured CPU peaks:")
    for case, phases in result["estimates"].items():
        for phase, r in phases.items():
            print(f"  {case:<28}{phase:<14}estimate {r['estimate_mb']:>8} MB  measured {r['measured_mb']:>8} MB"
                  f"  ratio {r['estimate_over_measured']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" / "voxcpm2.json"))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: steadier timings)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="mizuoto-bench-voxcpm2-") as tmp:
        folder = write_tiny_checkpoint(Path(tmp) / "tiny")
        result = {"row": voxcpm2_row(folder), "layouts": layouts(folder), "estimates": estimates(folder)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print_report(result)
    print(f"\nwritten to {out}")
    equal = result["row"]["runs"] and all(r["equal"] for r in result["row"]["runs"].values())
    return 0 if equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
