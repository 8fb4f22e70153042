"""The host-side optimizer (M62): AdamW on the CPU over flat float32 buffers.

The device keeps only the trained weights, in their run precision. Host RAM holds, each in one
flat float32 buffer, the master weights, the gradients and AdamW's two moments. Each step:

1. **gradients down** — every parameter's gradient is copied into one staging buffer per
   device and dtype (pinned on CUDA, so the copies are asynchronous), all queued first;
2. **one wait** per device for all of them;
3. the staging buffers are widened into the flat float32 gradient buffer (one copy each),
   optionally clipped by their global norm, and AdamW updates the flat masters;
4. **parameters up** — the masters are narrowed into the same staging buffers and copied to
   the device asynchronously. The device's stream orders the next forward after them, and the
   host next writes a staging buffer only after the next step's wait, so no other wait is
   needed.

The arithmetic is `torch.optim.AdamW`'s (its single-tensor path, decoupled weight decay, the
same bias corrections) done once over the flat buffer: with float32 weights the result equals
`torch.optim.AdamW` on the same gradients. A parameter that got no gradient in a step counts a
zero gradient (its moments still decay), where torch would skip it.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import torch
from torch import nn

from ...errors import MizuotoError


@dataclasses.dataclass(eq=False)
class _Group:
    """The parameters of one device and dtype, their place in the flat buffers, and the
    staging buffer their gradients and weights pass through."""

    device: torch.device
    dtype: torch.dtype
    params: list[nn.Parameter]
    start: int  # offset of the group in the flat buffers
    stage: torch.Tensor

    @property
    def numel(self) -> int:
        return self.stage.numel()

    def slices(self) -> list[tuple[nn.Parameter, slice]]:
        """Each parameter's slice of the staging buffer."""
        out, offset = [], 0
        for p in self.params:
            out.append((p, slice(offset, offset + p.numel())))
            offset += p.numel()
        return out


class HostAdamW:
    """AdamW with float32 state in host RAM and one staging buffer per device dtype (M62)."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise MizuotoError("HostAdamW: no parameter requires a gradient")
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.groups = self._group(self.params)
        total = sum(g.numel for g in self.groups)
        self.master = torch.empty(total, dtype=torch.float32)
        self.grad = torch.zeros(total, dtype=torch.float32)
        self.exp_avg = torch.zeros(total, dtype=torch.float32)
        self.exp_avg_sq = torch.zeros(total, dtype=torch.float32)
        self.steps = 0
        with torch.no_grad():
            for g in self.groups:
                for p, s in g.slices():
                    self._flat(g, s).copy_(p.detach().reshape(-1))

    @staticmethod
    def _group(params: list[nn.Parameter]) -> list[_Group]:
        by_key: dict[tuple[torch.device, torch.dtype], list[nn.Parameter]] = {}
        for p in params:
            by_key.setdefault((p.device, p.dtype), []).append(p)
        groups, start = [], 0
        for (device, dtype), members in by_key.items():
            numel = sum(p.numel() for p in members)
            stage = torch.empty(numel, dtype=dtype, pin_memory=device.type == "cuda")
            groups.append(_Group(device, dtype, members, start, stage))
            start += numel
        return groups

    def _flat(self, group: _Group, s: slice | None = None) -> torch.Tensor:
        """The group's part of the master buffer (or one parameter's part of it)."""
        part = self.master[group.start:group.start + group.numel]
        return part if s is None else part[s]

    @property
    def state_bytes(self) -> int:
        """Host RAM the optimizer holds: four float32 buffers and the staging buffers."""
        return 4 * self.master.numel() * 4 + sum(g.numel * g.stage.element_size() for g in self.groups)

    @torch.no_grad()
    def step(self, max_grad_norm: float | None = None) -> float | None:
        """One AdamW step from the parameters' gradients; returns the gradient norm when
        clipping (`max_grad_norm`), as `clip_grad_norm_` does."""
        self._gradients_down()
        norm = self._clip(max_grad_norm)
        self._adamw()
        self._parameters_up()
        return norm

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def _gradients_down(self) -> None:
        missing: list[tuple[_Group, slice]] = []
        for g in self.groups:
            for p, s in g.slices():
                if p.grad is None:
                    missing.append((g, s))  # zeroed after the wait: the last upload may still read the stage
                else:
                    g.stage[s].copy_(p.grad.reshape(-1), non_blocking=True)
                p.grad = None
        for device in {g.device for g in self.groups}:  # the step's one wait
            if device.type == "cuda":
                torch.cuda.current_stream(device).synchronize()
            elif device.type == "xpu":
                torch.xpu.synchronize(device)
        for g in self.groups:
            self.grad[g.start:g.start + g.numel].copy_(g.stage)
        for g, s in missing:
            self.grad[g.start + s.start:g.start + s.stop].zero_()

    def _clip(self, max_norm: float | None) -> float | None:
        if max_norm is None:
            return None
        norm = float(torch.linalg.vector_norm(self.grad))
        if not math.isfinite(norm):
            raise MizuotoError(f"HostAdamW: the gradient norm is {norm}; the loss diverged")
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            self.grad.mul_(coef)
        return norm

    def _adamw(self) -> None:
        """`torch.optim.AdamW`'s single-tensor arithmetic, once over the flat buffers."""
        self.steps += 1
        beta1, beta2 = self.betas
        if self.weight_decay:
            self.master.mul_(1 - self.lr * self.weight_decay)
        self.exp_avg.lerp_(self.grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(self.grad, self.grad, value=1 - beta2)
        bias_correction1 = 1 - beta1 ** self.steps
        bias_correction2 = 1 - beta2 ** self.steps
        step_size = self.lr / bias_correction1
        denom = (self.exp_avg_sq.sqrt() / bias_correction2 ** 0.5).add_(self.eps)
        self.master.addcdiv_(self.exp_avg, denom, value=-step_size)

    def _parameters_up(self) -> None:
        for g in self.groups:
            g.stage.copy_(self._flat(g))
            for p, s in g.slices():
                p.data.copy_(g.stage[s].view_as(p), non_blocking=True)
