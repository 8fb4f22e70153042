"""Check a native engine against reference data made by its upstream code (issue 22):
``mizuoto check-reference --engine NAME DIR``.

DIR holds ``ckpt/`` (a checkpoint in the official layout), ``reference.safetensors`` (tensors
named ``<stage>.<in|out>.<name>``) and ``reference.json`` (ids, seeds, settings). An engine
provides the stages: its class names the module of its package that has them (`Engine.REFERENCE`,
``reference``), with a function ``stages(ref: Reference) -> Iterable[Stage]``. Each stage loads
what it needs with the engine's own loader, feeds the recorded inputs and returns `Check`s: an
output it computed beside the recorded one, and the tolerance that applies.

A stage may add, for an ill-conditioned output, how far a one-ulp change of its recorded input
moves it (`Check.conditioning`): printed beside the error, so a failure within the output's own
conditioning is told apart from a wrong computation; it never turns a FAIL into a PASS.

Tolerances (the fixture READMEs' rule): ``module`` — one module or one step,
``max|got - ref| <= 1e-4 * max(1, max|ref|)``; ``chain`` — a chained solve or a whole
pipeline, ``1e-3``; ``exact`` — integers (ids, lengths, flags), identical. Every recorded
``*.out.*`` tensor no check covered is reported as unchecked and fails the run, as does a stage
that raises: nothing recorded goes unverified silently.
"""
from __future__ import annotations

import ctypes
import dataclasses
import logging
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

import torch

from ..engines import ENGINES, engine_class
from ..engines.reference import TOLERANCE, Check, Reference, Stage
from ..errors import MizuotoError

log = logging.getLogger(__name__)

