"""CosyVoice's HiFT vocoder (issue 22; M43): neural source filter + iSTFT HiFi-GAN.

``HiFTGenerator`` (CosyVoice 2, non-causal convolutions) and ``CausalHiFTGenerator``
(CosyVoice 3, causal convolutions, its F0 predictor run in float64 as upstream does). Weight
norm is folded at load (`mizuoto_runtime.nn.weight_norm`); parameter names are upstream's with
``.weight`` in place of the parametrization pair.

The source (`SineSource`): F0 from the predictor, upsampled by ``prod(upsample_rates) * hop``,
harmonics ``k * f0`` (k = 1..9), phase by cumulative sum at the frame rate and interpolated
back up (linear for CosyVoice 2, nearest for 3), voiced where ``f0 > 10``, then
``tanh(Linear(9 -> 1)(sines * 0.1 * uv + noise))``. Random numbers, as upstream:
- CosyVoice 2 draws at every call from the global generator, in this order:
  ``rand(1, 9)`` initial phases (harmonic 0 zeroed), ``randn`` noise like the sines, then
  ``randn`` like uv (drawn and unused).
- CosyVoice 3 uses fixed buffers drawn once while upstream builds the model (`FixedSource`).

The waveform depends on the phase carried through every sample, so the vocoder cannot be
tiled over time: it runs whole (no tiled fallback).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...nn.conv import CausalConv1d
from ...nn.hifigan import ResBlock1, resblock_mean
from ...nn.snake import Snake

HARMONICS = 8  # nb_harmonics: 9 sines in all
SAMPLE_RATE = 24000


def periodic_hann(n: int) -> torch.Tensor:
    """scipy's ``get_window("hann", n, fftbins=True)`` (cosine sum over ``linspace(-pi, pi)`` in
    float64), cast to float32 as upstream does."""
    fac = np.linspace(-np.pi, np.pi, n + 1)
    w = np.zeros(n + 1)
    for k, a in enumerate((0.5, 0.5)):
        w += a * np.cos(k * fac)
    return torch.from_numpy(w[:-1].astype(np.float32))


class CausalConv1dUpsample(CausalConv1d):
    """Nearest-neighbour upsampling by `stride`, then a causal conv (``kernel_size - 1`` zeros)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size)
        self.stride_up = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.interpolate(x, scale_factor=float(self.stride_up), mode="nearest"))


