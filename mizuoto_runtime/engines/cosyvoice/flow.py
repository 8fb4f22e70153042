"""CosyVoice's flow: speech tokens -> mel, by conditional flow matching (issue 22; M18).

- CosyVoice 2 (``CausalMaskedDiffWithXvec``): token embedding -> `UpsampleConformerEncoder`
  (linear embed + rel-pos, `PreLookaheadLayer`, conformer layers, x2 nearest upsample + conv,
  a second embed and 4 more layers, final LayerNorm) -> ``encoder_proj`` to 80 channels.
- CosyVoice 3 (``CausalMaskedDiffWithDiT``): token embedding (80-d) -> `PreLookaheadLayer`
  -> each frame repeated ``token_mel_ratio`` times.

Then `CausalCFM`: fixed noise (upstream seeds the global RNG with 0 while building the model
and draws ``randn(1, 80, 15000)``; the first T frames are used), 10 Euler steps on the cosine
schedule ``t = 1 - cos(linspace(0, 1, 11) * pi/2)`` with the time and step accumulated as
upstream does, and classifier-free guidance: each step runs the estimator on a batch of two
(row 1 with mu, speaker and prompt condition zeroed; the same weights serve both halves, M18),
``v = 1.7 v_cond - 0.7 v_uncond``. Inference only; non-streaming (full attention).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from ...nn.conformer import ConformerEncoderLayer, LinearEmbed, PositionwiseFeedForward, RelPositionMultiHeadedAttention

NOISE_FRAMES = 50 * 300  # upstream's fixed noise: 15000 frames (300 s of mel)
MEL = 80  # upstream hardcodes 80 channels in the CFM


def fixed_noise(frames: int = NOISE_FRAMES) -> torch.Tensor:
    """``randn(1, 80, frames)`` right after seeding 0: upstream's ``CausalConditionalCFM.rand_noise``."""
    generator = torch.Generator().manual_seed(0)
    return torch.randn([1, MEL, frames], generator=generator)


class PreLookaheadLayer(nn.Module):
    """Look `pre_lookahead_len` frames ahead (zero padded on the right), leaky ReLU, a causal
    k=3 conv back to the input width, plus the input."""

    def __init__(self, in_channels: int, channels: int, pre_lookahead_len: int = 1) -> None:
        super().__init__()
        self.pre_lookahead_len = pre_lookahead_len
        self.conv1 = nn.Conv1d(in_channels, channels, kernel_size=pre_lookahead_len + 1)
        self.conv2 = nn.Conv1d(channels, in_channels, kernel_size=3)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = F.pad(inputs.transpose(1, 2).contiguous(), (0, self.pre_lookahead_len), value=0.0)
        x = F.leaky_relu(self.conv1(x))
        x = self.conv2(F.pad(x, (self.conv2.kernel_size[0] - 1, 0), value=0.0))
        return x.transpose(1, 2).contiguous() + inputs


class Upsample1D(nn.Module):
    """Nearest upsampling by `stride`, left pad ``2 * stride``, conv ``k = 2 * stride + 1``."""

    def __init__(self, channels: int, out_channels: int, stride: int = 2) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(channels, out_channels, stride * 2 + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=float(self.stride), mode="nearest")
        return self.conv(F.pad(x, (self.stride * 2, 0), value=0.0))


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
    input_size: int
    output_size: int
    attention_heads: int
    linear_units: int
    num_blocks: int
    up_blocks: int = 4  # upstream builds 4 up-layers whatever the config says
    pre_lookahead_len: int = 3


def _layers(spec: EncoderSpec, count: int) -> nn.ModuleList:
    return nn.ModuleList(
        ConformerEncoderLayer(spec.output_size,
                              RelPositionMultiHeadedAttention(spec.attention_heads, spec.output_size),
                              PositionwiseFeedForward(spec.output_size, spec.linear_units, nn.SiLU()))
        for _ in range(count))


