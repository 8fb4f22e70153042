"""The demo engine's model code: a speaker encoder, a small autoregressive talker over codec
frames and a convolutional codec decoder, with the weights drawn from a seed (no download)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

HOP = 256  # waveform samples per code frame
CODEBOOK = 256
TEXT_VOCAB = 256  # UTF-8 bytes
FRAMES_PER_TEXT_TOKEN = 4


class SpeakerEncoder(nn.Module):
    """Reference waveform → a voice embedding (oneshot)."""

    def __init__(self, dim: int = 256, width: int = 384) -> None:
        super().__init__()
        self.inp = nn.Conv1d(HOP, width, 3, padding=1)
        self.blocks = nn.Sequential(*(nn.Conv1d(width, width, 3, padding=1) for _ in range(2)))
        self.out = nn.Linear(width, dim)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        usable = wav.shape[-1] // HOP * HOP
        frames = wav[..., :usable].reshape(wav.shape[0], -1, HOP).transpose(1, 2)
        h = self.inp(frames)
        for block in self.blocks:
            h = h + torch.tanh(block(h))
        return self.out(h.mean(-1))


class TalkerLayer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.norm2 = nn.RMSNorm(dim)
        self.up = nn.Linear(dim, 3 * dim, bias=False)
        self.down = nn.Linear(3 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor]) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        if cache:
            k, v = torch.cat([cache[0], k], 1), torch.cat([cache[1], v], 1)
        cache[:] = [k, v]
        mask = None
        if q.shape[1] > 1:
            mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).tril(k.shape[1] - q.shape[1])
        x = x + self.o(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        return x + self.down(F.silu(self.up(self.norm2(x))))


class Talker(nn.Module):
    """Text bytes + voice → code frames, token by token (sequence)."""

    def __init__(self, dim: int = 256, layers: int = 4) -> None:
        super().__init__()
        self.dim = dim
        self.text_embed = nn.Embedding(TEXT_VOCAB, dim)
        self.code_embed = nn.Embedding(CODEBOOK + 1, dim)  # + a start-of-audio code
        self.voice_proj = nn.Linear(dim, dim)
        self.layers = nn.ModuleList(TalkerLayer(dim) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, CODEBOOK, bias=False)

    def step(self, x: torch.Tensor, caches: list[list[torch.Tensor]]) -> torch.Tensor:
        for layer, cache in zip(self.layers, caches):
            x = layer(x, cache)
        return self.head(self.norm(x[:, -1]))

    def prompt(self, text: torch.Tensor, voice: torch.Tensor) -> torch.Tensor:
        start = self.code_embed(torch.full((text.shape[0], 1), CODEBOOK))
        return torch.cat([self.voice_proj(voice).unsqueeze(1), self.text_embed(text), start], dim=1)


class CodecDecoder(nn.Module):
    """Code frames → waveform, upsampling ×256 through ConvTranspose1d stages (oneshot)."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(CODEBOOK, width)
        self.pre = nn.Conv1d(width, width, 7, padding=3)
        chans = [width, width, width // 2, width // 4, width // 8]
        self.stages = nn.Sequential(*(
            nn.Sequential(nn.ConvTranspose1d(chans[i], chans[i + 1], 8, stride=4, padding=2),
                          nn.Conv1d(chans[i + 1], chans[i + 1], 7, padding=3))
            for i in range(4)
        ))
        self.post = nn.Conv1d(chans[-1], 1, 7, padding=3)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        h = self.pre(self.embed(codes).transpose(1, 2))
        for up, conv in self.stages:
            h = up(F.leaky_relu(h, 0.1))
            h = h + conv(F.leaky_relu(h, 0.1))
        return torch.tanh(self.post(h))


COMPONENTS: dict[str, type[nn.Module]] = {"speaker_encoder": SpeakerEncoder, "talker": Talker, "decoder": CodecDecoder}


def random_weights(seed: int = 1234) -> dict[str, nn.Module]:
    """The demo's components with weights drawn from `seed` (no download)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return {name: cls().eval() for name, cls in COMPONENTS.items()}
