"""The suite's one allowance for the CPU (issue 31): where Intel MKL itself rounds otherwise.

Intel MKL, behind torch's CPU matrix products and FFT, picks its kernels by the CPU: its Intel
code path with the widest instruction set there, or a generic path on another vendor's CPU
(`mkl_kernels`), and each family rounds differently. The suite's own results never depend on
it: every comparison within a run has its reference computed with the same kernels and thread
settings. Only reference data recorded elsewhere can: the CosyVoice fixtures were made on an
Intel CPU (which instruction set is not recorded), and where MKL runs other kernels, outputs
that are ill-conditioned in float32 differ from them by their own conditioning (upstream's code
run on the same machine gives our bits exactly). Measured on an AMD EPYC (Zen 5): every check
passes as it stands with MKL forced onto its Intel path (AVX-512 kernels, "avx512_e1"); the log-mel
differs on the generic path ("compatible") and on the Intel path's AVX2 kernels ("avx2").
"""
from __future__ import annotations

from mizuoto_runtime.app.reference_check import mkl_kernels

#: CosyVoice reference checks that are ill-conditioned in float32: the log-mel at near-floor bins
#: (a one-ulp change of the input waveform moves them by ~5e-3) and CosyVoice 2's NSF source and
#: waveform (the source phase is a running sum of F0 over every sample).
COSYVOICE_ILL_CONDITIONED = frozenset({"features.out.mel", "features.out.prompt_feat", "vocoder.out.source",
                                       "vocoder.out.wav"})

#: MKL's kernels with which the CosyVoice data is matched as it stands (measured, see above).
COSYVOICE_DATA_KERNELS = frozenset({"avx512_e1"})


def may_differ_by_mkl_kernels(check: str) -> bool:
    """Whether reference check `check` may differ from the CosyVoice data here: an
    ill-conditioned output, with MKL running other kernels than those that match the data."""
    return check in COSYVOICE_ILL_CONDITIONED and mkl_kernels() not in COSYVOICE_DATA_KERNELS
