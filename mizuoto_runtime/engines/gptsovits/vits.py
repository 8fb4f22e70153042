"""GPT-SoVITS's SoVITS synthesizer (v2 / v2Pro / v2ProPlus inference path), written from reading
upstream's ``module/models.py``, ``modules.py``, ``attentions.py``, ``mrte_model.py`` and
``core_vq.py`` (MIT).

What runs: the SSL projection and the one-codebook quantizer (reference → prompt codes, and
codes → 768-d features); the text encoder (relative-position attention over the upsampled
codes and over the phonemes, joined by MRTE cross-attention with the reference's global
embedding ``ge``); the flow (4 mean-only coupling layers with WaveNet blocks, run reversed);
the HiFi-GAN decoder; and the reference encoder (``MelStyleEncoder``) giving ``ge`` from the
first 704 bins of a linear spectrogram. v2Pro adds ``sv_emb`` (speaker-verification embedding →
gin), a PReLU and ``ge_to512`` for MRTE. Module and parameter names follow the published
``.pth`` so its ``weight`` dict loads as is, once legacy weight norm (``weight_g`` /
``weight_v``) is folded into plain ``weight`` (`fold_weight_norm`): nothing here uses weight norm
at run time, so every conv is a plain layer to the streamer (M13).

The posterior encoder ``enc_q`` is training-only (the published files leave it out) and is
not built.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ...nn.hifigan import LRELU_SLOPE, ResBlock1, ResBlock2, resblock_mean
from ...nn.wavenet import WaveNet
from .config import VitsConfig

V2_SYMBOLS = 732  # len(symbols2): the v2 phoneme set (v1's 322 is not supported)


def sequence_mask(length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, T] ones: one unpadded sequence."""
    return torch.ones(1, 1, length, device=device, dtype=dtype)


