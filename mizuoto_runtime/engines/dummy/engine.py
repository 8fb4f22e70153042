"""The dummy engine: one component, not phased (M4, M48) — the whole call is one `ctx.use`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...audio import Audio
from ...memory.phases import RequestContext
from ..base import CheckpointInfo, Codes, Engine, Sampling, Voice

HOP = 128


class DummySynth(nn.Module):
    """Text bytes → waveform through a few conv layers."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.body = nn.Sequential(*(nn.Conv1d(width, width, 5, padding=2) for _ in range(3)))
        self.up = nn.ConvTranspose1d(width, 1, HOP, stride=HOP)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens).transpose(1, 2)
        for conv in self.body:
            h = h + F.gelu(conv(h))
        return torch.tanh(self.up(h))


class DummyEngine(Engine):
    id = "dummy"
    title = "Dummy"
    TINY = None
    PHASED = False
    BUILTIN = CheckpointInfo("built-in random weights")
    sample_rate = 16000

    def __init__(self, manager: Any, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> None:
        super().__init__(manager, model_dir, dtype, device)
        with torch.random.fork_rng():
            torch.manual_seed(7)
            module = DummySynth().to(dtype).eval()
        self.synth = self.register(module, "synth")

    def handles(self) -> list[Any]:
        return [self.synth]

    def memory_required(self, text: str) -> int:
        """M48: activations of the whole call, from the text length."""
        frames = len(text.encode()) * 8
        return 4 * frames * 256 * 4 + frames * HOP * 4

    def encode_voice(self, ctx: RequestContext, reference: Audio | None, transcript: str | None,
                     speaker: str | None, instruct: str | None = None) -> dict[str, Any]:
        return {}

    def generate(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling) -> Codes:
        tokens = torch.tensor([list(text.encode())], dtype=torch.long).repeat_interleave(8, dim=1)
        return Codes(tokens, self.id)

    @torch.inference_mode()
    def decode(self, ctx: RequestContext, codes: Codes, allow_fallback: bool | None = None) -> Audio:
        return Audio(self.synth.module(codes.tokens)[0].float(), self.sample_rate)
