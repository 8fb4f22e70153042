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
