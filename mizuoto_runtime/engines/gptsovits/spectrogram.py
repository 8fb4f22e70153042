"""The linear spectrogram SoVITS' reference encoder reads (upstream's
``module/mel_processing.spectrogram_torch``): reflect padding of (n_fft - hop) / 2 each side,
``center=False``, a periodic Hann window, magnitude ``sqrt(re² + im² + 1e-8)``, no log."""
from __future__ import annotations

import torch
from torch.nn import functional as F


def spectrogram(wav: torch.Tensor, n_fft: int, hop: int, win: int) -> torch.Tensor:
    """wav [B, N] → [B, n_fft/2 + 1, frames]."""
    pad = (n_fft - hop) // 2
    y = F.pad(wav.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    window = torch.hann_window(win, dtype=wav.dtype, device=wav.device)
    spec = torch.stft(y, n_fft, hop_length=hop, win_length=win, window=window, center=False, normalized=False,
                      onesided=True, return_complex=True)
    return torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-8)
