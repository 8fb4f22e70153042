"""GPU suite for the streamer (issue 4: M18–M24). One command, at most 8 minutes on one H200.

    python bench/gpu_suite.py [--out results.json] [--dry-run] [--only bandwidth,oneshot,...]

Sections (each measured side by side, in one run):
  bandwidth  host→device copy bandwidth from pinned and from pageable memory
  pinning    in-place registration (`cudaHostRegister`, M22) vs `Tensor.pin_memory()`
  oneshot    a DiT-like bf16 model (~4 GB) at budgets whole / half / minimum, with and
             without side streams (M18, M19, M21): step time vs resident and vs the
             link limit (streamed bytes / pinned bandwidth); VRAM peak
  diffusers  the same model under diffusers' leaf-level group offloading with streams
             (skipped with a note when diffusers is not importable)
  sequence   a sequence LM (~2 GB) tokens/s: resident vs partial, with and without
             prefetch (M20)
  graphs     a CUDA Graph over the LM, whole and as a partly placed graphable sequence
             handle; replays counted in `ModelHandle.replayed` (M24)
The CUDA-only paths no CPU can run (issue 27), each skipped with the reason elsewhere:
  capture_failure   a capture forced to fail (a host sync inside it), then eager sampled
                    frames equal to the graph-off run, and a capture that works after it
  capture_jobs      two requests at `compute.gpu_jobs = 2`: one captures while the other
                    places (pinning) and allocates, and the other way round; both exact
  allocator_async   `compute.cuda_allocator = async` in a fresh `mizuoto doctor` process:
                    `torch.cuda.get_allocator_backend()` is cudaMallocAsync
  pinned_copy       copy-mode pinning through a handle: pinned bytes locked
                    (`torch.cuda.host_memory_stats`) equal what the budget counts, before
                    and after unload
  fp8               the LM with its weights stored fp8 (issue 36) against bfloat16 at the
                    same VRAM budget (half the bfloat16 model): time and streamed GB per
                    token; the fp8 model streamed equals it whole (`torch.equal`)
Every streamed output is compared with the resident run (`torch.equal`).

`--dry-run` runs every code path tiny on the CPU (simulated device, M55): the
buffered copy engine with simulated streams, and the pinning logic with a recording
registrar. `tests/pack/test_gpu_suite.py` runs it. Writes a JSON file and prints a short table;
the exit status is 1 when any section failed or any output differed.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mizuoto_runtime import DeviceService, ModelHandle, ModelManager, VramPolicy  # noqa: E402
from mizuoto_runtime.memory import graphs  # noqa: E402
from mizuoto_runtime.memory.cuda_allocator import ALLOC_CONF  # noqa: E402
from mizuoto_runtime.memory.pinning import CudaRegistrar, PinnedBudget, Pinner, RecordingRegistrar  # noqa: E402
from mizuoto_runtime.memory.small_weights import store_small  # noqa: E402
from mizuoto_runtime.memory.transfer import BufferedCopyEngine, CudaStreams, SimulatedStreams  # noqa: E402

GB = 1e9
SECTIONS = ("bandwidth", "pinning", "oneshot", "diffusers", "sequence", "graphs",
            "capture_failure", "capture_jobs", "allocator_async", "pinned_copy", "fp8")
CUDA_ONLY = {  # issue 27: why each of these cannot run without a CUDA device
    "capture_failure": "needs a CUDA device: CUDA Graph capture and the device generator's graph-safe state",
    "capture_jobs": "needs a CUDA device: CUDA's stream-capture rules for other threads",
    "allocator_async": "needs a CUDA device: torch's CUDA allocator backend",
    "pinned_copy": "needs a CUDA device: torch's caching host allocator (page-locked memory)",
    "fp8": "needs a CUDA device: on a CPU the time per token is the cast's, not the copy's it saves",
}
DEADLINE_S = 8 * 60 - 30  # leave room for the process's start and exit


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Real sizes on an H200; tiny ones for the dry run (units must stay >= 1 MB, M12)."""

    copy_bytes: int
    copy_reps: int
    dit_dim: int
    dit_blocks: int
    dit_heads: int
    dit_tokens: int
    steps: int
    lm_dim: int
    lm_layers: int
    lm_heads: int
    lm_vocab: int
    prompt: int
    new_tokens: int


REAL = Sizes(copy_bytes=1 << 30, copy_reps=5, dit_dim=3072, dit_blocks=12, dit_heads=24, dit_tokens=4096,
             steps=3, lm_dim=2048, lm_layers=20, lm_heads=16, lm_vocab=32000, prompt=16, new_tokens=32)
DRY = Sizes(copy_bytes=4 << 20, copy_reps=2, dit_dim=192, dit_blocks=4, dit_heads=4, dit_tokens=16,
            steps=2, lm_dim=256, lm_layers=4, lm_heads=4, lm_vocab=512, prompt=4, new_tokens=4)


