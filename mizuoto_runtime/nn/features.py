"""Spectral features on ``torch.stft`` / ``torch.fft`` (no torchaudio, no librosa at run time).

- `mel_filterbank`: librosa's ``filters.mel`` (Slaney mel scale and area norm, or HTK), the
  float32 rounding included (librosa fills a float32 array and scales it in place).
- `mel_spectrogram`: Matcha-TTS / HiFi-GAN's ``mel_spectrogram``: reflect pad
  ``(n_fft - hop) / 2`` on both sides, periodic Hann window, magnitude
  ``sqrt(re^2 + im^2 + 1e-9)``, mel projection, ``log(clamp(x, 1e-5))``.
- `kaldi_fbank`: torchaudio's ``compliance.kaldi.fbank`` with its defaults (25 ms frames every
  10 ms, snip edges, DC removal, pre-emphasis 0.97, Povey window, FFT size rounded up to a power
  of two, power spectrum, log of the mel energies floored at float epsilon), as CAM++ and
  other speaker encoders take it.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

# ---- mel scale (librosa) -----------------------------------------------------------------------
_F_SP = 200.0 / 3
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = math.log(6.4) / 27.0


def hz_to_mel(hz: np.ndarray, htk: bool = False) -> np.ndarray:
    hz = np.asanyarray(hz, dtype=np.float64)
    if htk:
        return 2595.0 * np.log10(1.0 + hz / 700.0)
    mels = hz / _F_SP
    log_t = hz >= _MIN_LOG_HZ
    return np.where(log_t, _MIN_LOG_MEL + np.log(np.maximum(hz, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOGSTEP, mels)


def mel_to_hz(mels: np.ndarray, htk: bool = False) -> np.ndarray:
    mels = np.asanyarray(mels, dtype=np.float64)
    if htk:
        return 700.0 * (10.0 ** (mels / 2595.0) - 1.0)
    freqs = _F_SP * mels
    return np.where(mels >= _MIN_LOG_MEL, _MIN_LOG_HZ * np.exp(_LOGSTEP * (mels - _MIN_LOG_MEL)), freqs)


@functools.lru_cache(maxsize=16)
def _mel_filterbank_np(sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float | None,
                       htk: bool, slaney_norm: bool) -> np.ndarray:
    fmax = float(sample_rate) / 2 if fmax is None else fmax
    weights = np.zeros((n_mels, 1 + n_fft // 2), dtype=np.float32)
    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sample_rate)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(fmin, htk), hz_to_mel(fmax, htk), n_mels + 2), htk)
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    if slaney_norm:
        enorm = 2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels])
        weights *= enorm[:, np.newaxis]
    return weights


def mel_filterbank(sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None,
                   *, htk: bool = False, slaney_norm: bool = True) -> torch.Tensor:
    """``(n_mels, n_fft // 2 + 1)`` float32 triangular filters, as ``librosa.filters.mel``."""
    return torch.from_numpy(_mel_filterbank_np(sample_rate, n_fft, n_mels, float(fmin),
                                               None if fmax is None else float(fmax), htk, slaney_norm).copy())


def mel_spectrogram(wav: torch.Tensor, *, n_fft: int, num_mels: int, sampling_rate: int, hop_size: int,
                    win_size: int, fmin: float = 0.0, fmax: float | None = None, center: bool = False) -> torch.Tensor:
    """Log mel spectrogram ``(batch, num_mels, frames)`` of `wav` ``(batch, samples)`` (Matcha's)."""
    if wav.dim() == 1:
        wav = wav.unsqueeze(0)
    basis = mel_filterbank(sampling_rate, n_fft, num_mels, fmin, fmax).to(wav.device)
    window = torch.hann_window(win_size, device=wav.device)
    pad = int((n_fft - hop_size) / 2)
    y = F.pad(wav.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    spec = torch.stft(y, n_fft, hop_length=hop_size, win_length=win_size, window=window, center=center,
                      pad_mode="reflect", normalized=False, onesided=True, return_complex=True)
    spec = torch.view_as_real(spec)
    spec = torch.sqrt(spec.pow(2).sum(-1) + 1e-9)
    spec = torch.matmul(basis, spec)
    return torch.log(torch.clamp(spec, min=1e-5))


# ---- kaldi fbank -------------------------------------------------------------------------------
def _kaldi_mel(freq: torch.Tensor) -> torch.Tensor:
    return 1127.0 * torch.log(1.0 + freq / 700.0)


def kaldi_mel_banks(num_bins: int, padded_window: int, sample_rate: float, low_freq: float,
                    high_freq: float) -> torch.Tensor:
    """``(num_bins, padded_window // 2 + 1)`` kaldi triangular mel filters (last column zero)."""
    num_fft_bins = padded_window // 2
    nyquist = 0.5 * sample_rate
    if high_freq <= 0.0:
        high_freq += nyquist
    if not 0.0 <= low_freq < high_freq <= nyquist:
        raise ValueError(f"kaldi fbank: bad frequency range {low_freq}..{high_freq} for rate {sample_rate}")
    fft_bin_width = sample_rate / padded_window
    mel_low, mel_high = 1127.0 * math.log(1.0 + low_freq / 700.0), 1127.0 * math.log(1.0 + high_freq / 700.0)
    delta = (mel_high - mel_low) / (num_bins + 1)
    b = torch.arange(num_bins).unsqueeze(1)
    left = mel_low + b * delta
    center = mel_low + (b + 1.0) * delta
    right = mel_low + (b + 2.0) * delta
    mel = _kaldi_mel(fft_bin_width * torch.arange(num_fft_bins)).unsqueeze(0)
    up = (mel - left) / (center - left)
    down = (right - mel) / (right - center)
    banks = torch.max(torch.zeros(1), torch.min(up, down))
    return F.pad(banks, (0, 1), mode="constant", value=0)


def kaldi_fbank(wav: torch.Tensor, *, num_mel_bins: int = 23, sample_frequency: float = 16000.0,
                frame_length_ms: float = 25.0, frame_shift_ms: float = 10.0, preemphasis: float = 0.97,
                low_freq: float = 20.0, high_freq: float = 0.0) -> torch.Tensor:
    """Log mel filterbank ``(frames, num_mel_bins)`` of `wav` ``(1, samples)`` or ``(samples,)``,
    as torchaudio's ``kaldi.fbank`` with dither 0 and its other defaults."""
    wav = wav.reshape(-1)
    dtype, device = wav.dtype, wav.device
    window_size = int(sample_frequency * frame_length_ms * 0.001)
    shift = int(sample_frequency * frame_shift_ms * 0.001)
    padded = 1 << (window_size - 1).bit_length()
    if wav.numel() < window_size:
        raise ValueError(f"kaldi fbank: {wav.numel()} samples, fewer than one {window_size}-sample frame")
    frames = 1 + (wav.numel() - window_size) // shift
    x = wav.as_strided((frames, window_size), (shift * wav.stride(0), wav.stride(0)))
    x = x - torch.mean(x, dim=1, keepdim=True)
    previous = F.pad(x.unsqueeze(0), (1, 0), mode="replicate").squeeze(0)
    x = x - preemphasis * previous[:, :-1]
    window = torch.hann_window(window_size, periodic=False, device=device, dtype=dtype).pow(0.85)
    x = F.pad(x * window.unsqueeze(0), (0, padded - window_size), mode="constant", value=0)
    spectrum = torch.fft.rfft(x).abs().pow(2.0)
    banks = kaldi_mel_banks(num_mel_bins, padded, sample_frequency, low_freq, high_freq).to(device=device, dtype=dtype)
    energies = torch.mm(spectrum, banks.T)
    return torch.max(energies, torch.tensor(torch.finfo(dtype).eps, device=device, dtype=dtype)).log()