class ChannelNorm(nn.Module):
    """LayerNorm over channels of [B, C, T] (upstream's ``modules.LayerNorm``: gamma / beta)."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, -1)
        return F.layer_norm(x, (x.shape[-1],), self.gamma, self.beta, self.eps).transpose(1, -1)


class RelativeAttention(nn.Module):
    """Multi-head attention over [B, C, T] with 1x1 convs, and (with a window) learned relative
    position embeddings for keys and values shared by the heads (VITS' attentions.py)."""

    def __init__(self, channels: int, out_channels: int, heads: int, window: int | None) -> None:
        super().__init__()
        self.heads = heads
        self.window = window
        self.k_channels = channels // heads
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, out_channels, 1)
        if window is not None:
            self.emb_rel_k = nn.Parameter(torch.zeros(1, 2 * window + 1, self.k_channels))
            self.emb_rel_v = nn.Parameter(torch.zeros(1, 2 * window + 1, self.k_channels))

    def forward(self, x: torch.Tensor, c: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.conv_q(x), self.conv_k(c), self.conv_v(c)
        b, d, t_s = k.shape
        t_t = q.shape[2]
        q = q.view(b, self.heads, self.k_channels, t_t).transpose(2, 3)
        k = k.view(b, self.heads, self.k_channels, t_s).transpose(2, 3)
        v = v.view(b, self.heads, self.k_channels, t_s).transpose(2, 3)
        scaled = q / math.sqrt(self.k_channels)
        scores = torch.matmul(scaled, k.transpose(-2, -1))
        if self.window is not None:
            rel_k = self._relative(self.emb_rel_k, t_s)
            scores = scores + _relative_to_absolute(torch.matmul(scaled, rel_k.unsqueeze(0).transpose(-2, -1)))
        scores = scores.masked_fill(mask == 0, -1e4)
        p = F.softmax(scores, dim=-1)
        out = torch.matmul(p, v)
        if self.window is not None:
            out = out + torch.matmul(_absolute_to_relative(p), self._relative(self.emb_rel_v, t_s).unsqueeze(0))
        return self.conv_o(out.transpose(2, 3).contiguous().view(b, d, t_t))

    def _relative(self, table: torch.Tensor, length: int) -> torch.Tensor:
        """The 2*length-1 relative positions' embeddings, zero outside the window."""
        assert self.window is not None
        pad = max(length - (self.window + 1), 0)
        start = max((self.window + 1) - length, 0)
        if pad > 0:
            table = F.pad(table, (0, 0, pad, pad))
        return table[:, start:start + 2 * length - 1]


def _relative_to_absolute(x: torch.Tensor) -> torch.Tensor:
    """[b, h, l, 2l-1] relative logits → [b, h, l, l] (the pad-and-reshape skew)."""
    b, h, n, _ = x.shape
    x = F.pad(x, (0, 1)).view(b, h, n * 2 * n)
    x = F.pad(x, (0, n - 1))
    return x.view(b, h, n + 1, 2 * n - 1)[:, :, :n, n - 1:]


def _absolute_to_relative(x: torch.Tensor) -> torch.Tensor:
    """[b, h, l, l] → [b, h, l, 2l-1] (the inverse skew)."""
    b, h, n, _ = x.shape
    x = F.pad(x, (0, n - 1)).view(b, h, n * n + n * (n - 1))
    x = F.pad(x, (n, 0))
    return x.view(b, h, n, 2 * n)[:, :, :, 1:]


class FFN(nn.Module):
    def __init__(self, channels: int, filter_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size)

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel_size == 1:
            return x
        return F.pad(x, ((self.kernel_size - 1) // 2, self.kernel_size // 2))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv_1(self._pad(x * mask)))
        return self.conv_2(self._pad(x * mask)) * mask


class AttentionEncoder(nn.Module):
    """Post-norm transformer over [B, C, T] with relative attention (window 4)."""

    def __init__(self, channels: int, filter_channels: int, heads: int, layers: int, kernel_size: int) -> None:
        super().__init__()
        self.attn_layers = nn.ModuleList(RelativeAttention(channels, channels, heads, 4) for _ in range(layers))
        self.norm_layers_1 = nn.ModuleList(ChannelNorm(channels) for _ in range(layers))
        self.ffn_layers = nn.ModuleList(FFN(channels, filter_channels, kernel_size) for _ in range(layers))
        self.norm_layers_2 = nn.ModuleList(ChannelNorm(channels) for _ in range(layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attn_mask = mask.unsqueeze(2) * mask.unsqueeze(-1)
        x = x * mask
        for attn, norm1, ffn, norm2 in zip(self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2):
            x = norm1(x + attn(x, x, attn_mask))
            x = norm2(x + ffn(x, mask))
        return x * mask


class MRTE(nn.Module):
    """Multi-reference timbre encoder: content (192) attends to the phonemes (192), both lifted to
    512; the global embedding is added at 512 (hence v2's gin 512, v2Pro's ``ge_to512``)."""

    def __init__(self, content: int = 192, hidden: int = 512, heads: int = 4) -> None:
        super().__init__()
        self.cross_attention = RelativeAttention(hidden, hidden, heads, None)
        self.c_pre = nn.Conv1d(content, hidden, 1)
        self.text_pre = nn.Conv1d(content, hidden, 1)
        self.c_post = nn.Conv1d(hidden, content, 1)

    def forward(self, ssl: torch.Tensor, ssl_mask: torch.Tensor, text: torch.Tensor, text_mask: torch.Tensor,
                ge: torch.Tensor) -> torch.Tensor:
        attn_mask = text_mask.unsqueeze(2) * ssl_mask.unsqueeze(-1)
        ssl = self.c_pre(ssl * ssl_mask)
        text = self.text_pre(text * text_mask)
        x = self.cross_attention(ssl * ssl_mask, text * text_mask, attn_mask) + ssl + ge
        return self.c_post(x * ssl_mask)


class TextEncoder(nn.Module):
    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        h = cfg.hidden_channels
        self.out_channels = cfg.inter_channels
        self.ssl_proj = nn.Conv1d(768, h, 1)
        self.encoder_ssl = AttentionEncoder(h, cfg.filter_channels, cfg.n_heads, cfg.n_layers // 2, cfg.kernel_size)
        self.encoder_text = AttentionEncoder(h, cfg.filter_channels, cfg.n_heads, cfg.n_layers, cfg.kernel_size)
        self.text_embedding = nn.Embedding(V2_SYMBOLS, h)
        self.mrte = MRTE()
        self.encoder2 = AttentionEncoder(h, cfg.filter_channels, cfg.n_heads, cfg.n_layers // 2, cfg.kernel_size)
        self.proj = nn.Conv1d(h, cfg.inter_channels * 2, 1)

    def forward(self, features: torch.Tensor, text: torch.Tensor, ge: torch.Tensor, speed: float = 1.0
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """features [1, 768, T] (upsampled codes), text [1, Tph] → (x, m_p, logs_p, mask)."""
        y_mask = sequence_mask(features.shape[2], features.device, features.dtype)
        y = self.ssl_proj(features * y_mask) * y_mask
        y = self.encoder_ssl(y * y_mask, y_mask)
        text_mask = sequence_mask(text.shape[1], features.device, y.dtype)
        t = self.text_embedding(text).transpose(1, 2)
        t = self.encoder_text(t * text_mask, text_mask)
        y = self.mrte(y, y_mask, t, text_mask, ge)
        y = self.encoder2(y * y_mask, y_mask)
        x = y
        if speed != 1:
            y = F.interpolate(y, size=int(y.shape[-1] / speed) + 1, mode="linear")
            y_mask = F.interpolate(y_mask, size=y.shape[-1], mode="nearest")
        m, logs = torch.split(self.proj(y) * y_mask, self.out_channels, dim=1)
        return x, m, logs, y_mask


class CouplingLayer(nn.Module):
    """Mean-only affine coupling: the second half moves by a WaveNet of the first."""

    def __init__(self, channels: int, hidden: int, kernel_size: int, layers: int, gin: int) -> None:
        super().__init__()
        self.half = channels // 2
        self.pre = nn.Conv1d(self.half, hidden, 1)
        self.enc = WaveNet(hidden, kernel_size, layers, gin)
        self.post = nn.Conv1d(hidden, self.half, 1)

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
        x0, x1 = torch.split(x, [self.half] * 2, 1)
        h = self.enc(self.pre(x0) * mask, mask, g)
        m = self.post(h) * mask
        logs = torch.zeros_like(m)
        x1 = (x1 - m) * torch.exp(-logs) * mask
        return torch.cat([x0, x1], 1)


class Flip(nn.Module):
    def reverse(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
        return torch.flip(x, [1])


class Flow(nn.Module):
    def __init__(self, channels: int, hidden: int, gin: int, n_flows: int = 4) -> None:
        super().__init__()
        self.flows = nn.ModuleList()
        for _ in range(n_flows):
            self.flows.append(CouplingLayer(channels, hidden, 5, 4, gin))
            self.flows.append(Flip())

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
        for flow in reversed(self.flows):
            x = flow.reverse(x, mask, g)
        return x


class Generator(nn.Module):
    """HiFi-GAN: conv_pre (+ cond), upsampling stages each followed by the mean of its resblocks,
    a final leaky ReLU with slope 0.01 (torch's default), conv_post without bias, tanh."""

    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        c0 = cfg.upsample_initial_channel
        self.num_kernels = len(cfg.resblock_kernel_sizes)
        self.conv_pre = nn.Conv1d(cfg.inter_channels, c0, 7, 1, padding=3)
        block = ResBlock1 if cfg.resblock == "1" else ResBlock2
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(c0 // 2 ** i, c0 // 2 ** (i + 1), k, u, padding=(k - u) // 2)
            for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes)))
        self.resblocks = nn.ModuleList(
            block(c0 // 2 ** (i + 1), k, d)
            for i in range(len(self.ups)) for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes))
        self.conv_post = nn.Conv1d(c0 // 2 ** len(self.ups), 1, 7, 1, padding=3, bias=False)
        self.cond = nn.Conv1d(cfg.gin_channels, c0, 1) if cfg.gin_channels else None

    def forward(self, x: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
        x = self.conv_pre(x)
        if g is not None and self.cond is not None:
            x = x + self.cond(g)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE))
            x = resblock_mean(self.resblocks[i * self.num_kernels:(i + 1) * self.num_kernels], x)
        return torch.tanh(self.conv_post(F.leaky_relu(x)))


class _Linear(nn.Module):
    """upstream's ``LinearNorm`` wrapper (key ``<name>.fc``)."""

    def __init__(self, i: int, o: int) -> None:
        super().__init__()
        self.fc = nn.Linear(i, o)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class _Mish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.tanh(F.softplus(x))


class _ConvGLU(nn.Module):
    """Residual conv + GLU (key ``<name>.conv1.conv``)."""

    def __init__(self, ch: int, kernel: int) -> None:
        super().__init__()
        self.conv1 = nn.Module()
        self.conv1.conv = nn.Conv1d(ch, 2 * ch, kernel, padding=(kernel - 1) // 2)
        self.ch = ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = torch.split(self.conv1.conv(x), self.ch, dim=1)
        return x + a * torch.sigmoid(b)


class _StyleAttention(nn.Module):
    """The reference encoder's self-attention (``w_qs`` / ``w_ks`` / ``w_vs`` / ``fc``), scores
    divided by sqrt(d_model), residual added."""

    def __init__(self, heads: int, d_model: int) -> None:
        super().__init__()
        self.heads = heads
        self.d_k = d_model // heads
        self.temperature = d_model ** 0.5
        self.w_qs = nn.Linear(d_model, d_model)
        self.w_ks = nn.Linear(d_model, d_model)
        self.w_vs = nn.Linear(d_model, d_model)
        self.fc = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, self.d_k).permute(2, 0, 1, 3).contiguous().view(-1, n, self.d_k)

        q, k, v = heads(self.w_qs(x)), heads(self.w_ks(x)), heads(self.w_vs(x))
        attn = torch.bmm(q, k.transpose(1, 2)) / self.temperature
        attn = torch.softmax(attn.masked_fill(mask.repeat(self.heads, 1, 1), -math.inf), dim=2)
        out = torch.bmm(attn, v).view(self.heads, b, n, self.d_k).permute(1, 2, 0, 3).contiguous().view(b, n, -1)
        return self.fc(out) + x


class MelStyleEncoder(nn.Module):
    """Reference encoder: spectrogram frames → one global embedding [B, gin, 1]."""

    def __init__(self, n_bins: int, out_dim: int, hidden: int = 128, kernel: int = 5, heads: int = 2) -> None:
        super().__init__()
        self.spectral = nn.Sequential(_Linear(n_bins, hidden), _Mish(), nn.Identity(), _Linear(hidden, hidden),
                                      _Mish(), nn.Identity())
        self.temporal = nn.Sequential(_ConvGLU(hidden, kernel), _ConvGLU(hidden, kernel))
        self.slf_attn = _StyleAttention(heads, hidden)
        self.fc = _Linear(hidden, out_dim)

    def forward(self, spec: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = spec.transpose(1, 2)
        pad = (mask.int() == 0).squeeze(1)  # True = padding
        attn_mask = pad.unsqueeze(1).expand(-1, x.shape[1], -1)
        x = self.spectral(x)
        x = self.temporal(x.transpose(1, 2)).transpose(1, 2)
        x = x.masked_fill(pad.unsqueeze(-1), 0)
        x = self.fc(self.slf_attn(x, attn_mask))
        count = (~pad).sum(dim=1).unsqueeze(1)
        x = x.masked_fill(pad.unsqueeze(-1), 0)
        w = torch.div(x.float(), count.unsqueeze(1)).sum(dim=1).to(x.dtype)
        return w.unsqueeze(-1)


class Codebook(nn.Module):
    def __init__(self, bins: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("embed", torch.zeros(bins, dim))


class _VQ(nn.Module):
    def __init__(self, bins: int, dim: int) -> None:
        super().__init__()
        self._codebook = Codebook(bins, dim)


class _RVQ(nn.Module):
    def __init__(self, bins: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_VQ(bins, dim)])


class Quantizer(nn.Module):
    """One Euclidean codebook of 1024 x 768 (key ``vq.layers.0._codebook.embed``)."""

    def __init__(self, dim: int = 768, bins: int = 1024) -> None:
        super().__init__()
        self.vq = _RVQ(bins, dim)

    @property
    def embed(self) -> torch.Tensor:
        return self.vq.layers[0]._codebook.embed

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """[B, 768, T] → [1, B, T] codes (nearest codebook row)."""
        b, d, t = x.shape
        flat = x.transpose(1, 2).reshape(-1, d)
        e = self.embed.t()
        dist = -(flat.pow(2).sum(1, keepdim=True) - 2 * flat @ e + e.pow(2).sum(0, keepdim=True))
        return dist.max(dim=-1).indices.view(b, t).unsqueeze(0)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """[1, B, T] codes → [B, 768, T]."""
        return F.embedding(codes[0], self.embed).transpose(1, 2)


class Synthesizer(nn.Module):
    """SoVITS at inference: `extract_latent` (SSL → codes) and `decode` (codes + phonemes +
    reference spectrogram → waveform)."""

    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.enc_p = TextEncoder(cfg)
        self.dec = Generator(cfg)
        self.flow = Flow(cfg.inter_channels, cfg.hidden_channels, cfg.gin_channels)
        self.ref_enc = MelStyleEncoder(704, cfg.gin_channels)
        self.ssl_proj = nn.Conv1d(768, 768, 2, stride=2)
        self.quantizer = Quantizer()
        if cfg.is_pro:
            self.sv_emb = nn.Linear(cfg.sv_dim, cfg.gin_channels)
            self.ge_to512 = nn.Linear(cfg.gin_channels, 512)
            self.prelu = nn.PReLU(num_parameters=cfg.gin_channels)

    def memory_units(self) -> list[nn.Module]:
        """M12: the decoder's upsampling stages and resblocks, the flow's couplings and the
        text encoder's blocks move one by one; the rest is the fixed part."""
        return [*self.enc_p.children(), *(f for f in self.flow.flows if isinstance(f, CouplingLayer)),
                self.dec.conv_pre, *self.dec.ups, *self.dec.resblocks]

    def extract_latent(self, ssl: torch.Tensor) -> torch.Tensor:
        """SSL features [1, 768, T] (50 Hz) → prompt codes [1, 1, T/2] (25 Hz)."""
        return self.quantizer.encode(self.ssl_proj(ssl)).transpose(0, 1)

    def reference_embedding(self, spec: torch.Tensor, sv: torch.Tensor | None) -> torch.Tensor:
        """ge [1, gin, 1] from one reference's spectrogram [1, 1025, T] (+ v2Pro's SV embedding)."""
        mask = sequence_mask(spec.shape[2], spec.device, spec.dtype)
        ge = self.ref_enc(spec[:, :704] * mask, mask)
        if self.cfg.is_pro:
            if sv is None:
                raise ValueError(f"a {self.cfg.version} model needs the speaker embedding of each reference")
            ge = self.prelu(ge + self.sv_emb(sv).unsqueeze(-1))
        return ge

    def global_embedding(self, specs: list[torch.Tensor], svs: list[torch.Tensor] | None) -> torch.Tensor:
        ges = [self.reference_embedding(s, svs[i] if svs is not None else None) for i, s in enumerate(specs)]
        return torch.stack(ges, 0).mean(0)

    def prior(self, codes: torch.Tensor, text: torch.Tensor, ge: torch.Tensor, speed: float = 1.0
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """codes [1, 1, T] → (x, m_p, logs_p, mask) at 50 Hz (codes repeated x2)."""
        quantized = self.quantizer.decode(codes)
        quantized = F.interpolate(quantized, size=int(quantized.shape[-1] * 2), mode="nearest")
        ge_text = self.ge_to512(ge.transpose(2, 1)).transpose(2, 1) if self.cfg.is_pro else ge
        return self.enc_p(quantized, text, ge_text, speed)

    def synthesize(self, m_p: torch.Tensor, logs_p: torch.Tensor, mask: torch.Tensor, noise: torch.Tensor,
                   noise_scale: float, ge: torch.Tensor) -> torch.Tensor:
        z_p = m_p + noise * torch.exp(logs_p) * noise_scale
        z = self.flow.reverse(z_p, mask, ge)
        return self.dec(z * mask, ge)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, text: torch.Tensor, specs: list[torch.Tensor],
               svs: list[torch.Tensor] | None = None, noise_scale: float = 0.5, speed: float = 1.0) -> torch.Tensor:
        """Upstream's ``SynthesizerTrn.decode``: its one RNG draw is ``randn_like(m_p)`` from torch's
        global RNG, after ge and the prior."""
        ge = self.global_embedding(specs, svs)
        _, m_p, logs_p, mask = self.prior(codes, text, ge, speed)
        return self.synthesize(m_p, logs_p, mask, torch.randn_like(m_p), noise_scale, ge)
