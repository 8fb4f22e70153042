"""Shared-GPU scenario (issue 17 acceptance, M35): a ComfyUI model and Qwen3-TTS in one process.

    python bench/shared_gpu.py --comfyui $COMFYUI_PATH --checkpoint DIR [--cap-gb 24 --share 0.6]
                               [--aimdo on,off] [--out results.json]
    python bench/shared_gpu.py --comfyui $COMFYUI_PATH --dry-run       # the same path, tiny, on the CPU

On a CUDA GPU, for each of "aimdo on" (ComfyUI's dynamic VRAM) and "aimdo off" (the legacy
ModelPatcher), in a fresh process each:
  1. ComfyUI is imported with `--reserve-vram (total - cap)`, so it and Mizuoto (whose default
     reserve is ComfyUI's) see a GPU of `--cap-gb`; "aimdo on" initializes comfy-aimdo the way
     ComfyUI's `main.py` does, "aimdo off" passes `--disable-dynamic-vram`;
  2. Mizuoto joins ComfyUI's accounting (`comfy_bridge.install`) and loads the Qwen3-TTS engine
     from `--checkpoint`; TTS runs alone (warm-up, then timed);
  3. a ComfyUI-style model — `comfy.ops` linear blocks in a `ModelPatcher` (dynamic under aimdo),
     `--share` of the capped GPU — is loaded by `load_models_gpu` and sampled (forward steps);
  4. TTS runs again beside it (timed), then the ComfyUI model samples again (timed).
It reports, per mode: OOMs (none allowed), reloads from disk (Mizuoto checkpoint reads after the
first load; the ComfyUI model's entry detached instead of kept — none allowed), TTS time
shared / alone (target ≤ 1.3), the ComfyUI model's step time after / before, and what each
side held. Exit status 1 when a target is missed or a mode raised.

`--dry-run` runs every step on the CPU: ComfyUI `--cpu`, Mizuoto on its simulated device
(M55), the demo engine unless `--checkpoint` is given, a tiny ComfyUI model, aimdo off (it
does not initialize on a CPU). Its figures exercise the code, they measure nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GB = 1 << 30
MB = 1 << 20
TEXT = "Streaming weights keeps every model on one GPU, slower when short, never wrong."
TTS_RUNS = 3
TOKENS = 256  # ~20 s of speech at 12.5 frames per second
DRY_TOKENS = 16
DIFFUSION_STEPS = 4
TTS_RATIO_TARGET = 1.3
CHILD_TIMEOUT_S = 540


def _comfyui_argv(args: argparse.Namespace, aimdo: bool, total_gb: float) -> list[str]:
    if args.dry_run:
        return ["--cpu"]
    argv = ["--reserve-vram", f"{max(0.0, total_gb - args.cap_gb):.3f}"]
    if not aimdo:
        argv.append("--disable-dynamic-vram")
    return argv


def _start_comfyui(args: argparse.Namespace, aimdo: bool) -> tuple[Any, str]:
    """Import ComfyUI's model management with the scenario's flags, dynamic VRAM started the way
    ComfyUI's `main.py` starts it (v0.33: comfy-aimdo's library loaded before `model_management`
    is imported, whose aimdo modules bind it at import; then every device initialized, the
    dynamic patcher made ComfyUI's core patcher); returns (mm, aimdo state)."""
    import torch

    total_gb = torch.cuda.mem_get_info()[1] / GB if torch.cuda.is_available() and not args.dry_run else 0.0
    sys.path.insert(0, args.comfyui)
    sys.argv = [sys.argv[0], *_comfyui_argv(args, aimdo, total_gb)]
    import comfy.options

    comfy.options.enable_args_parsing()
    import comfy.cli_args

    enables = getattr(comfy.cli_args, "enables_dynamic_vram", None)
    wanted = aimdo and enables is not None and enables()
    if wanted:
        _load_aimdo(comfy.cli_args.args)
    import comfy.model_management as mm

    if not aimdo:
        return mm, "off"
    if not wanted:
        return mm, "unavailable (this ComfyUI has no dynamic VRAM, or its flags turn it off)"
    if not _init_aimdo_devices(comfy.cli_args.args, mm):
        return mm, "unavailable (comfy-aimdo did not initialize)"
    import comfy.memory_management  # releases with dynamic VRAM only
    import comfy.model_patcher

    comfy.model_patcher.CoreModelPatcher = comfy.model_patcher.ModelPatcherDynamic
    comfy.memory_management.aimdo_enabled = True
    return mm, "on"


