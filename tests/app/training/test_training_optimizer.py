"""M62: the host-side optimizer is torch's AdamW, with its float32 state in flat host buffers."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from mizuoto_runtime import MizuotoError
from mizuoto_runtime.app.training import HostAdamW

STEPS = 7
SETTINGS = {"lr": 3e-3, "betas": (0.9, 0.99), "eps": 1e-7, "weight_decay": 0.05}


def params(dtype: torch.dtype = torch.float32) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    shapes = [(17, 9), (33,), (4, 5, 6), (1,)]
    return [nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in shapes]


def gradients(step: int, like: list[nn.Parameter]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=gen) for p in like]


def run_torch(ps: list[nn.Parameter], clip: float | None = None,
              grad_dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    opt = torch.optim.AdamW(ps, **SETTINGS)
    for step in range(STEPS):
        for p, g in zip(ps, gradients(step, ps)):
            p.grad = g.to(grad_dtype).to(p.dtype)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(ps, clip)
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in ps]


def run_host(ps: list[nn.Parameter], clip: float | None = None) -> tuple[HostAdamW, list[float | None]]:
    opt = HostAdamW(ps, **SETTINGS)
    norms = []
    for step in range(STEPS):
        for p, g in zip(ps, gradients(step, ps)):
            p.grad = g.to(p.dtype)
        norms.append(opt.step(clip))
    return opt, norms


@pytest.mark.parametrize("clip", [None, 0.5])
def test_parameters_after_n_steps_equal_torch_adamw(clip: float | None) -> None:
    expected = run_torch(params(), clip)
    ours = params()
    opt, norms = run_host(ours, clip)
    for p, e in zip(ours, expected):
        if clip is None:
            assert torch.equal(p.detach(), e)  # the same arithmetic, element by element
        else:  # the global norm sums in another order: float32 tolerance
            torch.testing.assert_close(p.detach(), e, rtol=1e-6, atol=1e-7)
    assert opt.steps == STEPS
    assert (clip is None) == all(n is None for n in norms)


def test_state_is_one_flat_float32_buffer_each_and_one_stage_per_device_dtype() -> None:
    ps = params() + params(torch.bfloat16)
    opt = HostAdamW(ps)
    total = sum(p.numel() for p in ps)
    for buf in (opt.master, opt.grad, opt.exp_avg, opt.exp_avg_sq):
        assert buf.dtype == torch.float32 and buf.dim() == 1 and buf.numel() == total and buf.device.type == "cpu"
    assert sorted(str(g.dtype) for g in opt.groups) == ["torch.bfloat16", "torch.float32"]
    assert all(g.stage.numel() == sum(p.numel() for p in g.params) for g in opt.groups)
    assert opt.state_bytes == 16 * total + sum(g.stage.numel() * g.stage.element_size() for g in opt.groups)


def test_half_precision_weights_keep_float32_masters() -> None:
    """bf16 weights on the device, float32 masters on the host: the masters follow float32
    AdamW on the same gradients, and each weight is its master rounded once."""
    start = params()
    expected = run_torch([nn.Parameter(p.detach().to(torch.bfloat16).float()) for p in start],
                         grad_dtype=torch.bfloat16)  # the device's gradients are bf16 too
    ours = [nn.Parameter(p.detach().to(torch.bfloat16)) for p in start]
    opt, _ = run_host(ours)
    for g in opt.groups:
        for p, s in g.slices():
            master = opt.master[g.start:g.start + g.numel][s].view_as(p)
            assert torch.equal(p.detach(), master.to(torch.bfloat16))
    flat_expected = torch.cat([e.reshape(-1) for e in expected])
    torch.testing.assert_close(opt.master, flat_expected, rtol=1e-6, atol=1e-7)


def test_gradients_are_consumed_and_a_missing_one_counts_zero() -> None:
    ps = params()
    twin = [nn.Parameter(p.detach().clone()) for p in ps]
    opt, reference = HostAdamW(ps, **SETTINGS), HostAdamW(twin, **SETTINGS)
    for p, q, g in zip(ps, twin, gradients(0, ps)):
        p.grad = g
        q.grad = g.clone()
    ps[1].grad = None
    twin[1].grad = torch.zeros_like(twin[1])
    opt.step()
    reference.step()
    assert all(p.grad is None for p in ps)
    for p, q in zip(ps, twin):
        assert torch.equal(p.detach(), q.detach())


def test_frozen_parameters_are_left_alone() -> None:
    ps = params()
    ps[0].requires_grad_(False)
    before = ps[0].detach().clone()
    opt = HostAdamW(ps)
    assert len(opt.params) == len(ps) - 1
    for p in ps[1:]:
        p.grad = torch.ones_like(p)
    opt.step()
    assert torch.equal(ps[0].detach(), before)
    with pytest.raises(MizuotoError, match="no parameter requires a gradient"):
        HostAdamW([copy.deepcopy(ps[0])])


def test_a_diverged_gradient_is_one_clear_error() -> None:
    ps = params()
    opt = HostAdamW(ps)
    for p in ps:
        p.grad = torch.full_like(p, float("nan"))
    with pytest.raises(MizuotoError, match="gradient norm is nan"):
        opt.step(1.0)