class UpsampleConformerEncoder(nn.Module):
    """CosyVoice 2's token encoder (non-streaming: full attention, batch of one).

    The lookahead and upsample layers are sized from `output_size` (upstream writes 512, the
    real model's output_size)."""

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embed = LinearEmbed(spec.input_size, spec.output_size)
        self.pre_lookahead_layer = PreLookaheadLayer(spec.output_size, spec.output_size, spec.pre_lookahead_len)
        self.encoders = _layers(spec, spec.num_blocks)
        self.up_layer = Upsample1D(spec.output_size, spec.output_size, 2)
        self.up_embed = LinearEmbed(spec.input_size, spec.output_size)
        self.up_encoders = _layers(spec, spec.up_blocks)
        self.after_norm = nn.LayerNorm(spec.output_size, eps=1e-5)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(xs.shape[0], 1, xs.shape[1], dtype=torch.bool, device=xs.device)
        xs, pos = self.embed(xs)
        xs = self.pre_lookahead_layer(xs)
        for layer in self.encoders:
            xs = layer(xs, mask, pos, mask)
        xs = self.up_layer(xs.transpose(1, 2).contiguous()).transpose(1, 2).contiguous()
        mask = torch.ones(xs.shape[0], 1, xs.shape[1], dtype=torch.bool, device=xs.device)
        xs, pos = self.up_embed(xs)
        for layer in self.up_encoders:
            xs = layer(xs, mask, pos, mask)
        return self.after_norm(xs)


def cosine_t_span(n_timesteps: int, dtype: torch.dtype = torch.float32,
                  device: torch.device | None = None) -> torch.Tensor:
    t = torch.linspace(0, 1, n_timesteps + 1, device=device, dtype=dtype)
    return 1 - torch.cos(t * 0.5 * torch.pi)


class CausalCFM(nn.Module):
    """Upstream's ``CausalConditionalCFM`` at inference: fixed noise, Euler, CFG."""

    def __init__(self, estimator: nn.Module, inference_cfg_rate: float = 0.7, n_timesteps: int = 10) -> None:
        super().__init__()
        self.estimator = estimator
        self.inference_cfg_rate = inference_cfg_rate
        self.n_timesteps = n_timesteps
        self.register_buffer("rand_noise", fixed_noise(), persistent=False)

    def forward(self, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor,
                trace: list[torch.Tensor] | None = None) -> torch.Tensor:
        """The mel ``(1, 80, T)`` for conditions `mu`, `cond` ``(1, 80, T)``, `spks` ``(1, 80)``.
        `trace` collects each step's estimator output (reference checks)."""
        frames = mu.shape[2]
        if frames > self.rand_noise.shape[2]:
            raise ValueError(f"flow: {frames} mel frames, more than the {self.rand_noise.shape[2]} of the fixed noise")
        x = self.rand_noise[:, :, :frames].to(device=mu.device, dtype=mu.dtype)
        t_span = cosine_t_span(self.n_timesteps, mu.dtype, mu.device)
        return self.solve_euler(x, t_span, mu, mask, spks, cond, trace)

    def solve_euler(self, x: torch.Tensor, t_span: torch.Tensor, mu: torch.Tensor, mask: torch.Tensor,
                    spks: torch.Tensor, cond: torch.Tensor, trace: list[torch.Tensor] | None = None) -> torch.Tensor:
        t, dt = t_span[0].unsqueeze(0), t_span[1] - t_span[0]
        frames, dtype, device = x.size(2), spks.dtype, x.device
        x_in = torch.zeros([2, MEL, frames], device=device, dtype=dtype)
        mask_in = torch.zeros([2, 1, frames], device=device, dtype=dtype)
        mu_in = torch.zeros([2, MEL, frames], device=device, dtype=dtype)
        t_in = torch.zeros([2], device=device, dtype=dtype)
        spks_in = torch.zeros([2, MEL], device=device, dtype=dtype)
        cond_in = torch.zeros([2, MEL, frames], device=device, dtype=dtype)
        rate = self.inference_cfg_rate
        for step in range(1, len(t_span)):
            x_in[:] = x
            mask_in[:] = mask
            mu_in[0] = mu
            t_in[:] = t.unsqueeze(0)
            spks_in[0] = spks
            cond_in[0] = cond
            v = self.estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in)
            if trace is not None:
                trace.append(v.detach().clone())
            v_cond, v_uncond = torch.split(v, [x.size(0), x.size(0)], dim=0)
            v = (1.0 + rate) * v_cond - rate * v_uncond
            x = x + dt * v
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        return x.float()


