"""s2mel: semantic features -> 80-band mel at 22.05 kHz (length regulator, GPT projection, CFM).

Read from upstream's s2mel modules as a specification. The CFM estimator is a DiT (adaptive
RMS-norm blocks conditioned on the time embedding, interleaved-pair rotary attention masked by
the valid length, U-ViT skips from the first half of the blocks into the second) whose output
goes through a WaveNet (weight-normed convolutions with reflect padding, conditioned on a second
time embedding) and an adaLN final layer. Euler over 25 steps with classifier-free guidance:
the batch-2 call whose second half has zero prompt, style and content.
Weight-norm pairs (weight_g / weight_v) are folded into plain weights when loading, with the
kernel torch's weight norm itself calls, so the weights are bit-equal to upstream's.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...nn.conv import ReflectConv1d
from ...nn.feed_forward import SwiGLU
from ...nn.norm import RMSNorm
from ...nn.rotary import apply_pair_table, pair_table
from ...nn.timestep import TimestepEmbedding
from ...nn.wavenet import WaveNet
from .config import DiTConfig


def length_mask(lengths: torch.Tensor, frames: int) -> torch.Tensor:
    return torch.arange(frames, device=lengths.device)[None, :] < lengths[:, None]


class LengthRegulator(nn.Module):
    """Continuous content: project, stretch (nearest) to the target frames, 4 x (conv, GroupNorm(1),
    Mish) and a 1x1 conv, masked to each length."""

    def __init__(self, channels: int, in_channels: int, codebook_size: int, stages: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(stages):
            layers += [nn.Conv1d(channels, channels, 3, 1, 1), nn.GroupNorm(1, channels), nn.Mish()]
        layers.append(nn.Conv1d(channels, channels, 1, 1))
        self.model = nn.Sequential(*layers)
        # Stored but unused with continuous content; kept so the file loads strictly.
        self.embedding = nn.Embedding(codebook_size, channels)
        self.mask_token = nn.Parameter(torch.zeros(1, channels))
        self.content_in_proj = nn.Linear(in_channels, channels)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """x (B, T, in_channels), lengths (B,) -> (B, max(lengths), channels)."""
        frames = int(lengths.max())
        x = F.interpolate(self.content_in_proj(x).transpose(1, 2).contiguous(), size=frames, mode="nearest")
        return self.model(x).transpose(1, 2) * length_mask(lengths, frames).unsqueeze(-1)


def gpt_projection(state: dict[str, torch.Tensor]) -> nn.Sequential:
    """Three Linears without activations; widths come from the stored tensors (upstream hardcodes
    the first input width to the real GPT's 1280)."""
    layers = []
    for i in range(3):
        w = state.get(f"{i}.weight")
        if w is None or w.ndim != 2:
            raise ValueError(f"s2mel.pth gpt_layer: missing or non-matrix '{i}.weight'")
        layers.append(nn.Linear(w.shape[1], w.shape[0]))
    return nn.Sequential(*layers)


class AdaptiveNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.project_layer = nn.Linear(dim, 2 * dim)
        self.norm = RMSNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        weight, bias = self.project_layer(c).chunk(2, dim=-1)
        return weight * self.norm(x) + bias


class DiTAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, table: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, self.head_dim) for z in self.wqkv(x).split(d, dim=-1))
        q, k = apply_pair_table(q, table), apply_pair_table(k, table)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(b, t, d))


class DiTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, inner: int) -> None:
        super().__init__()
        self.attention = DiTAttention(dim, heads)
        self.feed_forward = SwiGLU(dim, inner)
        self.ffn_norm = AdaptiveNorm(dim)
        self.attention_norm = AdaptiveNorm(dim)
        self.skip_in_linear = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor, c: torch.Tensor, table: torch.Tensor, mask: torch.Tensor,
                skip: torch.Tensor | None) -> torch.Tensor:
        if skip is not None:
            x = self.skip_in_linear(torch.cat([x, skip], dim=-1))
        h = x + self.attention(self.attention_norm(x, c), table, mask)
        return h + self.feed_forward(self.ffn_norm(h, c))


