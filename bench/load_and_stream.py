"""Benchmark (not a test) for the runtime core, issue 2:

1. Peak RSS while loading a ~200 MB bf16 checkpoint into a bf16 model (M27: built on meta,
   then copied from the memory-mapped file) vs the checkpoint's size, side by side with the
   naive path (build in float32, read the state dict, convert).
2. Time of a forward with every unit streamed (`none`) vs a plain forward, on the simulated
   device (CPU), and with half the units resident.
3. Time of one token step (one position, a 64-position KV cache) the same three ways: a small
   step is where the hooks' and the streamer's own overhead shows.

    .venv/bin/python bench/load_and_stream.py [--dim 1024 --layers 8]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from mizuoto_runtime import DeviceService, ModelHandle, build_on_meta, load_safetensors  # noqa: E402

from support.models import TinyLM  # noqa: E402


def peak_rss_bytes() -> int:
    """This process's peak RSS (VmHWM). Not ru_maxrss: Linux carries that across exec from the
    forked parent, so a child of a big process would report the parent's size."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def child(mode: str, path: str, dim: int, layers: int) -> None:
    """Runs in a fresh process so its peak RSS is the load's own."""
    factory = lambda: TinyLM(vocab=512, dim=dim, layers=layers)  # noqa: E731
    # The first meta-device construction imports torch's meta kernels (~70 MB, once per
    # process, whatever the model's size): warm it up so the figure is the load's own.
    build_on_meta(lambda: TinyLM(vocab=8, dim=8, layers=1), torch.bfloat16)
    base = current_rss_bytes()
    if mode == "meta":
        model = load_safetensors(build_on_meta(factory, torch.bfloat16), path)
    else:
        from safetensors.torch import load_file

        model = factory()  # float32
        model.load_state_dict(load_file(path), strict=False)
        model = model.to(torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    print(json.dumps({"base": base, "peak": peak_rss_bytes(), "after": current_rss_bytes()}))


def measure_load(path: Path, dim: int, layers: int) -> dict[str, float]:
    size = path.stat().st_size
    out: dict[str, float] = {"checkpoint_mb": round(size / 2**20, 1)}
    for mode in ("meta", "naive"):
        proc = subprocess.run([sys.executable, __file__, "--child", mode, str(path), "--dim", str(dim),
                               "--layers", str(layers)], capture_output=True, text=True, check=True)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        out[f"{mode}_peak_over_checkpoint"] = round((r["peak"] - r["base"]) / size, 3)
    return out


def compare(plain: torch.nn.Module, run: Callable[[torch.nn.Module], torch.Tensor], kind: str,
            repeat: int) -> dict[str, float]:
    """Seconds of `run` plain, with every unit streamed (`none`) and with half the units resident,
    on the strict simulated device; timed alternately (best of `repeat`) so load on the machine
    affects every variant alike. Each variant's output must equal the plain run's."""
    expected = run(plain)
    variants: dict[str, torch.nn.Module] = {"plain": plain}
    for placement in ("none", "half"):
        model = copy.deepcopy(plain)
        h = ModelHandle(model, devices=DeviceService(simulate={"cpu": 8 << 30}, strict=True), kind=kind)  # type: ignore[arg-type]
        h.load(h.min_working_set if placement == "none" else (h.min_working_set + h.size_bytes) // 2)
        assert torch.equal(run(model), expected), f"{placement}: streamed output differs"
        variants[placement] = model
    best = {name: float("inf") for name in variants}
    for _ in range(repeat):
        for name, model in variants.items():
            start = time.perf_counter()
            run(model)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def ratios(best: dict[str, float]) -> dict[str, float]:
    return {f"{name}_over_plain": round(best[name] / best["plain"], 3) for name in ("none", "half")}


def measure_stream(dim: int, layers: int, repeat: int = 7) -> dict[str, float]:
    """A forward over 256 positions (bf16): plain vs streamed."""
    torch.manual_seed(0)
    plain = TinyLM(vocab=512, dim=dim, layers=layers).to(torch.bfloat16).eval()
    x = torch.randint(0, 512, (1, 256))

    def run(m: torch.nn.Module) -> torch.Tensor:
        with torch.inference_mode():
            return m.step(x, [[] for _ in m.layers])

    best = compare(plain, run, "oneshot", repeat)
    return {**{f"{name}_s": round(t, 4) for name, t in best.items()}, **ratios(best)}


def measure_steps(dim: int, layers: int, steps: int = 16, repeat: int = 7) -> dict[str, float]:
    """Token steps (float32, one position over a 64-position cache): plain vs streamed. A
    small step is where the hooks' and the streamer's own cost shows."""
    torch.manual_seed(0)
    plain = TinyLM(vocab=512, dim=dim, layers=layers).eval()
    prompt = torch.randint(0, 512, (1, 64))
    token = torch.randint(0, 512, (1, 1))

    def run(m: torch.nn.Module) -> torch.Tensor:
        with torch.inference_mode():
            caches: list[list[torch.Tensor]] = [[] for _ in m.layers]
            m.step(prompt, caches)
            out = torch.empty(0)
            for _ in range(steps):
                out = m.step(token, [list(c) for c in caches])  # the same cache every step
            return out

    best = compare(plain, run, "sequence", repeat)
    return {**{f"{name}_ms_per_step": round(1000 * t / (steps + 1), 3) for name, t in best.items()}, **ratios(best)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--child", nargs=2, metavar=("MODE", "PATH"))
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.dim, args.layers)
        return
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        from safetensors.torch import save_file

        model = TinyLM(vocab=512, dim=args.dim, layers=args.layers).to(torch.bfloat16)
        save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight"}, str(path))
        del model
        with open(path, "rb") as f:
            os.fsync(f.fileno())  # a checkpoint on disk is clean; freshly written dirty pages skew RSS
        load = measure_load(path, args.dim, args.layers)
    stream = measure_stream(args.dim, args.layers)
    steps = measure_steps(args.dim, args.layers)
    print(json.dumps({"load": load, "stream": stream, "steps": steps}, indent=2))
    print(f"\nload peak RSS / checkpoint: M27 path {load['meta_peak_over_checkpoint']}x "
          f"(target <= 1.15x), naive float32 path {load['naive_peak_over_checkpoint']}x "
          f"({load['checkpoint_mb']} MB checkpoint)")
    print(f"forward, simulated device (CPU): all units streamed {stream['none_over_plain']}x plain, "
          f"half resident {stream['half_over_plain']}x plain")
    print(f"token step, simulated device (CPU): all units streamed {steps['none_over_plain']}x plain, "
          f"half resident {steps['half_over_plain']}x plain ({steps['plain_ms_per_step']} ms plain)")


if __name__ == "__main__":
    main()
