"""The SwiGLU feed-forward of Llama-family transformers: ``down(silu(gate(x)) * up(x))`` with
three bias-free Linears (Qwen2/Qwen3 decoders, Fish Speech's transformers, IndexTTS-2's DiT).

Checkpoints name the three Linears two ways; the module takes the names, so each checkpoint's
state-dict keys load as they are.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: (gate, up, down) as Meta's Llama reference names them (Fish Speech, IndexTTS-2's DiT).
LLAMA_NAMES = ("w1", "w3", "w2")
#: (gate, up, down) as transformers' Llama/Qwen modules name them.
TRANSFORMERS_NAMES = ("gate_proj", "up_proj", "down_proj")


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``; `names` are the (gate, up, down) Linears' names."""

    def __init__(self, dim: int, inner: int, names: tuple[str, str, str] = LLAMA_NAMES) -> None:
        super().__init__()
        if len(set(names)) != 3:
            raise ValueError(f"SwiGLU: three distinct Linear names needed, got {names!r}")
        self.names = names
        gate, up, down = names
        self.add_module(gate, nn.Linear(dim, inner, bias=False))
        self.add_module(up, nn.Linear(dim, inner, bias=False))
        self.add_module(down, nn.Linear(inner, dim, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down = (getattr(self, n) for n in self.names)
        return down(F.silu(gate(x)) * up(x))
