"""Model code nobody here wrote (M11-M17, M57): diffusers' UNet, DiT, MMDiT (SD3) and VAE from
tiny configs with random weights, streamed none / half / whole on the strict simulated device,
`torch.equal` to the plain run. Skipped where diffusers is not installed (it is no dependency of
the pack; `pip install diffusers --no-deps` beside transformers runs these)."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from mizuoto_runtime import DeviceService, ModelHandle
from mizuoto_runtime.memory.manager import ModelManager
from mizuoto_runtime.memory.policy import VramPolicy

from support.placement import check_three_sizes

diffusers = pytest.importorskip("diffusers")

MB = 1 << 20
PLACEMENTS = ("none", "half", "whole")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _noise(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def unet() -> nn.Module:
    return diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, block_out_channels=(128, 256), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=64, attention_head_dim=8, norm_num_groups=32)


def _unet_run(m: nn.Module) -> torch.Tensor:
    return m(_noise(2, 4, 8, 8), torch.tensor([10, 500]), encoder_hidden_states=_noise(2, 5, 64, seed=2)).sample


def dit() -> nn.Module:
    return diffusers.DiTTransformer2DModel(num_attention_heads=4, attention_head_dim=64, in_channels=4, num_layers=4,
                                           sample_size=8, patch_size=2)


def _dit_run(m: nn.Module) -> torch.Tensor:
    return m(_noise(2, 4, 8, 8), timestep=torch.tensor([10, 500]), class_labels=torch.tensor([1, 7])).sample


def mmdit() -> nn.Module:
    return diffusers.SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=4,
                                           attention_head_dim=64, num_attention_heads=4, joint_attention_dim=64,
                                           caption_projection_dim=256, pooled_projection_dim=32, out_channels=4,
                                           pos_embed_max_size=16)


def _mmdit_run(m: nn.Module) -> torch.Tensor:
    return m(_noise(2, 4, 8, 8), encoder_hidden_states=_noise(2, 5, 64, seed=2),
             pooled_projections=_noise(2, 32, seed=3), timestep=torch.tensor([10, 500])).sample


def vae() -> nn.Module:
    return diffusers.AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                                   up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(128, 256),
                                   latent_channels=4, norm_num_groups=32, layers_per_block=1)


def _vae_run(m: nn.Module) -> torch.Tensor:
    latent = m.encode(_noise(1, 3, 16, 16)).latent_dist.mode()
    return m.decode(latent).sample


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], torch.Tensor]]] = {
    "unet": (unet, _unet_run),
    "dit": (dit, _dit_run),
    "mmdit": (mmdit, _mmdit_run),
    "vae": (vae, _vae_run),
}


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_diffusers_model_streams_exactly(name: str, placement: str) -> None:
    factory, call = MODELS[name]
    torch.manual_seed(0)
    plain = factory().eval()
    torch.manual_seed(0)
    placed = factory().eval()
    with torch.no_grad():
        expected = call(plain)
    h = ModelHandle(placed, devices=DeviceService(simulate={"cpu": 256 * MB}, strict=True), kind="oneshot", name=name)
    assert len(h.units) >= 3, f"{name}: its blocks are units (M12)"
    h.load({"none": 0, "half": (h.min_working_set + h.size_bytes) // 2, "whole": None}[placement])
    streamed = len(h.streamed_units)
    assert streamed == {"none": len(h.units), "whole": 0}.get(placement, streamed)
    assert placement != "half" or 0 < streamed < len(h.units)
    with torch.no_grad():
        got = call(placed)
    assert torch.equal(got, expected), f"{name} ({placement}) differs from the plain run"
    if streamed:
        assert h.streamer.streamed_bytes_of(h) > 0


@pytest.mark.parametrize("name", sorted(MODELS))
def test_diffusers_model_placement_invariants_at_three_sizes(name: str) -> None:
    """Issue 21, item 4: at the minimum working set, the midpoint and one unit short of whole,
    exact, within the device and the placement's account, monotone in the device's size, never
    streaming more than `vram_mode = none` (tests/support/placement.py)."""
    factory, call = MODELS[name]

    def run(m: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return call(m)

    check_three_sizes(factory, run, "oneshot")


def _cfg_sampler(m: nn.Module, batched: bool, steps: int = 3) -> torch.Tensor:
    """A sampler loop with classifier-free guidance: two calls per step, or one batched call."""
    x = _noise(1, 4, 8, 8)
    cond, uncond = _noise(1, 5, 64, seed=2), _noise(1, 5, 64, seed=3)
    with torch.no_grad():
        for step in range(steps):
            t = torch.tensor([999 - 300 * step])
            if batched:
                out = m(torch.cat([x, x]), t.repeat(2), encoder_hidden_states=torch.cat([cond, uncond])).sample
                c, u = out.chunk(2)
            else:
                c = m(x, t, encoder_hidden_states=cond).sample
                u = m(x, t, encoder_hidden_states=uncond).sample
            x = x - 0.1 * (u + 7.5 * (c - u))
    return x


@pytest.mark.parametrize("batched", [False, True], ids=["cfg-two-calls", "cfg-batched"])
def test_unet_cfg_sampler_on_a_40_mb_device_copies_no_more_than_none(batched: bool) -> None:
    """Issue 21's case: a UNet of 7 units (the largest 16.5 MB, 47.6 MB in all, minimum working
    set 25.2 MB) in a CFG sampler loop on a 40 MB strict device. A copy kept after its unit ran
    once overflowed the copies' room (an OOM placing the largest unit) and made the partial
    placement stream more than `none`: now it runs exactly in both CFG forms, within the
    device, copying less than with every unit streamed (M16, M18)."""
    torch.manual_seed(0)
    expected = _cfg_sampler(unet().eval(), batched)
    runs = {}
    for mode in ("normal", "none"):
        torch.manual_seed(0)
        model = unet().eval()
        manager = ModelManager(DeviceService(simulate={"cpu": 40 * MB}, strict=True),
                               VramPolicy({"compute.vram_mode": mode}))
        h = manager.register(model, engine="diffusers", name="unet", kind="oneshot")
        assert (len(h.units), round(max(u.nbytes for u in h.units) / MB, 1), round(h.size_bytes / MB, 1),
                round(h.min_working_set / MB, 1)) == (7, 16.5, 47.6, 25.2)
        ctx = manager.request()
        with ctx.use([h], 0, "sample"):
            resident = h.loaded_bytes
            got = _cfg_sampler(model, batched)
        assert torch.equal(got, expected), f"{mode}: differs from the plain run"
        assert manager.devices.peak_counted_bytes(torch.device("cpu")) <= 40 * MB
        runs[mode] = (resident, ctx.charge.streamed_bytes)
    assert runs["normal"][0] > runs["none"][0]  # part of the UNet stays resident
    copied, none = runs["normal"][1], runs["none"][1]
    assert copied < none, f"copied {copied} B, with every unit streamed {none} B"
