"""Benchmark (not a test) of the token loop (issue 13; M18-M20, M24, M53).

Side by side, in one run, every variant timed in turn (best of `--repeat`), so load on the
machine affects them alike:

1. Qwen3-TTS, a tiny random CustomVoice checkpoint in the official layout: the talker phase's
   ms per frame with the package's own loop (``upstream``) and our lean loop (``lean``, with
   the dynamic and the static KV cache), plain (CPU, nothing moved) and with every unit
   streamed on the simulated device (``compute.vram_mode = none``); on a CUDA GPU also
   resident and streamed with CUDA Graphs on and off. Per variant: streamed MB per frame, and
   ``vs_bound`` = time per frame / (compute + streamed bytes / measured bandwidth), where
   compute is the same loop's resident time per frame and the bandwidth is measured here
   (CPU: the variant's own unit copies alone, into reused destinations, which is what the
   simulated device does; GPU: pinned host-to-device). Codes of every variant are compared
   with ``torch.equal`` to the upstream loop's. On the simulated device also the copies as
   they ran beside the loop (on its copy thread, timed there) and ``hidden``: the share of
   their time the loop hid behind compute ((resident + copies - streamed) / copies).
2. A generic token-by-token LM (the tests' TinyLM, a `sequence` handle: one copy, nothing
   copied ahead, each leaf waiting only for its own weights): plain vs every unit streamed on
   the simulated device, one prompt and ``--lm-rows`` prompts per step; beside them the same
   copies alone, ``no overlap`` = (plain + copies) / plain (copies and compute one after the
   other), and ``limit`` = plain with the same copies made at the same time on a second thread,
   waiting for nothing, / plain: on a CPU copies and compute share the cores and caches, so no
   streamed run beats it; ``vs limit`` is what the runtime adds to that; a profile of the
   streamed run (where its time goes).

    .venv/bin/python bench/token_loop.py [--frames 48 --repeat 5 --threads 1]
    .venv/bin/python bench/token_loop.py --only lm        # skip Qwen3-TTS (no qwen_tts needed)

Writes ``bench/out/token_loop.json`` (``--out`` elsewhere). Exit status 1 if any codes differ.
"""
from __future__ import annotations

import argparse
import copy
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from mizuoto_runtime import DeviceService, ModelHandle, Runtime  # noqa: E402
from mizuoto_runtime.engines import Sampling  # noqa: E402
from mizuoto_runtime.memory import transfer  # noqa: E402
from mizuoto_runtime.memory.units import Unit  # noqa: E402

MB = 1 << 20
TEXT = "Hello from the tiny talker, one frame at a time."


def bandwidth_gbps(device: torch.device, nbytes: int = 256 * MB) -> float:
    """Pinned host-to-device copy bandwidth on CUDA (one 256 MB copy, best of three); on the
    CPU see `unit_copy_gbps`."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    best = float("inf")
    for _ in range(3):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def _copy_pairs_of(units: Sequence[Unit]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every streamed unit's host tensors, in run order, each with one reused destination per
    tensor shape (as the streamer's static buffers are reused)."""
    destinations: dict[tuple[Any, ...], torch.Tensor] = {}
    pairs = []
    for unit in units:
        for slot in unit.slots:
            host = slot.host
            assert host is not None, slot.name
            key = (host.shape, host.stride(), host.dtype)
            if key not in destinations:
                destinations[key] = torch.empty_like(host)
            pairs.append((destinations[key], host))
    return pairs


def unit_copy_gbps(units: Sequence[Unit], repeat: int = 5) -> float:
    """What the simulated device's copies achieve, with no compute beside them (`_copy_pairs_of`).
    Best of `repeat`. A large one-off copy would measure DRAM-to-DRAM instead, which is not
    what a token's copies do (they reuse a cache-resident buffer)."""
    pairs = _copy_pairs_of(units)
    nbytes = sum(u.nbytes for u in units)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for dst, src in pairs:
            dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9 if nbytes else float("inf")