class F0Predictor(nn.Module):
    """``ConvRNNF0Predictor`` (5 convs k=3, ELU) or its causal form (first conv looks 3 frames
    ahead, the others look back); ``f0 = |Linear(condnet(mel))|``."""

    def __init__(self, in_channels: int, cond_channels: int, causal: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(5):
            inp = in_channels if i == 0 else cond_channels
            if causal:
                layers.append(CausalConv1d(inp, cond_channels, 4 if i == 0 else 3, right=i == 0))
            else:
                layers.append(nn.Conv1d(inp, cond_channels, kernel_size=3, padding=1))
            layers.append(nn.ELU())
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.abs(self.classifier(self.condnet(x).transpose(1, 2)).squeeze(-1))


class FixedSource:
    """CosyVoice 3's fixed random buffers, drawn as upstream's model construction draws them:
    seed 0, the flow noise ``randn(1, 80, 15000)``, the default inits of
    ``flow.input_embedding`` and ``flow.spk_embed_affine_layer``, of the F0 predictor's five
    causal convs and its classifier, then ``rand(1, 9)`` (phases), ``rand(1, 7200000, 9)``
    (noise), the init of ``Linear(9, 1)``, ``rand(1, 7200000, 1)`` (uv noise). The values depend
    on those module sizes (read from the config). Only the prefix a call needs is kept."""

    SAMPLES = 300 * 24000
    CHUNK = 1 << 20

    def __init__(self, flow_vocab: int, flow_input: int, spk_dim: int, mel: int, cond_channels: int) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            torch.randn([1, 80, 50 * 300])
            nn.Embedding(flow_vocab, flow_input)
            nn.Linear(spk_dim, 80)
            F0Predictor(mel, cond_channels, causal=True)
            rand_ini = torch.rand(1, HARMONICS + 1)
            rand_ini[:, 0] = 0
            self.rand_ini = rand_ini
            self._sine_state = torch.get_rng_state()
            self._skip(self.SAMPLES * (HARMONICS + 1))
            nn.Linear(HARMONICS + 1, 1)
            self._uv_state = torch.get_rng_state()
        self._sine = torch.zeros(1, 0, HARMONICS + 1)
        self._uv = torch.zeros(1, 0, 1)

    def _skip(self, count: int) -> None:
        while count > 0:
            n = min(count, self.CHUNK)
            torch.rand(n)
            count -= n

    @staticmethod
    def _draw(state: torch.Tensor, samples: int, width: int) -> torch.Tensor:
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(state)
            return torch.rand(1, samples, width)

    def sine_waves(self, samples: int) -> torch.Tensor:
        if samples > self.SAMPLES:
            raise ValueError(f"HiFT: {samples} samples, more than the {self.SAMPLES} of the fixed noise")
        if self._sine.shape[1] < samples:
            self._sine = self._draw(self._sine_state, samples, HARMONICS + 1)
        return self._sine[:, :samples]

    def uv(self, samples: int) -> torch.Tensor:
        if samples > self.SAMPLES:
            raise ValueError(f"HiFT: {samples} samples, more than the {self.SAMPLES} of the fixed noise")
        if self._uv.shape[1] < samples:
            self._uv = self._draw(self._uv_state, samples, 1)
        return self._uv[:, :samples]


class SineSource(nn.Module):
    """``SourceModuleHnNSF`` with ``SineGen2`` (24 kHz)."""

    def __init__(self, upsample_scale: int, causal: bool, sine_amp: float = 0.1, noise_std: float = 0.003,
                 voiced_threshold: float = 10, fixed: FixedSource | None = None) -> None:
        super().__init__()
        self.upsample_scale = upsample_scale
        self.causal = causal
        self.sine_amp, self.noise_std, self.voiced_threshold = sine_amp, noise_std, voiced_threshold
        self.fixed = fixed
        self.l_linear = nn.Linear(HARMONICS + 1, 1)

    def _sines(self, f0_values: torch.Tensor) -> torch.Tensor:
        rad = (f0_values / SAMPLE_RATE) % 1
        if self.fixed is not None:
            ini = self.fixed.rand_ini.to(rad.device)
        else:
            ini = torch.rand(f0_values.shape[0], f0_values.shape[2], device=f0_values.device)
            ini[:, 0] = 0
        rad[:, 0, :] = rad[:, 0, :] + ini
        rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / self.upsample_scale, mode="linear").transpose(1, 2)
        phase = torch.cumsum(rad, dim=1) * 2 * np.pi
        phase = F.interpolate(phase.transpose(1, 2) * self.upsample_scale, scale_factor=self.upsample_scale,
                              mode="nearest" if self.causal else "linear").transpose(1, 2)
        return torch.sin(phase)

    def forward(self, f0: torch.Tensor) -> torch.Tensor:
        """Excitation ``(b, samples, 1)`` from the upsampled F0 ``(b, samples, 1)``."""
        harmonics = torch.arange(1, HARMONICS + 2, dtype=torch.float32, device=f0.device).view(1, 1, -1)
        with torch.no_grad():
            sines = self._sines(torch.multiply(f0, harmonics)) * self.sine_amp
            uv = (f0 > self.voiced_threshold).type(torch.float32)
            amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
            if self.fixed is not None:
                noise = amp * self.fixed.sine_waves(sines.shape[1]).to(sines.device)
            else:
                noise = amp * torch.randn_like(sines)
            sines = sines * uv + noise
        merged = torch.tanh(self.l_linear(sines))
        if self.fixed is None:
            torch.randn_like(uv)  # upstream draws the noise branch's randn here (unused at inference)
        return merged


@dataclasses.dataclass(frozen=True)
class HiFTSpec:
    causal: bool  # CosyVoice 3
    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    n_fft: int = 16
    hop_len: int = 4
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    conv_pre_look_right: int = 4
    f0_cond_channels: int = 512

    @property
    def upsample_scale(self) -> int:
        return int(np.prod(self.upsample_rates)) * self.hop_len