# ---- models ---------------------------------------------------------------------------------
class DiTBlock(nn.Module):
    """adaLN-modulated attention + MLP: 18·dim² weights, all in `nn.Linear` (streamable, M13)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.mod = nn.Linear(dim, 6 * dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        s1, b1, g1, s2, b2, g2 = self.mod(F.silu(c)).unsqueeze(1).chunk(6, dim=-1)
        h = F.layer_norm(x, (d,)) * (1 + s1) + b1
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = x + g1 * self.proj(a)
        h = F.layer_norm(x, (d,)) * (1 + s2) + b2
        return x + g2 * self.fc2(F.gelu(self.fc1(h), approximate="tanh"))


class DiT(nn.Module):
    def __init__(self, dim: int, blocks: int, heads: int) -> None:
        super().__init__()
        self.inp = nn.Linear(64, dim)
        self.cond = nn.Linear(256, dim)
        self.blocks = nn.ModuleList(DiTBlock(dim, heads) for _ in range(blocks))
        self.out = nn.Linear(dim, 64)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        h, cond = self.inp(x), self.cond(c)
        for block in self.blocks:
            h = block(h, cond)
        return self.out(F.layer_norm(h, h.shape[-1:]))


class LMLayer(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor] | None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(F.layer_norm(x, (d,))).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            if cache:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
                cache[0], cache[1] = k, v
            else:
                cache.extend([k, v])
        causal = cache is None or q.shape[2] > 1
        a = F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2).reshape(b, t, d)
        x = x + self.o(a)
        return x + self.down(F.gelu(self.up(F.layer_norm(x, (d,))), approximate="tanh"))


class LM(nn.Module):
    """Decoder-only LM, tied embedding/head (fixed part, M14), 12·dim² weights per layer."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(LMLayer(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        self.head.weight = self.embed.weight

    def logits(self, tokens: torch.Tensor, caches: list[list[torch.Tensor]] | None = None) -> torch.Tensor:
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            x = layer(x, None if caches is None else caches[i])
        return self.head(F.layer_norm(x, x.shape[-1:]))

    def decode(self, prompt: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Greedy decoding; returns tokens, the last logits and seconds per new token."""
        caches: list[list[torch.Tensor]] = [[] for _ in self.layers]
        logits = self.logits(prompt, caches)[:, -1]
        out = [prompt]
        start = None
        for i in range(steps):
            if i == 1:
                start = _now(prompt.device)  # the first new token warms up; time the rest
            token = logits.argmax(-1, keepdim=True)
            out.append(token)
            logits = self.logits(token, caches)[:, -1]
        elapsed = _now(prompt.device) - start if start is not None else 0.0
        return torch.cat(out, dim=1), logits, elapsed / max(1, steps - 1)


def build(factory: Callable[[], nn.Module], dtype: torch.dtype, device: torch.device, seed: int) -> nn.Module:
    """Build on meta, fill on `device` (fast on a GPU), then move to host RAM: one storage per weight."""
    with torch.device("meta"):
        model = factory().to(dtype)  # converting on meta is free: no float32 copy (M27)
    model = model.to_empty(device=device)
    getattr(model, "tie_weights", lambda: None)()  # leaving meta makes new parameter objects
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.02, generator=gen)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)
    return model.to("cpu").eval()


# ---- timing and placement ------------------------------------------------------------------
def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@dataclasses.dataclass
class Bench:
    """What every section shares: the device service, the device, the sizes, the mode."""

    devices: DeviceService
    device: torch.device
    sizes: Sizes
    dry: bool
    started: float
    pinned_gbps: float = 0.0
    recording: RecordingRegistrar | None = None  # dry run: the stand-in for the CUDA runtime
    dry_pinner: Pinner | None = None  # dry run: one for all placements, as the process-wide one on a GPU
    dit_resident: torch.Tensor | None = None  # the oneshot section's resident output

    def left_s(self) -> float:
        return DEADLINE_S - (time.perf_counter() - self.started)

    def manager(self, **settings: Any) -> ModelManager:
        policy = VramPolicy({"compute.host_copies": "on", **{f"compute.{k}": v for k, v in settings.items()}})
        manager = ModelManager(self.devices, policy)
        if self.dry:
            # Every path of the CUDA engine on the CPU: static buffers, simulated streams, and
            # the pinning logic with a recording registrar (M55).
            streamer = manager.streamer(self.device)
            streamer.engine = BufferedCopyEngine(self.devices, self.device, SimulatedStreams(), self.dry_pinner)
        return manager

    def vram_reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.devices.reset_peak(self.device)

    def vram_peak_mb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        return self.devices.peak_counted_bytes(self.device) / 2**20


@contextmanager
def placed(bench: Bench, model: nn.Module, *, kind: str = "oneshot", budget: str | int = "whole",
           graphable: bool = False, **settings: Any) -> Iterator[ModelHandle]:
    """Place `model` through the runtime (M15–M17) at a budget: whole, half, minimum or bytes."""
    manager = bench.manager(**settings)
    handle = manager.register(model, engine="bench", name=type(model).__name__, kind=kind,  # type: ignore[arg-type]
                              graphable=graphable, device=bench.device)
    target = ({"whole": None, "half": handle.size_bytes // 2, "minimum": handle.min_working_set}[budget]
              if isinstance(budget, str) else budget)
    handle.load(target)
    try:
        yield handle
    finally:
        handle.offload()  # host copies stay (host_copies on): the next placement reuses them
        handle.streamer.forget(handle)
        manager.handles.remove(handle)
        gc.collect()
        bench.devices.empty_cache(bench.device)


def timed_steps(bench: Bench, fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
    out = fn()  # warm-up: learns the run order (M19), fills the copy buffers
    times = []
    for _ in range(bench.sizes.steps):
        start = _now(bench.device)
        out = fn()
        times.append(_now(bench.device) - start)
    return out, statistics.median(times)


# ---- sections ------------------------------------------------------------------------------
def section_bandwidth(bench: Bench) -> dict[str, Any]:
    """Host→device bandwidth, pinned and pageable (the link limit of the anchors)."""
    n, reps = bench.sizes.copy_bytes, bench.sizes.copy_reps
    pageable = torch.empty(n, dtype=torch.uint8).fill_(1)
    if bench.dry:
        pinned = pageable.clone()  # no page-locked memory on the CPU
    else:
        pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(1)
    out = {}
    for name, src in (("pinned", pinned), ("pageable", pageable)):
        times = []
        for _ in range(reps):
            start = _now(bench.device)
            dst = bench.devices.copy_to(src, bench.device, non_blocking=name == "pinned")
            times.append(_now(bench.device) - start)
            bench.devices.release(bench.device, n)
            del dst
        out[f"{name}_gbps"] = round(n / min(times) / GB, 2)
    bench.pinned_gbps = out["pinned_gbps"]
    out["bytes"] = n
    return out


def section_pinning(bench: Bench) -> dict[str, Any]:
    """In-place registration (M22) vs copying into pinned memory, both as throughput."""
    n = bench.sizes.copy_bytes
    host = torch.empty(n, dtype=torch.uint8).random_(0, 255)
    if bench.dry:
        assert bench.recording is not None
        register = Pinner("register", bench.recording, PinnedBudget(4 * n))
        pin_copy: Callable[[torch.Tensor], torch.Tensor] = lambda t: Pinner(  # noqa: E731
            "copy", bench.recording, PinnedBudget(4 * n)).pin_streamed([t])[0]
    else:
        register = Pinner("register", CudaRegistrar(), PinnedBudget(4 * n))
        pin_copy = torch.Tensor.pin_memory
    # Copy first: once registered, `pin_memory()` would see pinned memory and copy nothing.
    start = time.perf_counter()
    copied = pin_copy(host)
    t_copy = time.perf_counter() - start
    start = time.perf_counter()
    registered = register.pin_streamed([host])[0]
    t_register = time.perf_counter() - start
    result = {
        "bytes": n,
        "register_gbps": round(n / t_register / GB, 2),
        "pin_memory_gbps": round(n / t_copy / GB, 2),
        "register_over_pin_memory": round(t_copy / t_register, 1),
        "registered": register.is_pinned(registered),
        "in_place": registered.data_ptr() == host.data_ptr(),
        "equal": bool(torch.equal(registered, host) and torch.equal(copied, host)),
    }
    if not bench.dry:
        result["is_pinned_reports_registered"] = registered.is_pinned()
    del registered, copied
    gc.collect()
    result["unregistered_on_free"] = register.pinned_bytes == 0
    return result


def _dit_inputs(bench: Bench) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, bench.sizes.dit_tokens, 64, generator=gen).to(torch.bfloat16)
    c = torch.randn(1, 256, generator=gen).to(torch.bfloat16)
    return x.to(bench.device), c.to(bench.device)


def _dit(bench: Bench) -> nn.Module:
    s = bench.sizes
    fill = torch.device("cpu") if bench.dry else bench.device
    return build(lambda: DiT(s.dit_dim, s.dit_blocks, s.dit_heads), torch.bfloat16, fill, seed=0)


def section_oneshot(bench: Bench, model: nn.Module) -> dict[str, Any]:
    """DiT-like model at three budgets, with (async_offload 1) and without (0) side streams."""
    x, c = _dit_inputs(bench)
    runs: dict[str, Any] = {}
    reference: torch.Tensor | None = None
    resident_s = 0.0
    configs = [("whole", 1)] + [(b, a) for b in ("half", "minimum") for a in (1, 0)]
    for budget, async_offload in configs:
        if bench.left_s() < 30:
            runs[f"{budget}/streams={async_offload}"] = {"skipped": "out of time"}
            continue
        with placed(bench, model, budget=budget, async_offload=async_offload) as h:
            bench.vram_reset()
            streamed_before = h.streamer.streamed_bytes_of(h)
            with torch.inference_mode():
                out, step_s = timed_steps(bench, lambda: model(x, c))
            per_step = (h.streamer.streamed_bytes_of(h) - streamed_before) / (bench.sizes.steps + 1)
            out = out.cpu()
            if reference is None:
                reference, resident_s = out, step_s
                bench.dit_resident = out
            link_s = per_step / (bench.pinned_gbps * GB) if bench.pinned_gbps else 0.0
            runs[f"{budget}/streams={async_offload}"] = {
                "budget": budget,
                "side_streams": bool(async_offload),
                "loaded_gb": round(h.loaded_bytes / GB, 3),
                "streamed_gb_per_step": round(per_step / GB, 3),
                "step_s": round(step_s, 4),
                "vs_resident": round(step_s / resident_s, 3),
                "link_s": round(link_s, 4),
                "vs_bound": round(step_s / max(resident_s, link_s), 3),
                "link_fraction": round(link_s / step_s, 3) if step_s else 0.0,
                "vram_peak_mb": round(bench.vram_peak_mb(), 1),
                "equal": bool(torch.equal(out, reference)),
            }
    return {"size_gb": round(sum(p.numel() * p.element_size() for p in model.parameters()) / GB, 3), "runs": runs}


def section_diffusers(bench: Bench, model: nn.Module) -> dict[str, Any]:
    """The same model under diffusers' leaf-level group offloading with streams."""
    try:
        from diffusers.hooks import apply_group_offloading
    except ImportError as exc:
        return {"skipped": f"diffusers not importable ({exc.__class__.__name__}); compare by hand"}
    if bench.device.type != "cuda":
        return {"skipped": "diffusers group offloading needs a CUDA device"}
    twin = _dit(bench)
    twin.load_state_dict(model.state_dict())
    apply_group_offloading(twin, onload_device=bench.device, offload_device=torch.device("cpu"),
                           offload_type="leaf_level", use_stream=True)
    x, c = _dit_inputs(bench)
    bench.vram_reset()
    with torch.inference_mode():
        out, step_s = timed_steps(bench, lambda: twin(x, c))
    result: dict[str, Any] = {"step_s": round(step_s, 4), "vram_peak_mb": round(bench.vram_peak_mb(), 1)}
    if bench.dit_resident is not None:
        result["equal_to_resident"] = bool(torch.equal(out.cpu(), bench.dit_resident))  # informative only
    return result


def _lm(bench: Bench) -> LM:
    s = bench.sizes
    fill = torch.device("cpu") if bench.dry else bench.device
    model = build(lambda: LM(s.lm_vocab, s.lm_dim, s.lm_layers, s.lm_heads), torch.bfloat16, fill, seed=2)
    assert isinstance(model, LM)
    return model


def section_sequence(bench: Bench, model: LM) -> dict[str, Any]:
    """Tokens/s resident vs partial: `sequence` (no prefetch, M20) vs prefetching (oneshot kind)."""
    prompt = torch.arange(bench.sizes.prompt, device=bench.device).unsqueeze(0) % bench.sizes.lm_vocab
    runs: dict[str, Any] = {}
    reference: tuple[torch.Tensor, torch.Tensor] | None = None
    resident_s = 0.0
    for name, kind, budget in (("resident", "sequence", "whole"), ("partial/no-prefetch", "sequence", "half"),
                               ("partial/prefetch", "oneshot", "half")):
        if bench.left_s() < 30:
            runs[name] = {"skipped": "out of time"}
            continue
        with placed(bench, model, kind=kind, budget=budget, async_offload=1) as h:
            bench.vram_reset()
            before = h.streamer.streamed_bytes_of(h)
            with torch.inference_mode():
                tokens, logits, per_token = model.decode(prompt, bench.sizes.new_tokens)
            streamed = h.streamer.streamed_bytes_of(h) - before
            tokens, logits = tokens.cpu(), logits.cpu()
            if reference is None:
                reference, resident_s = (tokens, logits), per_token
            runs[name] = {
                "kind": kind,
                "loaded_gb": round(h.loaded_bytes / GB, 3),
                "streamed_gb_per_token": round(streamed / (bench.sizes.new_tokens + 1) / GB, 4),
                "s_per_token": round(per_token, 5),
                "tokens_per_s": round(1 / per_token, 1) if per_token else 0.0,
                "vs_resident": round(per_token / resident_s, 3) if resident_s else 0.0,
                "vram_peak_mb": round(bench.vram_peak_mb(), 1),
                "equal": bool(torch.equal(tokens, reference[0]) and torch.equal(logits, reference[1])),
            }
    return {"runs": runs}


def section_fp8(bench: Bench, model: LM) -> dict[str, Any]:
    """Issue 36: the LM stored fp8 (cast to bfloat16 on the device in each layer's forward)
    against the bfloat16 LM, both at half the bfloat16 model's size: bfloat16 streams about half
    its layers, fp8 nearly none. Per token: seconds and GB streamed. Exactness within the
    choice: the fp8 model at that budget equals it whole."""
    s = bench.sizes
    fill = torch.device("cpu") if bench.dry else bench.device
    small = build(lambda: LM(s.lm_vocab, s.lm_dim, s.lm_layers, s.lm_heads), torch.bfloat16, fill, seed=2)
    store_small(small, "fp8_e4m3fn")
    prompt = torch.arange(s.prompt, device=bench.device).unsqueeze(0) % s.lm_vocab
    with placed(bench, model, kind="sequence") as h:
        budget = h.size_bytes // 2
    runs: dict[str, Any] = {}
    whole: torch.Tensor | None = None
    for name, lm, target in (("fp8 whole", small, "whole"), ("bf16 at budget", model, budget),
                             ("fp8 at budget", small, budget)):
        with placed(bench, lm, kind="sequence", budget=target, async_offload=1) as h:
            bench.vram_reset()
            before = h.streamer.streamed_bytes_of(h)
            with torch.inference_mode():
                tokens, _, per_token = lm.decode(prompt, s.new_tokens)
            streamed = h.streamer.streamed_bytes_of(h) - before
            runs[name] = {"size_gb": round(h.size_bytes / GB, 3), "loaded_gb": round(h.loaded_bytes / GB, 3),
                          "streamed_gb_per_token": round(streamed / (s.new_tokens + 1) / GB, 4),
                          "s_per_token": round(per_token, 5), "vram_peak_mb": round(bench.vram_peak_mb(), 1)}
            if name == "fp8 whole":
                whole = tokens.cpu()
            elif name == "fp8 at budget":
                runs[name]["equal"] = bool(whole is not None and torch.equal(tokens.cpu(), whole))
    bf16, fp8 = runs["bf16 at budget"], runs["fp8 at budget"]
    return {"budget_gb": round(budget / GB, 3), "runs": runs,
            "fp8_over_bf16_time": round(fp8["s_per_token"] / bf16["s_per_token"], 3) if bf16["s_per_token"] else 0.0}


def section_graphs(bench: Bench, model: LM) -> dict[str, Any]:
    """A CUDA Graph over the LM: whole, and partly placed as a graphable sequence handle (M24)."""
    tokens = torch.arange(bench.sizes.prompt, device=bench.device).unsqueeze(0) % bench.sizes.lm_vocab
    runs: dict[str, Any] = {"usable": graphs.usable(VramPolicy())}
    reference: torch.Tensor | None = None
    for name, budget in (("whole", "whole"), ("partial", "half")):
        with placed(bench, model, kind="sequence", budget=budget, graphable=True) as h:
            with torch.inference_mode():
                eager = model.logits(tokens).cpu()
            if reference is None:
                reference = eager
            ok, reason = graphs.eligible(h)
            run: dict[str, Any] = {"eligible": ok, "reason": reason, "eager_equal": bool(torch.equal(eager, reference))}
            if ok:
                run.update(_replay(bench, h, model, tokens, reference))
            else:
                run.update(_leaf_copies_eagerly(h, model, tokens, reference))
            runs[name] = run
    return runs


def _replay(bench: Bench, h: ModelHandle, model: LM, tokens: torch.Tensor,
            reference: torch.Tensor) -> dict[str, Any]:
    with torch.inference_mode():
        captured = graphs.capture(h, lambda: model.logits(tokens))
        before = h.replayed
        start = _now(bench.device)
        for _ in range(bench.sizes.steps):
            out = captured.replay()
        replay_s = (_now(bench.device) - start) / bench.sizes.steps
    streamed = sum(u.nbytes for u in h.streamed_units)
    return {
        "replay_s": round(replay_s, 5),
        "replayed_per_replay": (h.replayed - before) // bench.sizes.steps,
        "replayed_exact": (h.replayed - before) == streamed * bench.sizes.steps,
        "equal": bool(torch.equal(out.cpu(), reference)),
    }


def _leaf_copies_eagerly(h: ModelHandle, model: LM, tokens: torch.Tensor,
                         reference: torch.Tensor) -> dict[str, Any]:
    """Where no graph may be captured (the dry run), run capture's per-leaf copies eagerly."""
    leaves = graphs.LeafCopies(h)
    h.graph_capture = leaves
    try:
        with torch.inference_mode():
            out = model.logits(tokens).cpu()
    finally:
        h.graph_capture = None
    try:
        graphs.capture(h, lambda: model.logits(tokens))
        refused = False
    except graphs.GraphRefused:
        refused = True
    return {
        "refused_cleanly": refused,
        "leaf_copied_bytes": leaves.copied_bytes,
        "leaf_bytes_exact": leaves.copied_bytes == sum(u.nbytes for u in h.streamed_units),
        "equal": bool(torch.equal(out, reference)),
    }


# ---- issue 27: the CUDA-only paths -------------------------------------------------------------
def _small_lm(bench: Bench, dim: int = 384, layers: int = 4) -> LM:
    """A small LM whose weights are no powers of two (384² bf16 = 288 KB): host blocks round up."""
    model = build(lambda: LM(1000, dim, layers, 8), torch.bfloat16, bench.device, seed=5)
    assert isinstance(model, LM)
    return model


def _sampled_frame(model: LM, tokens: torch.Tensor, sync_inside: bool = False) -> torch.Tensor:
    """One sampled token from the device generator, as `multinomial` draws it (argmax(p / q))."""
    probs = model.logits(tokens)[:, -1, :].float().softmax(-1)
    token = (probs / torch.empty_like(probs).exponential_()).argmax(-1)
    if sync_inside:
        token.item()  # a host synchronization: CUDA refuses it during capture
    return token


def section_capture_failure(bench: Bench) -> dict[str, Any]:
    """A capture that fails inside CUDA, then the eager run: the same draws as graph off."""
    model = _small_lm(bench)
    tokens = torch.arange(8, device=bench.device).unsqueeze(0)
    frames = 4
    with placed(bench, model, kind="sequence", graphable=True) as h, torch.inference_mode():
        torch.cuda.manual_seed(1234)
        graph_off = [_sampled_frame(model, tokens) for _ in range(frames)]
        torch.cuda.manual_seed(1234)
        try:
            graphs.capture(h, lambda: _sampled_frame(model, tokens, sync_inside=True), keep_rng=True)
            reason = "captured (the host sync did not fail)"
        except RuntimeError as exc:
            reason = graphs.note_failure(h.name, exc)
        eager = [_sampled_frame(model, tokens) for _ in range(frames)]  # the fallback
        torch.cuda.manual_seed(1234)
        captured = graphs.capture(h, lambda: _sampled_frame(model, tokens), keep_rng=True)
        replayed = captured.replay().clone()
    return {
        "failure": reason,
        "failed": reason.startswith("capture failed"),
        "equal_eager_after_failure": all(torch.equal(a, b) for a, b in zip(eager, graph_off)),
        "equal_graph_after_failure": bool(torch.equal(replayed, graph_off[0])),
    }


def section_capture_jobs(bench: Bench) -> dict[str, Any]:
    """`compute.gpu_jobs = 2`: request A captures while request B places (a partial placement:
    pinning) and allocates; then B holds the device while A would capture. Both exact."""
    manager = bench.manager(gpu_jobs=2)
    graphed, other = _small_lm(bench), _small_lm(bench, dim=512, layers=6)
    tokens = torch.arange(8, device=bench.device).unsqueeze(0)
    a = manager.register(graphed, engine="bench", name="graphed", kind="sequence", graphable=True, device=bench.device)
    b = manager.register(other, engine="bench", name="other", kind="oneshot", device=bench.device)
    b.cap_bytes = b.size_bytes // 2  # partly placed: its streamed weights are pinned as it is placed
    with torch.inference_mode():  # each alone first: the references
        with manager.request().use([a]):
            expected_a = graphed.logits(tokens).cpu()
        with manager.request().use([b]):
            expected_b = other.logits(tokens).cpu()
    slots = manager.phase_slots([a])
    b_asked, b_done = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def request_b() -> None:
        b_asked.set()
        started = time.perf_counter()
        try:
            with manager.request().use([b]), torch.inference_mode():
                scratch = torch.empty(64 << 20, dtype=torch.uint8, device=bench.device).fill_(1)  # allocates
                results["b_equal"] = bool(torch.equal(other.logits(tokens).cpu(), expected_b))
                results["b_waited_s"] = round(time.perf_counter() - started, 3)  # >= 0.5: it waited
                del scratch
        except Exception as exc:  # noqa: BLE001 -- reported by the main thread
            results["b_error"] = f"{exc.__class__.__name__}: {exc}"
        finally:
            b_done.set()

    def in_capture() -> torch.Tensor:
        if torch.cuda.is_current_stream_capturing() and not b_asked.is_set():
            threading.Thread(target=request_b).start()
            b_asked.wait(5.0)
            time.sleep(0.5)  # B asks for the device while A captures
        return graphed.logits(tokens)

    with manager.request().use([a]), torch.inference_mode():
        captured = graphs.capture(a, in_capture, slots=slots)
        out_a = captured.replay().cpu()
    if not (b_asked.is_set() and b_done.wait(60.0)) or "b_error" in results:
        raise RuntimeError(f"request B: {results.get('b_error', 'did not run beside the capture')}")
    results["a_captured_equal"] = bool(torch.equal(out_a, expected_a))
    # B in its phase: A does not capture (refused at once) and runs eagerly.
    holding, release = threading.Event(), threading.Event()

    def hold_b() -> None:
        with manager.request().use([b]):
            holding.set()
            release.wait(30.0)

    holder = threading.Thread(target=hold_b)
    holder.start()
    holding.wait(30.0)
    try:
        with manager.request().use([a]), torch.inference_mode():
            try:
                graphs.capture(a, lambda: graphed.logits(tokens), slots=slots)
                results["a_refused"] = "captured"
            except graphs.GraphRefused as exc:
                results["a_refused"] = str(exc)
                results["a_refused_busy"] = graphs.BUSY in str(exc)
            results["a_eager_equal"] = bool(torch.equal(graphed.logits(tokens).cpu(), expected_a))
    finally:
        release.set()
        holder.join(30.0)
    for h in (a, b):
        manager.unregister(h)
    return results


def section_allocator_async(bench: Bench) -> dict[str, Any]:
    """`mizuoto doctor --setting compute.cuda_allocator=async` in a fresh process."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != ALLOC_CONF}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "mizuoto_runtime", "doctor", "--setting",
                           "compute.cuda_allocator=async"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"mizuoto doctor failed: {done.stderr[-800:]}")
    report = json.loads(done.stdout)["cuda_allocator"]
    return {**report, "backend_equal": report["backend"] == "cudaMallocAsync"}


def _host_locked() -> int:
    """Page-locked bytes torch's caching host allocator holds (in use and cached)."""
    return int(torch.cuda.host_memory_stats().get("allocated_bytes.current", 0))


def section_pinned_copy(bench: Bench) -> dict[str, Any]:
    """Copy-mode pinning (ROCm's, run here on CUDA): what the host allocator locks equals what
    the budget counts, while placed and after unload (issue 27)."""
    model = _small_lm(bench, dim=384, layers=6)
    tokens = torch.arange(8, device=bench.device).unsqueeze(0)
    manager = bench.manager()
    pinner = Pinner("copy", CudaRegistrar(), PinnedBudget(0))
    manager.streamer(bench.device).engine = BufferedCopyEngine(bench.devices, bench.device,
                                                               CudaStreams(bench.device), pinner)
    gc.collect()
    torch._C._host_emptyCache()
    before = _host_locked()
    h = manager.register(model, engine="bench", name="pinned", kind="oneshot", device=bench.device)
    h.load(h.min_working_set)
    with torch.inference_mode():
        model.logits(tokens)  # the streamed copies read the pinned blocks
    torch.cuda.synchronize(bench.device)
    placed_locked, counted = _host_locked() - before, pinner.pinned_bytes
    streamed = sum(u.nbytes for u in h.streamed_units)
    manager.unregister(h)  # unloads it: every pinned copy released
    gc.collect()
    return {
        "streamed_mb": round(streamed / 2**20, 2),
        "locked_mb": round(placed_locked / 2**20, 2),
        "counted_mb": round(counted / 2**20, 2),
        "counted_equal": placed_locked == counted and counted >= streamed > 0,
        "after_unload_equal": _host_locked() == before and pinner.pinned_bytes == 0,
    }


# ---- driver ---------------------------------------------------------------------------------
def run(dry: bool, only: tuple[str, ...]) -> dict[str, Any]:
    if dry:
        # Not strict (M56): the suite places one model many times, and an offloaded strict
        # component holds stand-ins, not its host tensors.
        devices = DeviceService(simulate={"cpu": 1 << 30})
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --dry-run")
        devices = DeviceService()
    device = devices.compute_device()
    bench = Bench(devices, device, DRY if dry else REAL, dry, time.perf_counter())
    if dry:
        bench.recording = RecordingRegistrar()
        bench.dry_pinner = Pinner("register", bench.recording, PinnedBudget(1 << 40))
    result: dict[str, Any] = {"mode": "dry-run" if dry else "gpu", "device": str(device), "torch": torch.__version__}
    if device.type == "cuda":
        result["device_name"] = torch.cuda.get_device_name(device)
    models: dict[str, nn.Module] = {}  # built once, on first use, shared by the sections

    def dit() -> nn.Module:
        if "dit" not in models:
            models["dit"] = _dit(bench)
        return models["dit"]

    def lm() -> LM:
        if "lm" not in models:
            models["lm"] = _lm(bench)
        model = models["lm"]
        assert isinstance(model, LM)
        return model

    steps: dict[str, Callable[[], dict[str, Any]]] = {
        "bandwidth": lambda: section_bandwidth(bench),
        "pinning": lambda: section_pinning(bench),
        "oneshot": lambda: section_oneshot(bench, dit()),
        "diffusers": lambda: section_diffusers(bench, dit()),
        "sequence": lambda: section_sequence(bench, lm()),
        "graphs": lambda: section_graphs(bench, lm()),
        "capture_failure": lambda: section_capture_failure(bench),
        "capture_jobs": lambda: section_capture_jobs(bench),
        "allocator_async": lambda: section_allocator_async(bench),
        "pinned_copy": lambda: section_pinned_copy(bench),
        "fp8": lambda: section_fp8(bench, lm()),
    }
    for name in SECTIONS:
        if name not in only:
            continue
        if bench.left_s() < 20:
            result[name] = {"skipped": "out of time (8-minute budget)"}
            continue
        if name in CUDA_ONLY and device.type != "cuda":
            result[name] = {"skipped": CUDA_ONLY[name]}
            continue
        started = time.perf_counter()
        try:
            result[name] = steps[name]()
        except Exception as exc:  # noqa: BLE001 -- a failed section must not hide the others' results
            result[name] = {"error": f"{exc.__class__.__name__}: {exc}", "trace": traceback.format_exc(limit=6)}
        result[name]["seconds"] = round(time.perf_counter() - started, 2)
    if dry and bench.recording is not None:
        result["registrar_calls"] = sorted({c[0] for c in bench.recording.calls})
    result["total_s"] = round(time.perf_counter() - bench.started, 1)
    return result


def equal_flags(result: dict[str, Any]) -> dict[str, bool]:
    """Every `equal*` flag of streamed runs (diffusers' own equality is informative only)."""
    flags: dict[str, bool] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if path.startswith("diffusers"):
                    continue
                if isinstance(value, bool) and (key.startswith("equal") or key.endswith("_equal")):
                    flags[f"{path}.{key}" if path else key] = value
                else:
                    walk(value, f"{path}.{key}" if path else key)

    walk(result, "")
    return flags


def table(result: dict[str, Any]) -> str:
    lines = [f"mizuoto GPU suite — {result['mode']} on {result.get('device_name', result['device'])}"]
    bw = result.get("bandwidth", {})
    if "pinned_gbps" in bw:
        lines.append(f"H2D bandwidth: pinned {bw['pinned_gbps']} GB/s, pageable {bw['pageable_gbps']} GB/s")
    pin = result.get("pinning", {})
    if "register_gbps" in pin:
        lines.append(f"register in place {pin['register_gbps']} GB/s vs pin_memory() {pin['pin_memory_gbps']} GB/s "
                     f"({pin['register_over_pin_memory']}x)")
    lines.append(f"{'run':<30}{'time':>10}{'vs res':>8}{'vs bound':>9}{'GB moved':>10}{'VRAM MB':>10}  equal")
    for run_name, r in result.get("oneshot", {}).get("runs", {}).items():
        if "step_s" in r:
            lines.append(f"{'dit ' + run_name:<30}{r['step_s']:>9.4f}s{r['vs_resident']:>8}{r['vs_bound']:>9}"
                         f"{r['streamed_gb_per_step']:>10}{r['vram_peak_mb']:>10}  {r['equal']}")
    diff = result.get("diffusers", {})
    lines.append(f"{'dit diffusers leaf+stream':<30}" + (
        f"{diff['step_s']:>9.4f}s{'':>27}{diff['vram_peak_mb']:>10}" if "step_s" in diff
        else f"  {diff.get('skipped') or diff.get('error', '')}"))
    for run_name, r in result.get("sequence", {}).get("runs", {}).items():
        if "s_per_token" in r:
            lines.append(f"{'lm ' + run_name:<30}{r['s_per_token']:>9.5f}s{r['vs_resident']:>8}{'':>9}"
                         f"{r['streamed_gb_per_token']:>10}{r['vram_peak_mb']:>10}  {r['equal']}")
    for run_name, r in result.get("graphs", {}).items():
        if isinstance(r, dict) and "equal" in r:
            what = "replayed" if "replay_s" in r else f"refused ({r['reason']})"
            lines.append(f"{'graph ' + run_name:<30}{what}  equal {r['equal']}")
    fp8 = result.get("fp8", {})
    for run_name, r in fp8.get("runs", {}).items():
        lines.append(f"{'lm ' + run_name:<30}{r['s_per_token']:>9.5f}s{'':>8}{'':>9}"
                     f"{r['streamed_gb_per_token']:>10}{r['vram_peak_mb']:>10}  {r.get('equal', '')}")
    for name in CUDA_ONLY:
        r = result.get(name, {})
        if name == "fp8" and "runs" in r:
            continue
        if r:
            flags_here = {k: v for k, v in r.items() if isinstance(v, bool)}
            lines.append(f"{name:<30}" + (f"skipped: {r['skipped']}" if "skipped" in r else
                                          r.get("error") or " ".join(f"{k}={v}" for k, v in flags_here.items())))
    errors = [k for k, v in result.items() if isinstance(v, dict) and "error" in v]
    flags = equal_flags(result)
    lines.append(f"equal flags: {sum(flags.values())}/{len(flags)} true; errors: {errors or 'none'}; "
                 f"total {result['total_s']} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="every code path, tiny, on the CPU")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default bench/out/gpu_suite[-dry].json)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {', '.join(SECTIONS)}")
    args = ap.parse_args(argv)
    only = tuple(s.strip() for s in args.only.split(",") if s.strip())
    unknown = set(only) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections: {', '.join(sorted(unknown))}")
    result = run(args.dry_run, only)
    out = args.out or Path(__file__).resolve().parent / "out" / f"gpu_suite{'-dry' if args.dry_run else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"wrote {out}")
    failed = any(isinstance(v, dict) and "error" in v for v in result.values())
    return 1 if failed or not all(equal_flags(result).values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