class CopyClock:
    """Time the simulated device's copies take, on whichever thread makes them (its copy thread,
    beside compute): what a run's copies cost in the run's own cache and core state. Counts
    while installed (`with CopyClock() as clock`)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()
        self._original = transfer._copy_pairs

    def __enter__(self) -> CopyClock:
        original = self._original

        def timed(*args: Any, **kwargs: Any) -> None:
            start = time.perf_counter()
            try:
                original(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds += time.perf_counter() - start

        transfer._copy_pairs = timed
        return self

    def __exit__(self, *exc: object) -> None:
        transfer._copy_pairs = self._original


def copies_beside(compute: Callable[[], object], units: Sequence[Unit], times: int) -> float:
    """Seconds for `compute` with the units' copies made `times` over on a second thread at the
    same time, waiting for nothing: what no streamed run on these cores can beat, since its
    copies must also come before the layers that read them."""
    pairs = _copy_pairs_of(units)

    def copies() -> None:
        for _ in range(times):
            for dst, src in pairs:
                dst.copy_(src)

    thread = threading.Thread(target=copies)
    start = time.perf_counter()
    thread.start()
    compute()
    thread.join()
    return time.perf_counter() - start


# ---- Qwen3-TTS -------------------------------------------------------------------------------
class Variant:
    """One way of running the talker phase: a runtime, a loop, graphs on or off."""

    def __init__(self, name: str, folder: Path, settings: dict[str, Any], loop: str, graphs: bool,
                 frames: int, clock: CopyClock, resident: str | None = None) -> None:
        self.name, self.resident = name, resident
        self.rt = Runtime(settings)
        self.engine = self.rt.engine("qwen3tts", folder)
        self.engine.talker_loop = loop
        self.engine.cuda_graphs = graphs
        self.sampling = Sampling(seed=3, max_new_tokens=frames + 1, language="english")
        ctx = self.rt.request(3)
        self.voice = self.engine.voice_prompt(ctx, speaker="bob")
        self.best = float("inf")
        self.best_copies = 0.0  # seconds the best run spent copying (simulated device)
        self.codes: torch.Tensor | None = None
        self.meta: dict[str, Any] = {}
        self.clock = clock if not name.startswith("gpu") else None

    def run(self) -> None:
        ctx = self.rt.request(3)
        device = self.engine.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        copies = self.clock.seconds if self.clock else 0.0
        start = time.perf_counter()
        codes = self.engine.generate(ctx, TEXT, self.voice, self.sampling)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        if elapsed < self.best:
            self.best, self.meta = elapsed, ctx.meta
            self.best_copies = (self.clock.seconds if self.clock else 0.0) - copies
        self.codes = codes.tokens


def qwen3tts_variants(folder: Path, frames: int, clock: CopyClock) -> list[Variant]:
    cpu_sim = {"compute.simulate_vram_mb": 1024, "compute.vram_mode": "none"}
    variants = [
        Variant("cpu plain / upstream loop", folder, {}, "upstream", False, frames, clock),
        Variant("cpu plain / lean", folder, {}, "lean", True, frames, clock),
        Variant("cpu plain / lean, static kv", folder, {"compute.kv_cache": "static"}, "lean", True, frames, clock),
        Variant("simulated, all streamed / upstream loop", folder, cpu_sim, "upstream", False, frames, clock,
                resident="cpu plain / upstream loop"),
        Variant("simulated, all streamed / lean", folder, cpu_sim, "lean", True, frames, clock,
                resident="cpu plain / lean"),
    ]
    if torch.cuda.is_available():
        gpu_none = {"compute.vram_mode": "none"}
        static = {"compute.kv_cache": "static"}
        variants += [
            Variant("gpu resident / upstream loop", folder, {}, "upstream", False, frames, clock),
            Variant("gpu resident / lean, graphs off", folder, {}, "lean", False, frames, clock),
            Variant("gpu resident / lean, graphs on", folder, {}, "lean", True, frames, clock),
            Variant("gpu resident / lean, static kv, graphs on", folder, static, "lean", True, frames, clock),
            Variant("gpu all streamed / lean, graphs off", folder, gpu_none, "lean", False, frames, clock,
                    resident="gpu resident / lean, graphs off"),
            Variant("gpu all streamed / lean, graphs on", folder, gpu_none, "lean", True, frames, clock,
                    resident="gpu resident / lean, graphs on"),
        ]
    return variants


def bench_qwen3tts(frames: int, repeat: int, clock: CopyClock) -> tuple[list[dict[str, Any]], bool]:
    from mizuoto_runtime.engines.qwen3tts.tiny import write

    with tempfile.TemporaryDirectory() as tmp:
        folder = write(Path(tmp) / "custom_voice", version="custom_voice")
        variants = qwen3tts_variants(folder, frames, clock)
        for v in variants:
            v.run()  # warm-up: placement, first-call costs
        for _ in range(repeat):
            for v in variants:
                v.run()
        # The copy bandwidth each streamed variant's bound uses: its own units' copies on the
        # simulated device, pinned host-to-device on a GPU.
        gpu_bw = bandwidth_gbps(torch.device("cuda")) if torch.cuda.is_available() else None
        bw = {v.name: gpu_bw if v.name.startswith("gpu") else unit_copy_gbps(v.engine.talker.streamed_units)
              for v in variants if v.resident is not None}
    by_name = {v.name: v for v in variants}
    reference = {"cpu": by_name["cpu plain / upstream loop"].codes}
    if "gpu resident / upstream loop" in by_name:
        reference["cuda"] = by_name["gpu resident / upstream loop"].codes
    rows, all_equal = [], True
    for v in variants:
        device = "cuda" if v.name.startswith("gpu") else "cpu"
        n = v.codes.shape[0] if v.codes is not None else 0
        ms = v.best / max(n, 1) * 1e3
        streamed = v.meta.get("memory", {}).get("streamed_mb", 0.0) / max(n, 1)
        equal = bool(v.codes is not None and torch.equal(v.codes, reference[device]))
        all_equal &= equal
        row = {"variant": v.name, "frames": n, "ms_per_frame": round(ms, 3),
               "streamed_mb_per_frame": round(streamed, 2), "equal_to_upstream": equal,
               "applied": {k: v.meta.get("applied", {}).get(k) for k in ("talker_loop", "kv_cache", "cuda_graphs")}}
        if v.resident is not None:
            resident = by_name[v.resident]
            compute_ms = resident.best / max(n, 1) * 1e3
            link_ms = streamed * MB / (bw[v.name] * 1e9) * 1e3
            row["copy_ms_per_frame"] = round(link_ms, 3)
            row["copy_gbps"] = round(bw[v.name], 2)
            if v.clock is not None:  # the copies as they ran beside the loop, and how much of them it hid
                in_loop = v.best_copies / max(n, 1) * 1e3
                row["copies_in_loop_ms_per_frame"] = round(in_loop, 3)
                row["hidden"] = round(hidden(ms, compute_ms, in_loop), 3)
            row["vs_resident"] = round(ms / compute_ms, 3)
            row["vs_bound"] = round(ms / (compute_ms + link_ms), 3)
        rows.append(row)
    plain = {r["variant"]: r["ms_per_frame"] for r in rows}
    rows.append({"variant": "ratio: cpu plain lean / upstream loop",
                 "ratio": round(plain["cpu plain / lean"] / plain["cpu plain / upstream loop"], 3)})
    return rows, all_equal


# ---- the generic LM -------------------------------------------------------------------------
def hidden(streamed_ms: float, plain_ms: float, copies_ms: float) -> float:
    """The share of the copies' time a streamed run hid behind compute (0: none, 1: all)."""
    return (plain_ms + copies_ms - streamed_ms) / copies_ms if copies_ms > 0 else 0.0


