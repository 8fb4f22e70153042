"""The suite's one allowance for the CPU vendor (issue 31): where Intel MKL itself rounds otherwise.

Intel MKL, behind torch's CPU matrix products and FFT, runs its Intel code path on an Intel CPU
and a generic one elsewhere (`mkl_intel_path`), and the two round differently. The suite's own
results never depend on it: every comparison within a run has its reference computed on the same
path with the same thread settings. Only reference data recorded elsewhere can: the CosyVoice
fixtures were made on an Intel CPU, and on the generic path outputs that are ill-conditioned in
float32 differ from them by their own conditioning (upstream's code run on the same machine gives
our bits exactly). Those checks, and only on the generic path, may differ within that bound.
"""
from __future__ import annotations

from mizuoto_runtime.reference_check import mkl_intel_path

#: CosyVoice reference checks that are ill-conditioned in float32: the log-mel at near-floor bins
#: (a one-ulp change of the input waveform moves them by ~5e-3) and CosyVoice 2's NSF source and
#: waveform (the source phase is a running sum of F0 over every sample).
COSYVOICE_ILL_CONDITIONED = frozenset({"features.out.mel", "features.out.prompt_feat", "vocoder.out.source",
                                       "vocoder.out.wav"})


def may_differ_by_mkl_path(check: str) -> bool:
    """Whether reference check `check` may differ from Intel-made data here: an ill-conditioned
    output, with MKL on its generic (non-Intel) path."""
    return check in COSYVOICE_ILL_CONDITIONED and mkl_intel_path() is False