class CosyVoiceFlow(nn.Module):
    """``CausalMaskedDiffWithXvec`` (version 2, with `encoder`) or ``CausalMaskedDiffWithDiT``
    (version 3, with `pre_lookahead_layer`)."""

    def __init__(self, *, vocab_size: int, input_size: int, output_size: int, spk_embed_dim: int,
                 token_mel_ratio: int, decoder: CausalCFM, encoder: UpsampleConformerEncoder | None = None,
                 pre_lookahead_layer: PreLookaheadLayer | None = None) -> None:
        super().__init__()
        if (encoder is None) == (pre_lookahead_layer is None):
            raise ValueError("flow: give exactly one of encoder (CosyVoice 2) and pre_lookahead_layer (CosyVoice 3)")
        if output_size != MEL:
            raise ValueError(f"flow: output_size must be {MEL} (upstream's CFM hardcodes it), got {output_size}")
        self.output_size = output_size
        self.token_mel_ratio = token_mel_ratio
        self.input_embedding = nn.Embedding(vocab_size, input_size)
        self.spk_embed_affine_layer = nn.Linear(spk_embed_dim, output_size)
        self.encoder = encoder
        self.encoder_proj = nn.Linear(encoder.spec.output_size, output_size) if encoder is not None else None
        self.pre_lookahead_layer = pre_lookahead_layer
        self.decoder = decoder

    def memory_units(self) -> list[nn.Module]:
        """M11/M12: the encoder's conformer layers, then the estimator's blocks."""
        encoder = list(self.encoder.encoders) + list(self.encoder.up_encoders) if self.encoder is not None else []
        return encoder + self.decoder.estimator.memory_units()

    def speaker(self, embedding: torch.Tensor) -> torch.Tensor:
        return self.spk_embed_affine_layer(F.normalize(embedding, dim=1))

    def token_embedding(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.input_embedding(torch.clamp(tokens, min=0))

    def mu(self, token_emb: torch.Tensor) -> torch.Tensor:
        """``(1, T, 80)`` conditions from embedded tokens (T = ratio x tokens)."""
        if self.encoder is not None and self.encoder_proj is not None:
            return self.encoder_proj(self.encoder(token_emb))
        assert self.pre_lookahead_layer is not None
        return self.pre_lookahead_layer(token_emb).repeat_interleave(self.token_mel_ratio, dim=1)

    def conditions(self, token: torch.Tensor, prompt_token: torch.Tensor, prompt_feat: torch.Tensor,
                   embedding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """mu ``(1, 80, T)``, mask ``(1, 1, T)``, spks ``(1, 80)``, cond ``(1, 80, T)``."""
        if token.shape[0] != 1:
            raise ValueError(f"flow: one utterance at a time, got a batch of {token.shape[0]}")
        spks = self.speaker(embedding)
        emb = self.token_embedding(torch.cat([prompt_token, token], dim=1))
        h = self.mu(emb)
        frames = h.shape[1]
        cond = torch.zeros([1, frames, self.output_size], device=h.device, dtype=h.dtype)
        cond[:, : prompt_feat.shape[1]] = prompt_feat
        mask = torch.ones(1, 1, frames, device=h.device, dtype=h.dtype)
        return h.transpose(1, 2).contiguous(), mask, spks, cond.transpose(1, 2)

    def forward(self, token: torch.Tensor, prompt_token: torch.Tensor, prompt_feat: torch.Tensor,
                embedding: torch.Tensor) -> torch.Tensor:
        """The generated mel ``(1, 80, T - prompt frames)``."""
        mu, mask, spks, cond = self.conditions(token, prompt_token, prompt_feat, embedding)
        feat = self.decoder(mu, mask, spks, cond)
        return feat[:, :, prompt_feat.shape[1]:].float()