def bench_lm(repeat: int, clock: CopyClock, steps: int = 64, dim: int = 512, layers: int = 8, rows: int = 1,
             profile: bool = True) -> dict[str, Any]:
    """TinyLM plain vs every unit streamed (a `sequence` handle: one copy, nothing copied ahead,
    M20; each leaf waits only for its own weights, M17), `rows` prompts at once; beside them
    the same copies alone, and plain with those copies made at the same time on a second
    thread, waiting for nothing (`copies_beside`): the limit of any streamed run here."""
    from support.models import TinyLM

    torch.manual_seed(0)
    plain = TinyLM(vocab=512, dim=dim, layers=layers).eval()
    streamed = copy.deepcopy(plain)
    handle = ModelHandle(streamed, devices=DeviceService(simulate={"cpu": 1 << 30}, strict=True), kind="sequence",
                         name="tiny_lm")
    handle.load(0)  # below the minimum working set: every unit streams (M7)
    prompt = torch.arange(4 * rows).reshape(rows, 4) % 500 + 5

    def run(model: torch.nn.Module) -> torch.Tensor:
        return model.generate(prompt, steps=steps, generator=torch.Generator().manual_seed(3))

    expected, got = run(plain), run(streamed)
    best = {"plain": float("inf"), "streamed": float("inf"), "beside": float("inf")}
    in_loop = 0.0  # seconds the best streamed run's copies took
    before = handle.streamer.streamed_bytes_of(handle)
    for _ in range(repeat):
        for name, model in (("plain", plain), ("streamed", streamed)):
            copies = clock.seconds
            start = time.perf_counter()
            run(model)
            elapsed = time.perf_counter() - start
            if elapsed < best[name]:
                best[name] = elapsed
                if model is streamed:
                    in_loop = clock.seconds - copies
        best["beside"] = min(best["beside"], copies_beside(lambda: run(plain), handle.streamed_units, steps))
    per_step_bytes = (handle.streamer.streamed_bytes_of(handle) - before) / repeat / steps
    bw = unit_copy_gbps(handle.streamed_units)
    plain_ms, streamed_ms, beside_ms = (best[k] / steps * 1e3 for k in ("plain", "streamed", "beside"))
    copy_ms = per_step_bytes / (bw * 1e9) * 1e3
    result = {
        "model": f"TinyLM dim {dim}, {layers} layers, {rows} row(s), {steps} tokens, all {len(handle.units)} units "
                 "streamed",
        "rows": rows,
        "equal": bool(torch.equal(expected, got)),
        "plain_ms_per_token": round(plain_ms, 3), "streamed_ms_per_token": round(streamed_ms, 3),
        "copy_ms_per_token": round(copy_ms, 3),
        "copies_in_loop_ms_per_token": round(in_loop / steps * 1e3, 3),
        "plain_beside_copies_ms_per_token": round(beside_ms, 3),
        "vs_plain": round(streamed_ms / plain_ms, 3),
        "floor_vs_plain": round((plain_ms + copy_ms) / plain_ms, 3),
        "limit_vs_plain": round(beside_ms / plain_ms, 3),
        "vs_limit": round(streamed_ms / beside_ms, 3),
        "hidden": round(hidden(streamed_ms, plain_ms, in_loop / steps * 1e3), 3),
        "streamed_mb_per_token": round(per_step_bytes / MB, 2), "copy_gbps": round(bw, 2),
    }
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        run(streamed)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
        result["profile_streamed"] = _trim_profile(text.getvalue())
    return result