def _load_aimdo(comfy_args: Any) -> None:
    """comfy-aimdo's library, with ComfyUI's headroom (its `--reserve-vram`), each protocol
    ComfyUI v0.33 speaks: 0.4.13 (NVML pressure), 0.4.10, 0.4.9."""
    import comfy_aimdo.control

    headroom = None if comfy_args.reserve_vram is None else int(comfy_args.reserve_vram * GB)
    nvml = not getattr(comfy_args, "disable_nvml_pressure", False)
    for options in ({"simple_vram_headroom": headroom, "nvml_pressure": nvml}, {"simple_vram_headroom": headroom}, {}):
        try:
            comfy_aimdo.control.init(**options)
            return
        except TypeError:
            continue


def _init_aimdo_devices(comfy_args: Any, mm: Any) -> bool:
    import comfy_aimdo.control

    headroom = int(getattr(comfy_args, "vram_headroom", 0) * GB)
    devices = [d.index for d in mm.get_all_torch_devices()]
    try:
        return bool(comfy_aimdo.control.init_devices([(index, headroom) for index in devices]))
    except TypeError:  # comfy-aimdo 0.4.9 takes device indices only
        return bool(comfy_aimdo.control.init_devices(devices))


def _comfy_model(mm: Any, nbytes: int, dry: bool, dynamic: bool) -> tuple[Any, Any]:
    """A ComfyUI-style model: `comfy.ops` linear blocks of 64 MB (1 MB in the dry run), in the
    patcher ComfyUI itself would use (dynamic under aimdo)."""
    import comfy.model_patcher
    import comfy.ops
    import torch

    dim = 512 if dry else 4096
    block = dim * dim * 2  # bf16
    blocks = max(1, nbytes // block)
    linear = comfy.ops.disable_weight_init.Linear
    model = torch.nn.Sequential(*(linear(dim, dim, bias=False, dtype=torch.bfloat16) for _ in range(blocks)))
    for layer in model:
        torch.nn.init.normal_(layer.weight, std=dim ** -0.5)
    device = mm.get_torch_device()
    cls = comfy.model_patcher.ModelPatcher
    if dynamic:
        cls = getattr(comfy.model_patcher, "ModelPatcherDynamic", cls)
    patcher = cls(model, load_device=device, offload_device=torch.device("cpu"))
    return patcher, torch.randn(8, dim, dtype=torch.bfloat16)


def _sample(mm: Any, patcher: Any, x: Any) -> float:
    """One "sampling" pass: load the model the way a sampler does, run its blocks; seconds."""
    import torch

    start = time.perf_counter()
    mm.load_models_gpu([patcher])
    h = x.to(mm.get_torch_device())
    with torch.inference_mode():
        for _ in range(DIFFUSION_STEPS):
            h = patcher.model(h)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _tts(runtime: Any, engine: Any, runs: int, tokens: int) -> tuple[float, list[dict[str, Any]]]:
    from mizuoto_runtime.engines import Sampling

    times, metas = [], []
    for _ in range(runs):
        start = time.perf_counter()
        _, meta = runtime.say(engine, TEXT, sampling=Sampling(seed=1, max_new_tokens=tokens))
        times.append(time.perf_counter() - start)
        metas.append(meta["memory"])
    return statistics.median(times), metas


def _run(args: argparse.Namespace, aimdo: bool) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    mm, state = _start_comfyui(args, aimdo)

    from mizuoto_runtime.app.comfy_bridge import aimdo_reclaimable, install
    from mizuoto_runtime.app.runtime import Runtime
    from mizuoto_runtime.nn import loading

    reads = {"n": 0}

    def counted_open(file: Any, *a: Any, **k: Any) -> Any:
        """`open` as `loading.py` sees it: every checkpoint file read is counted."""
        reads["n"] += 1
        return open(file, *a, **k)

    loading.open = counted_open  # type: ignore[attr-defined]  # shadows the builtin in that module only
    settings: dict[str, Any] = {"compute.simulate_vram_mb": 64} if args.dry_run else {}
    runtime = Runtime(settings)
    install(runtime)
    engine_id = "qwen3tts" if args.checkpoint else "demo"
    engine = runtime.engine(engine_id, args.checkpoint, "bfloat16" if not args.dry_run else "float32")
    first_reads = reads["n"]
    result: dict[str, Any] = {"aimdo": state, "engine": engine_id}
    runs, tokens = (1, DRY_TOKENS) if args.dry_run else (TTS_RUNS, TOKENS)
    _tts(runtime, engine, 1, tokens)  # warm-up
    result["tts_alone_s"], _ = _tts(runtime, engine, runs, tokens)
    cap = args.cap_gb * GB if not args.dry_run else 64 * MB
    patcher, x = _comfy_model(mm, int(args.share * cap), args.dry_run, dynamic=state == "on")
    result["diffusion_first_s"] = _sample(mm, patcher, x)
    result["diffusion_mb"] = round(patcher.model_size() / MB, 1)
    if state == "on":  # what aimdo would give up on demand, counted as free by ComfyUI and by us
        result["aimdo_reclaimable_mb"] = round(aimdo_reclaimable(mm.get_torch_device()) / MB, 1)
    result["tts_shared_s"], metas = _tts(runtime, engine, runs, tokens)
    result["diffusion_again_s"] = _sample(mm, patcher, x)
    result["diffusion_entry_kept"] = any(e.model is patcher for e in mm.current_loaded_models)
    result["tts_ratio"] = round(result["tts_shared_s"] / result["tts_alone_s"], 3)
    result["diffusion_ratio"] = round(result["diffusion_again_s"] / result["diffusion_first_s"], 3)
    result["checkpoint_reads_after_load"] = reads["n"] - first_reads
    result["tts_memory"] = metas[-1]
    result["our_handles_unloaded"] = [h.name for h in engine.handles() if h.unloaded]
    return result


def _verdict(r: dict[str, Any], dry: bool) -> list[str]:
    missed = []
    if r.get("error"):
        missed.append(f"raised: {r['error'].splitlines()[-1]}")
        return missed
    if r["checkpoint_reads_after_load"] or r["our_handles_unloaded"]:
        missed.append("Mizuoto reloaded from disk")
    if r["aimdo"] == "on" and not r["diffusion_entry_kept"]:
        missed.append("the dynamic ComfyUI model was detached (reload from disk)")
    if not dry and r["tts_ratio"] > TTS_RATIO_TARGET:
        missed.append(f"TTS {r['tts_ratio']}x its time alone (target <= {TTS_RATIO_TARGET})")
    return missed


def child(args: argparse.Namespace) -> None:
    import torch

    aimdo = args.child == "on"
    try:
        result = _run(args, aimdo)
    except torch.OutOfMemoryError:
        result = {"aimdo": args.child, "error": "OOM\n" + traceback.format_exc()}
    except Exception:  # noqa: BLE001 — reported to the parent, which prints it
        result = {"aimdo": args.child, "error": traceback.format_exc()}
    print("SHARED-GPU " + json.dumps(result), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--comfyui", default=os.environ.get("COMFYUI_PATH", ""), help="a ComfyUI work tree")
    p.add_argument("--checkpoint", help="a Qwen3-TTS checkpoint folder (default: the demo engine)")
    p.add_argument("--cap-gb", type=float, default=24.0, help="the GPU size ComfyUI sees (--reserve-vram)")
    p.add_argument("--share", type=float, default=0.6, help="the ComfyUI model's share of that")
    p.add_argument("--aimdo", default="on,off", help="modes to run: on, off, or both")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if not args.comfyui or not (Path(args.comfyui) / "comfy" / "model_management.py").is_file():
        p.error("--comfyui (or COMFYUI_PATH) must name a ComfyUI work tree")
    if args.child:
        child(args)
        return 0
    modes = ["off"] if args.dry_run else [m.strip() for m in args.aimdo.split(",") if m.strip()]
    results = []
    for mode in modes:
        command = [sys.executable, __file__, "--child", mode, *sys.argv[1:]]
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=args.comfyui)
        lines = [line for line in done.stdout.splitlines() if line.startswith("SHARED-GPU ")]
        results.append(json.loads(lines[-1][len("SHARED-GPU "):]) if lines else
                       {"aimdo": mode, "error": f"exit {done.returncode}\n{done.stderr[-3000:]}"})
    failed = False
    print(f"{'aimdo':<12} {'TTS alone s':>11} {'shared s':>9} {'ratio':>6} {'diffusion again/first':>22}  verdict")
    for r in results:
        missed = _verdict(r, args.dry_run)
        failed |= bool(missed)
        if r.get("error"):
            print(f"{r['aimdo']:<12} {'-':>11} {'-':>9} {'-':>6} {'-':>22}  {'; '.join(missed)}")
            continue
        print(f"{r['aimdo'][:12]:<12} {r['tts_alone_s']:>11.3f} {r['tts_shared_s']:>9.3f} {r['tts_ratio']:>6.2f} "
              f"{r['diffusion_ratio']:>22.2f}  {'; '.join(missed) or 'ok'}")
    if args.dry_run:
        print("dry run on the CPU: the figures exercise the code and measure nothing")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