class HiFT(nn.Module):
    def __init__(self, spec: HiFTSpec, fixed: FixedSource | None = None) -> None:
        super().__init__()
        if spec.sampling_rate != SAMPLE_RATE or spec.nb_harmonics != HARMONICS:
            raise ValueError(f"HiFT: only the 24 kHz, 8-harmonic source is implemented, got "
                             f"{spec.sampling_rate} Hz, {spec.nb_harmonics} harmonics")
        if spec.causal and fixed is None:
            raise ValueError("HiFT: the causal generator needs its fixed source buffers")
        self.spec = spec
        base, causal = spec.base_channels, spec.causal
        self.m_source = SineSource(spec.upsample_scale, causal, spec.nsf_alpha, spec.nsf_sigma,
                                   spec.nsf_voiced_threshold, fixed if causal else None)
        self.conv_pre = (CausalConv1d(spec.in_channels, base, spec.conv_pre_look_right + 1, right=True) if causal
                         else nn.Conv1d(spec.in_channels, base, 7, 1, padding=3))
        self.ups = nn.ModuleList()
        for i, (u, k) in enumerate(zip(spec.upsample_rates, spec.upsample_kernel_sizes)):
            cin, cout = base // (2 ** i), base // (2 ** (i + 1))
            self.ups.append(CausalConv1dUpsample(cin, cout, k, u) if causal
                            else nn.ConvTranspose1d(cin, cout, k, u, padding=(k - u) // 2))
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        rates = [1] + list(spec.upsample_rates[::-1][:-1])
        cum = np.cumprod(rates)
        for i, (u, k, d) in enumerate(zip(cum[::-1], spec.source_resblock_kernel_sizes,
                                          spec.source_resblock_dilation_sizes)):
            u, ch = int(u), base // (2 ** (i + 1))
            if u == 1:
                down: nn.Module = (CausalConv1d(spec.n_fft + 2, ch, 1) if causal
                                   else nn.Conv1d(spec.n_fft + 2, ch, 1, 1))
            else:
                down = (CausalConv1d(spec.n_fft + 2, ch, u * 2, stride=u, padding=u - 1) if causal
                        else nn.Conv1d(spec.n_fft + 2, ch, u * 2, u, padding=u // 2))
            self.source_downs.append(down)
            self.source_resblocks.append(ResBlock1(ch, k, d, activation=Snake, causal=causal))
        self.resblocks = nn.ModuleList()
        ch = base
        for i in range(len(self.ups)):
            ch = base // (2 ** (i + 1))
            for k, d in zip(spec.resblock_kernel_sizes, spec.resblock_dilation_sizes):
                self.resblocks.append(ResBlock1(ch, k, d, activation=Snake, causal=causal))
        self.conv_post = (CausalConv1d(ch, spec.n_fft + 2, 7) if causal
                          else nn.Conv1d(ch, spec.n_fft + 2, 7, 1, padding=3))
        self.f0_predictor = F0Predictor(spec.in_channels, spec.f0_cond_channels, causal)
        if causal:  # upstream runs this predictor in float64 (and keeps it there)
            self.f0_predictor.to(torch.float64)
        self.register_buffer("stft_window", periodic_hann(spec.n_fft), persistent=False)

    def memory_units(self) -> list[nn.Module]:
        """The upsampling convs and the residual blocks (the F0 predictor, float64 in
        CosyVoice 3, and the small convs stay fixed)."""
        return [*self.ups, *self.source_resblocks, *self.resblocks]

    def f0(self, mel: torch.Tensor) -> torch.Tensor:
        """F0 per frame ``(b, frames)``; CosyVoice 3 computes it in float64, as upstream."""
        return self.f0_predictor(mel.to(self.f0_predictor.classifier.weight.dtype))

    def source(self, f0: torch.Tensor) -> torch.Tensor:
        """Excitation ``(b, 1, samples)`` from F0 ``(b, frames)``."""
        up = F.interpolate(f0[:, None], scale_factor=float(self.spec.upsample_scale), mode="nearest")
        return self.m_source(up.transpose(1, 2)).transpose(1, 2)

    def decode(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        spec_s = torch.view_as_real(torch.stft(s.squeeze(1), spec.n_fft, spec.hop_len, spec.n_fft,
                                               window=self.stft_window.to(s.device), return_complex=True))
        s_stft = torch.cat([spec_s[..., 0], spec_s[..., 1]], dim=1)
        x = self.conv_pre(x)
        kernels = len(spec.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, spec.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            x = resblock_mean(self.resblocks[i * kernels:(i + 1) * kernels], x)
        x = self.conv_post(F.leaky_relu(x))
        half = spec.n_fft // 2 + 1
        magnitude = torch.clip(torch.exp(x[:, :half, :]), max=1e2)
        phase = torch.sin(x[:, half:, :])
        wav = torch.istft(torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase)), spec.n_fft,
                          spec.hop_len, spec.n_fft, window=self.stft_window.to(magnitude.device))
        return torch.clamp(wav, -spec.audio_limit, spec.audio_limit)

    def forward(self, mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Waveform ``(b, samples)``, the source ``(b, 1, samples)`` and F0 ``(b, frames)``."""
        f0 = self.f0(mel)
        s = self.source(f0.to(mel.dtype))
        return self.decode(mel, s), s, f0