class DiTTransformer(nn.Module):
    def __init__(self, dim: int, heads: int, depth: int) -> None:
        super().__init__()
        n_hidden = int(2 * 4 * dim / 3)
        inner = n_hidden if n_hidden % 256 == 0 else n_hidden + 256 - n_hidden % 256
        self.layers = nn.ModuleList(DiTBlock(dim, heads, inner) for _ in range(depth))
        self.norm = AdaptiveNorm(dim)
        self.heads = heads

    def forward(self, x: torch.Tensor, c: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # made on the CPU, then moved
        table = pair_table(torch.arange(x.shape[1]), x.shape[2] // self.heads).to(x.device)
        half = len(self.layers) // 2
        skips: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            x = layer(x, c, table, mask, skips.pop() if i > half else None)
            if i < half:
                skips.append(x)
        return self.norm(x, c)


class FinalLayer(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, hidden)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(self.norm_final(x) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1))


class DiT(nn.Module):
    """The CFM estimator: (x, prompt_x, lengths, t, style, mu) -> d x / d t, (B, 80, T)."""

    def __init__(self, c: DiTConfig) -> None:
        super().__init__()
        self.transformer = DiTTransformer(c.hidden, c.heads, c.depth)
        self.x_embedder = nn.Linear(c.in_channels, c.hidden)  # stored, unused
        self.cond_embedder = nn.Embedding(c.content_codebook_size, c.hidden)  # stored, unused
        self.cond_projection = nn.Linear(c.content_dim, c.hidden)
        self.t_embedder = TimestepEmbedding(c.hidden, sinusoid="cos_sin")
        self.register_buffer("input_pos", torch.arange(16384))
        self.t_embedder2 = TimestepEmbedding(c.wn_hidden, sinusoid="cos_sin")
        self.conv1 = nn.Linear(c.hidden, c.wn_hidden)
        self.conv2 = nn.Conv1d(c.wn_hidden, c.in_channels, 1)
        self.wavenet = WaveNet(c.wn_hidden, c.wn_kernel, c.wn_layers, c.wn_hidden, dilation_rate=c.wn_dilation,
                               conv=ReflectConv1d)
        self.final_layer = FinalLayer(c.wn_hidden)
        self.res_projection = nn.Linear(c.hidden, c.wn_hidden)
        self.content_mask_embedder = nn.Embedding(1, c.hidden)  # stored, unused
        self.skip_linear = nn.Linear(c.hidden + c.in_channels, c.hidden)
        self.cond_x_merge_linear = nn.Linear(c.hidden + 2 * c.in_channels + c.style_dim, c.hidden)

    def forward(self, x: torch.Tensor, prompt_x: torch.Tensor, x_lens: torch.Tensor, t: torch.Tensor,
                style: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
        frames = x.shape[2]
        t1 = self.t_embedder(t)
        x = x.transpose(1, 2)
        merged = torch.cat([x, prompt_x.transpose(1, 2), self.cond_projection(mu),
                            style[:, None, :].expand(-1, frames, -1)], dim=-1)
        valid = length_mask(x_lens, frames).unsqueeze(1)                # (b, 1, T)
        attn_mask = valid[:, None, :, :].expand(-1, 1, frames, -1)
        h = self.transformer(self.cond_x_merge_linear(merged), t1.unsqueeze(1), attn_mask)
        h = self.skip_linear(torch.cat([h, x], dim=-1))
        y = self.wavenet(self.conv1(h).transpose(1, 2), valid, self.t_embedder2(t).unsqueeze(2))
        y = y.transpose(1, 2) + self.res_projection(h)
        return self.conv2(self.final_layer(y, t1).transpose(1, 2))


class CFM(nn.Module):
    def __init__(self, c: DiTConfig) -> None:
        super().__init__()
        self.estimator = DiT(c)
        self.in_channels = c.in_channels

    def noise(self, mu: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The one random draw of upstream's inference: randn (B, 80, T) on mu's device."""
        return torch.randn([mu.shape[0], self.in_channels, mu.shape[1]], device=mu.device, generator=generator)

    def solve(self, noise: torch.Tensor, x_lens: torch.Tensor, prompt: torch.Tensor, mu: torch.Tensor,
              style: torch.Tensor, steps: int, cfg_rate: float) -> torch.Tensor:
        """Euler from t=0 to 1; the prompt frames of x are zero before and after every step and the
        output keeps them (zeros)."""
        t_span = torch.linspace(0, 1, steps + 1, device=mu.device)
        p = prompt.shape[-1]
        x = noise.clone()
        prompt_x = torch.zeros_like(x)
        prompt_x[..., :p] = prompt[..., :p]
        x[..., :p] = 0
        t = t_span[0]
        for step in range(1, steps + 1):
            dt = t_span[step] - t_span[step - 1]
            x = x + dt * self.velocity(x, prompt_x, x_lens, t, style, mu, cfg_rate)
            t = t + dt
            x[:, :, :p] = 0
        return x

    def velocity(self, x: torch.Tensor, prompt_x: torch.Tensor, x_lens: torch.Tensor, t: torch.Tensor,
                 style: torch.Tensor, mu: torch.Tensor, cfg_rate: float) -> torch.Tensor:
        if cfg_rate <= 0:
            return self.estimator(x, prompt_x, x_lens, t.unsqueeze(0), style, mu)
        both = self.estimator(torch.cat([x, x]), torch.cat([prompt_x, torch.zeros_like(prompt_x)]), x_lens,
                              torch.stack([t, t]), torch.cat([style, torch.zeros_like(style)]),
                              torch.cat([mu, torch.zeros_like(mu)]))
        cond, uncond = both.chunk(2, dim=0)
        return (1.0 + cfg_rate) * cond - cfg_rate * uncond


class S2Mel(nn.Module):
    """The three parts of s2mel.pth's "net": cfm, length_regulator, gpt_layer."""

    def __init__(self, s2mel: dict[str, Any], gpt_layer: nn.Sequential) -> None:
        super().__init__()
        lr = s2mel["length_regulator"]
        if lr.get("is_discrete", False) or lr.get("f0_condition", False) or lr.get("vector_quantize", False) \
                or lr.get("n_codebooks", 1) != 1:
            raise ValueError(f"config.yaml s2mel.length_regulator: IndexTTS-2 uses continuous content, one "
                             f"codebook, no f0, no vq; got {lr}")
        self.cfm = CFM(DiTConfig.from_yaml(s2mel))
        self.length_regulator = LengthRegulator(lr["channels"], lr["in_channels"], lr["content_codebook_size"],
                                                len(lr["sampling_ratios"]))
        self.gpt_layer = gpt_layer
