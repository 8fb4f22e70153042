"""Benchmark (not a test) for training memory, issue 16 (M60–M63), on the tiny Qwen3-TTS Base:

1. Per `training.memory` preset and batch size: the talker LoRA job (its own process, as users
   run it) — median step time and `memory/peak_mb` of its phases (on the CPU: peak RSS above
   the training process's start; on CUDA: torch's peak reserved) — printed side by side, with
   ratios to `default`, and as `PeakRow` lines for `training/peaks.py` (M63's table).
2. `lowest` with torch's huge pages on vs off (`compute.cpu_allocator`, M62): step time of the
   same job, and of the host-side optimizer alone over `--optimizer-params` float32 parameters
   (where the huge pages of its per-step temporaries show), each in a fresh process.

    .venv/bin/python bench/training.py [--steps 8] [--batches 1,2] [--device cpu] [--out FILE]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from mizuoto_runtime import Runtime  # noqa: E402
from mizuoto_runtime.app.training.job import TrainingJob  # noqa: E402
from mizuoto_runtime.app.training.memory import PRESET_NAMES  # noqa: E402

OPTIMIZER_STEPS = 12


def make_inputs(root: Path) -> tuple[Path, Path]:
    from mizuoto_runtime.app.training.dataset import write_demo_clips
    from mizuoto_runtime.engines.qwen3tts.tiny import write

    return write(root / "base", version="base"), write_demo_clips(root / "clips")


def run_job(base: Path, clips: Path, out: Path, preset: str, batch: int, steps: int, device: str,
            settings: dict[str, Any] | None = None) -> dict[str, Any]:
    seconds: list[float] = []

    def collect(event: dict[str, Any]) -> None:
        if event.get("event") == "step":
            seconds.append(event["seconds"])

    job = TrainingJob(Runtime(settings), "qwen3tts_lora",
                      {"model": str(base), "data": str(clips), "output": str(out), "steps": steps,
                       "batch_size": batch, "lr": 3e-3},
                      memory=preset, device=device, on_event=collect)
    result = job.run()
    return {"preset": preset, "batch_size": batch, "step_s": statistics.median(seconds[1:] or seconds),
            "prepare_peak_mb": result["memory/peak_mb"]["prepare"], "train_peak_mb": result["memory/peak_mb"]["train"],
            "final_loss": result["losses"][-1], "first_loss": result["losses"][0]}


def optimizer_child(mode: str, numel: int) -> None:
    """Runs in a fresh process: the host-side optimizer's step over `numel` parameters."""
    from mizuoto_runtime.app.training.cpu_allocator import apply_in_process, huge_pages_enabled
    from mizuoto_runtime.app.training.host_optimizer import HostAdamW

    apply_in_process(mode, os.environ)
    torch.set_num_threads(1)
    params = [torch.nn.Parameter(torch.randn(numel // 8)) for _ in range(8)]
    opt = HostAdamW(params, lr=1e-3)
    times = []
    for _ in range(OPTIMIZER_STEPS):
        for p in params:
            p.grad = torch.randn_like(p)
        started = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - started)
    print(json.dumps({"mode": mode, "huge_pages": huge_pages_enabled(), "step_s": statistics.median(times[2:])}))


def optimizer_run(mode: str, numel: int) -> dict[str, Any]:
    from mizuoto_runtime.app.training.cpu_allocator import cpu_allocator_env

    env = {**os.environ, **cpu_allocator_env(mode), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, __file__, "--optimizer-child", mode, str(numel)], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batches", default="1,2")
    p.add_argument("--presets", default=",".join(PRESET_NAMES))
    p.add_argument("--device", default="cpu")
    p.add_argument("--optimizer-params", type=int, default=50_000_000)
    p.add_argument("--repeat", type=int, default=3, help="fresh processes per huge-pages mode")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the training processes")
    p.add_argument("--out", default=str(REPO / "bench" / "out" / "training.json"))
    p.add_argument("--optimizer-child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.optimizer_child:
        optimizer_child(args.optimizer_child[0], int(args.optimizer_child[1]))
        return 0

    torch.set_num_threads(args.threads)  # the training process takes the host's count
    with tempfile.TemporaryDirectory(prefix="mizuoto-bench-training-") as tmp:
        base, clips = make_inputs(Path(tmp))
        from mizuoto_runtime.app.training.qwen3tts_lora import model_params

        size = model_params({"model": str(base)})
        rows = [run_job(base, clips, Path(tmp) / "lora.safetensors", preset, int(batch), args.steps, args.device)
                for batch in args.batches.split(",") for preset in args.presets.split(",")]
        huge = {mode: run_job(base, clips, Path(tmp) / "lora.safetensors", "lowest", 1, args.steps, args.device,
                              {"compute.cpu_allocator": mode}) for mode in ("hugepages", "no_hugepages")}
    runs: dict[str, list[float]] = {"hugepages": [], "no_hugepages": []}
    for _ in range(args.repeat):  # interleaved: a busy machine slows both alike
        for mode in runs:
            runs[mode].append(optimizer_run(mode, args.optimizer_params)["step_s"])
    optimizer = {mode: {"step_s": statistics.median(times), "runs": times} for mode, times in runs.items()}

    machine = f"{os.cpu_count()}-core CPU" if args.device == "cpu" else torch.cuda.get_device_name(args.device)
    print(f"\nQwen3-TTS talker LoRA, tiny Base ({size:,} parameters), {args.steps} steps, {args.threads} thread(s), "
          f"on {machine}")
    print(f"{'preset':8} {'batch':>5} {'step s':>8} {'vs default':>10} {'prepare MB':>11} {'train MB':>9} {'loss':>14}")
    for r in rows:
        ref = next(x for x in rows if x["preset"] == "default" and x["batch_size"] == r["batch_size"])
        print(f"{r['preset']:8} {r['batch_size']:>5} {r['step_s']:>8.3f} {r['step_s'] / ref['step_s']:>9.2f}x "
              f"{r['prepare_peak_mb']:>11.1f} {r['train_peak_mb']:>9.1f} "
              f"{r['first_loss']:>6.2f}->{r['final_loss']:.2f}")
    on, off = huge["hugepages"]["step_s"], huge["no_hugepages"]["step_s"]
    print(f"\nlowest, huge pages on vs off: step {on:.3f} s vs {off:.3f} s ({on / off:.2f}x)")
    on, off = optimizer["hugepages"]["step_s"], optimizer["no_hugepages"]["step_s"]
    print(f"host-side AdamW step, {args.optimizer_params:,} float32 parameters, huge pages on vs off: "
          f"{on:.3f} s vs {off:.3f} s ({on / off:.2f}x)")
    today = datetime.date.today().isoformat()
    where = "cpu" if args.device == "cpu" else f"cuda: {machine}"
    print("\nPeakRow lines for mizuoto_runtime/app/training/peaks.py:")
    for r in rows:
        print(f'    PeakRow("qwen3tts tiny Base", {size}, "{r["preset"]}", {r["batch_size"]}, '
              f'{r["train_peak_mb"]:.1f}, "{where}",\n'
              f'            "bench/training.py, {args.steps} steps, 2 clips of 1 s, {machine}, {today}"),')
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"params": size, "machine": machine, "rows": rows, "huge_pages_job": huge,
                                          "huge_pages_optimizer": optimizer}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
