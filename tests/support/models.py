"""Small models for the streaming tests (M57): each stands for a family the runtime must serve."""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn


class DecoderLayer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor] | None = None) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        if cache is not None:
            if cache:
                k = torch.cat([cache[0], k], dim=1)
                v = torch.cat([cache[1], v], dim=1)
                cache[0], cache[1] = k, v
            else:
                cache.extend([k, v])
        att = torch.softmax(q @ k.transpose(1, 2) / k.shape[-1] ** 0.5, dim=-1) @ v
        x = x + self.out(att)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyLM(nn.Module):
    """Decoder-only LM with a tied embedding/head and a token-by-token generation loop."""

    def __init__(self, vocab: int = 512, dim: int = 256, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(DecoderLayer(dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: fixed part (M14)

    def step(self, tokens: torch.Tensor, caches: list[list[torch.Tensor]]) -> torch.Tensor:
        x = self.embed(tokens)
        for layer, cache in zip(self.layers, caches):
            x = layer(x, cache)
        return self.head(self.norm(x))[:, -1]

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, steps: int, generator: torch.Generator | None = None) -> torch.Tensor:
        caches: list[list[torch.Tensor]] = [[] for _ in self.layers]
        tokens, out = prompt, [prompt]
        for _ in range(steps):
            logits = self.step(tokens, caches)
            probs = torch.softmax(logits.float(), dim=-1)
            tokens = torch.multinomial(probs, 1, generator=generator)
            out.append(tokens)
        return torch.cat(out, dim=1)


class VocoderStage(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose1d(cin, cout, kernel_size=4, stride=2, padding=1)
        self.conv = nn.Conv1d(cout, cout, kernel_size=7, padding=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.up(F.leaky_relu(x, 0.1))
        return x + self.conv(F.leaky_relu(x, 0.1))


class ConvVocoder(nn.Module):
    """A conv vocoder with ConvTranspose1d upsampling stages (oneshot)."""

    def __init__(self, mels: int = 80, width: int = 256) -> None:
        super().__init__()
        self.pre = nn.Conv1d(mels, width, kernel_size=7, padding=3)
        self.stages = nn.Sequential(
            *(VocoderStage(width, width) for _ in range(5)), VocoderStage(width, width // 2),
        )
        self.post = nn.Conv1d(width // 2, 1, kernel_size=7, padding=3)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.post(self.stages(self.pre(mel))))


class DiTBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mod = nn.Linear(dim, 4 * dim)
        self.attn_qkv = nn.Linear(dim, 3 * dim)
        self.attn_out = nn.Linear(dim, dim)
        self.ff1 = nn.Linear(dim, 2 * dim)
        self.ff2 = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        s1, b1, s2, b2 = self.mod(t).unsqueeze(1).chunk(4, dim=-1)
        h = F.layer_norm(x, x.shape[-1:]) * (1 + s1) + b1
        q, k, v = self.attn_qkv(h).chunk(3, dim=-1)
        x = x + self.attn_out(torch.softmax(q @ k.transpose(1, 2) / q.shape[-1] ** 0.5, -1) @ v)
        h = F.layer_norm(x, x.shape[-1:]) * (1 + s2) + b2
        return x + self.ff2(F.silu(self.ff1(h)))


class TinyDiT(nn.Module):
    """DiT-style blocks run with CFG as two halves per block: each block runs twice in a row."""

    def __init__(self, dim: int = 192, depth: int = 4) -> None:
        super().__init__()
        self.time = nn.Linear(1, dim)
        self.cond = nn.Embedding(8, dim)
        self.blocks = nn.ModuleList(DiTBlock(dim) for _ in range(depth))
        self.out = nn.Linear(dim, dim)

    def velocity(self, x: torch.Tensor, t: float, label: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        temb = self.time(torch.full((x.shape[0], 1), t))
        xc, xu = x, x
        for block in self.blocks:
            xc = block(xc, temb + self.cond(label))  # conditional half
            xu = block(xu, temb)  # unconditional half reuses the block's copy (M18)
        vc, vu = self.out(xc), self.out(xu)
        return vu + scale * (vc - vu)

    @torch.no_grad()
    def sample(self, noise: torch.Tensor, label: torch.Tensor, steps: int = 3) -> torch.Tensor:
        x = noise
        for i in range(steps):
            x = x + self.velocity(x, i / steps, label) / steps
        return x


class Conv1D(nn.Module):
    """GPT-2's transposed linear layer: not an nn.Linear, so it declares itself streamable (M13)."""

    STREAMABLE = True

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


class GPT2Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.c_attn = Conv1D(3 * dim, dim)
        self.c_proj = Conv1D(dim, dim)
        self.c_fc = Conv1D(4 * dim, dim)
        self.c_out = Conv1D(dim, 4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.c_attn(self.ln(x)).chunk(3, dim=-1)
        x = x + self.c_proj(torch.softmax(q @ k.transpose(1, 2), -1) @ v)
        return x + self.c_out(F.gelu(self.c_fc(self.ln(x))))


class TinyGPT2(nn.Module):
    def __init__(self, dim: int = 256, layers: int = 5) -> None:
        super().__init__()
        self.wte = nn.Embedding(300, dim)
        self.h = nn.ModuleList(GPT2Block(dim) for _ in range(layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens)
        for block in self.h:
            x = block(x)
        return x


class RunningBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)  # updated in place: must be copied back when the block leaves the device
        return self.proj(x) * self.calls


class BufferModel(nn.Module):
    """A model whose buffers are updated in place on every call."""

    def __init__(self, dim: int = 512, depth: int = 5) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(RunningBlock(dim) for _ in range(depth))
        self.register_buffer("seen", torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.add_(x.mean(0))
        for block in self.blocks:
            x = torch.tanh(block(x))
        return x + self.seen


def weight_norm(module: nn.Module, legacy: bool) -> nn.Module:
    if not legacy:
        return nn.utils.parametrizations.weight_norm(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated, but what many vocoders still use
        return nn.utils.weight_norm(module)


class WeightNormResBlock(nn.Module):
    def __init__(self, width: int, legacy: bool) -> None:
        super().__init__()
        self.convs = nn.ModuleList(weight_norm(nn.Conv1d(width, width, kernel_size=3, padding=d, dilation=d), legacy)
                                   for d in (1, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = x + conv(F.leaky_relu(x, 0.1))
        return x


class WeightNormVocoder(nn.Module):
    """HiFi-GAN's shape, every conv weight-normed — `parametrizations.weight_norm`
    (`original0/1`) or the legacy `nn.utils.weight_norm` (`weight_g`/`weight_v` and a pre-hook
    that computes `weight`): `ups` is a list of bare transposed convs (each unit is the layer
    itself), `resblocks` a list of blocks. BigVGAN, Encodec and HiFT are built the same way."""

    def __init__(self, mels: int = 80, width: int = 256, legacy: bool = False) -> None:
        super().__init__()
        self.pre = weight_norm(nn.Conv1d(mels, width, kernel_size=7, padding=3), legacy)
        self.ups = nn.ModuleList(weight_norm(nn.ConvTranspose1d(width, width, kernel_size=8, stride=4, padding=2),
                                             legacy) for _ in range(3))
        self.resblocks = nn.ModuleList(WeightNormResBlock(width, legacy) for _ in range(3))
        self.post = weight_norm(nn.Conv1d(width, 1, kernel_size=7, padding=3), legacy)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.pre(mel)
        for up, block in zip(self.ups, self.resblocks):
            x = block(up(F.leaky_relu(x, 0.1)))
        return torch.tanh(self.post(F.leaky_relu(x, 0.1)))


class LegacyWeightNormVocoder(WeightNormVocoder):
    def __init__(self) -> None:
        super().__init__(legacy=True)


class PlainConv1D(Conv1D):
    """GPT-2's `Conv1D` as transformers ships it: it does not declare STREAMABLE."""

    STREAMABLE = False


class UnmarkedGPT2(TinyGPT2):
    """GPT-2 blocks of layers that do not declare themselves streamable: everything is fixed."""

    def __init__(self, dim: int = 256, layers: int = 3) -> None:
        super().__init__(dim, layers)
        for block in self.h:
            for name in ("c_attn", "c_proj", "c_fc", "c_out"):
                old = getattr(block, name)
                new = PlainConv1D(old.weight.shape[1], old.weight.shape[0])
                setattr(block, name, new)