def lm_table(results: list[dict[str, Any]]) -> str:
    out = ["| generic LM | plain ms/token | streamed ms/token | copies alone ms/token | copies in the loop | "
           "plain beside copies | vs plain | no overlap: (plain + copies) / plain | limit: beside / plain | "
           "vs limit | copies hidden | streamed MB/token | copy GB/s | equal |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        out.append(f"| {r['model']} | {r['plain_ms_per_token']} | {r['streamed_ms_per_token']} | "
                   f"{r['copy_ms_per_token']} | {r['copies_in_loop_ms_per_token']} | "
                   f"{r['plain_beside_copies_ms_per_token']} | {r['vs_plain']} | {r['floor_vs_plain']} | "
                   f"{r['limit_vs_plain']} | {r['vs_limit']} | {r['hidden']} | "
                   f"{r['streamed_mb_per_token']} | {r['copy_gbps']} | {r['equal']} |")
    return "\n".join(out)


def _trim_profile(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    start = next((i for i, line in enumerate(lines) if line.strip().startswith("ncalls")), 0)
    return [line for line in lines[start:] if line.strip()]


# ---- report ----------------------------------------------------------------------------------
def table(rows: list[dict[str, Any]]) -> str:
    out = ["| variant | frames | ms/frame | streamed MB/frame | copies alone ms/frame | copies in the loop | "
           "copies hidden | vs resident | vs bound | codes equal | applied |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "ms_per_frame" not in r:
            continue
        applied = ", ".join(f"{k}={v}" for k, v in r["applied"].items() if v is not None)
        out.append(f"| {r['variant']} | {r['frames']} | {r['ms_per_frame']} | {r['streamed_mb_per_frame']} | "
                   f"{r.get('copy_ms_per_frame', '')} | {r.get('copies_in_loop_ms_per_frame', '')} | "
                   f"{r.get('hidden', '')} | {r.get('vs_resident', '')} | {r.get('vs_bound', '')} | "
                   f"{r['equal_to_upstream']} | {applied} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: results compare across runs)")
    ap.add_argument("--only", choices=("qwen3tts", "lm"), default=None)
    ap.add_argument("--lm-steps", type=int, default=64, help="tokens the generic LM generates")
    ap.add_argument("--lm-dim", type=int, default=512)
    ap.add_argument("--lm-layers", type=int, default=8)
    ap.add_argument("--lm-rows", type=lambda text: [int(n) for n in text.split(",") if n], default=[16],
                    help="prompts per step for the generic LM's extra runs beside 1 (comma-separated; '' for none)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "token_loop.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    result: dict[str, Any] = {"machine": {"threads": args.threads, "cuda": torch.cuda.is_available()}}
    ok = True
    sections: list[tuple[str, Callable[[], None]]] = []

    def qwen() -> None:
        nonlocal ok
        rows, equal = bench_qwen3tts(args.frames, args.repeat, clock)
        ok &= equal
        result["qwen3tts"] = rows
        print(table(rows))
        for r in rows:
            if "ms_per_frame" not in r:
                print(json.dumps(r))

    def lm() -> None:
        nonlocal ok
        results = [bench_lm(args.repeat, clock, args.lm_steps, args.lm_dim, args.lm_layers, rows, profile=rows == 1)
                   for rows in dict.fromkeys([1, *args.lm_rows])]
        result["generic_lm"] = results
        ok &= all(r["equal"] for r in results)
        print("\n" + lm_table(results))
        print("target: streamed <= 1.3x plain. The copies run on the simulated device's copy thread beside compute, "
              "but share the CPU's cores and caches with it: no streamed run here beats plain with the same copies "
              "made beside it waiting for nothing (limit); vs limit = streamed / that")
        print("profile of the streamed run, 1 row (by own time):")
        print("\n".join(results[0]["profile_streamed"]))

    if args.only in (None, "qwen3tts"):
        sections.append(("qwen3tts", qwen))
    if args.only in (None, "lm"):
        sections.append(("lm", lm))
    with CopyClock() as clock:
        for _name, section in sections:
            section()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nwritten: {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