@dataclasses.dataclass
class Line:
    """What the checker prints for one check."""

    name: str
    kind: str
    passed: bool
    max_abs: float = math.nan
    rel: float = math.nan
    note: str = ""

    def text(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        if self.kind == "error" or self.kind == "unchecked":
            return f"{status}  {self.name:<40} {self.note}"
        tol = TOLERANCE.get(self.kind, 0.0)
        extra = f"  {self.note}" if self.note else ""
        return (f"{status}  {self.name:<40} max_abs={self.max_abs:.3e}  rel={self.rel:.3e}  "
                f"tol={tol:.0e} ({self.kind}){extra}")


Provider = Callable[[Reference], Iterable[Stage]]


def provider_for(engine: str) -> Provider:
    """The stages of `engine`, from the module of its package its class names."""
    if engine not in ENGINES:
        raise MizuotoError(f"engine {engine!r} has no reference checker (no such engine; known: {', '.join(ENGINES)})")
    cls = engine_class(engine)
    if cls.REFERENCE is None:
        raise MizuotoError(f"engine {engine!r} has no reference checker")
    try:
        module = cls.package_module(cls.REFERENCE)
    except ModuleNotFoundError as exc:
        raise MizuotoError(f"engine {engine!r}: its reference checker needs {exc.name!r}, "
                           "which is not installed") from exc
    stages = getattr(module, "stages", None)
    if not callable(stages):
        raise MizuotoError(f"{module.__name__} defines no stages(ref) function")
    return stages


def _as_tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(value)


def compare(check: Check, ref: Reference) -> Line:
    """The error of one check against its reference, judged by its kind's tolerance."""
    if check.got is None:
        return Line(check.name, "error", False, note="the stage produced nothing")
    want = _as_tensor(check.want if check.want is not None else ref.tensor(check.name))
    got = _as_tensor(check.got)
    if check.kind == "exact":
        got_i, want_i = got.to(torch.int64).reshape(-1), want.to(torch.int64).reshape(-1)
        if got_i.shape != want_i.shape:
            return Line(check.name, "exact", False, note=f"length {got_i.numel()} vs {want_i.numel()}")
        diff = (got_i != want_i).nonzero()
        note = "" if diff.numel() == 0 else (f"first difference at {int(diff[0])}: "
                                             f"{int(got_i[diff[0]])} vs {int(want_i[diff[0]])}")
        err = float((got_i - want_i).abs().max()) if got_i.numel() else 0.0
        return Line(check.name, "exact", diff.numel() == 0, err, err, note)
    if got.shape != want.shape:
        return Line(check.name, check.kind, False, note=f"shape {tuple(got.shape)} vs {tuple(want.shape)}")
    got_f, want_f = got.detach().to(torch.float32).cpu(), want.to(torch.float32)
    scale = max(1.0, float(want_f.abs().max())) if want_f.numel() else 1.0
    max_abs = float((got_f - want_f).abs().max()) if want_f.numel() else 0.0
    rel = max_abs / scale
    passed = math.isfinite(max_abs) and rel <= TOLERANCE[check.kind]
    note = ""
    if check.conditioning is not None:
        note = f"(a 1-ulp change of the input moves this by {check.conditioning:.1e})"
    return Line(check.name, check.kind, passed, max_abs, rel, note)


def check_reference(engine: str, folder: str | Path, only: str | None = None,
                    out: TextIO | None = None) -> list[Line]:
    """Run every stage of `engine` on `folder`; print one line per check to `out`."""
    provider = provider_for(engine)
    ref = Reference(folder)
    lines: list[Line] = []
    covered: set[str] = set()

    def emit(line: Line) -> None:
        lines.append(line)
        if out is not None:
            print(line.text(), file=out, flush=True)

    for stage in provider(ref):
        if only and only not in stage.name:
            continue
        try:
            checks = list(stage.run())
        except Exception as exc:  # noqa: BLE001 - any failure of a stage is reported, the others still run
            log.debug("stage %s failed", stage.name, exc_info=True)
            emit(Line(stage.name, "error", False, note=f"cannot run: {type(exc).__name__}: {exc}"))
            continue
        for check in checks:
            covered.add(check.name)
            try:
                emit(compare(check, ref))
            except KeyError as exc:
                emit(Line(check.name, "error", False, note=str(exc)))
    if not only:
        for name in ref.outputs():
            if name not in covered:
                emit(Line(name, "unchecked", False, note="recorded, but no stage checks it"))
    return lines


def mkl_intel_path() -> bool | None:
    """Whether Intel MKL, behind torch's CPU FFT and matrix products, runs its Intel code path.

    The fixtures were made on an Intel CPU. On another vendor's CPU, MKL takes a different code
    path whatever its settings say, and its rounding differs: ill-conditioned outputs then differ
    from the reference data by their own conditioning (measured on an AMD EPYC: CosyVoice's
    log-mel at near-floor bins by 9e-3, CosyVoice 2's NSF source by 3e-4, while upstream's code
    run on the same machine gives our bits exactly). None where torch's library exposes no MKL.

    MKL asks through the process's symbol table, so a library preloaded to force its Intel path
    (LD_PRELOAD) answers for it: that table is read first, torch's own library after it.
    """
    if not torch.backends.mkl.is_available():
        return None
    for library in (None, str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")):
        try:
            probe = ctypes.CDLL(library).mkl_serv_intel_cpu_true
        except (OSError, AttributeError):
            continue
        probe.restype = ctypes.c_int
        return bool(probe())
    return None


#: The codes of `mkl_cbwr_get_auto_branch` (MKL's conditional numerical reproducibility, mkl_cbwr.h).
_MKL_BRANCHES = {2: "compatible", 3: "sse2", 6: "ssse3", 7: "sse4_1", 8: "sse4_2", 9: "avx", 10: "avx2",
                 11: "avx512_mic", 12: "avx512", 13: "avx512_mic_e1", 14: "avx512_e1"}


def mkl_kernels() -> str | None:
    """Which of Intel MKL's kernel families torch's CPU matrix products and FFT run here, as MKL's
    reproducibility branches name them: "compatible" on its generic path (another vendor's CPU),
    else the Intel path's instruction set ("avx2", "avx512_e1", ...). Results round per family;
    None where torch's library exposes no MKL."""
    if not torch.backends.mkl.is_available():
        return None
    try:
        probe = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")).mkl_serv_cbwr_get_auto_branch
    except (OSError, AttributeError):
        return None
    probe.restype = ctypes.c_int
    return _MKL_BRANCHES.get(probe(), "unknown")


def run_cli(engine: str, folder: str, only: str | None, threads: int, out: TextIO) -> int:
    """The CLI's exit status: 0 when every line passed, 1 otherwise."""
    torch.set_num_threads(threads)
    lines = check_reference(engine, folder, only, out)
    failed = [line for line in lines if not line.passed]
    if failed and mkl_intel_path() is False:
        print("note: the math library (Intel MKL) runs its non-Intel code path on this CPU, so outputs "
              "that are sensitive to rounding can differ from reference data made on an Intel CPU", file=out)
    print(f"{len(lines) - len(failed)} passed, {len(failed)} failed ({engine}, {folder})", file=out)
    return 1 if failed or not lines else 0
