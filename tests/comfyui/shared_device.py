"""One simulated device shared by a real ComfyUI `model_management` and our manager — the
set-up of the real-ComfyUI checks (`comfy_inprocess.py`, `version_check.py`), not product code.

On `--cpu` ComfyUI's `load_models_gpu` never frees memory, so budget arithmetic is checked by
calling `free_memory` directly on a *simulated* device (M55): ComfyUI's `get_free_memory` and
our `DeviceService.free_bytes` both report that device's free bytes, and ComfyUI's models count
against it through their `loaded_size()`. Imported after ComfyUI's `comfy` package is on
`sys.path` (and after `--cpu` was parsed).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
from torch import nn

from mizuoto_runtime import DeviceService, ModelHandle, ModelManager, VramPolicy
from mizuoto_runtime.app.comfy_bridge import ComfyAccounting, HandleAdapter

MB = 1 << 20
CPU = torch.device("cpu")
TOTAL = 24 * MB


class Stack(nn.Module):
    """A small fixed part and `n` units of exactly 1 MiB."""

    def __init__(self, n: int = 6, dim: int = 512) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(n))


class SharedDevice:
    """A fresh manager joined to ComfyUI (`mm` is `comfy.model_management`), on the shared
    simulated device of `total` bytes."""

    def __init__(self, mm: ModuleType, settings: dict[str, Any] | None = None, total: int = TOTAL) -> None:
        self.mm = mm
        self.total = total
        mm.current_loaded_models.clear()
        self.devices = DeviceService(simulate={"cpu": total}, strict=True)
        self.devices.free_bytes = lambda device: self.free()  # type: ignore[method-assign]
        mm.get_free_memory = self.get_free_memory
        self.manager = ModelManager(self.devices, VramPolicy(settings))
        self.accounting = ComfyAccounting(self.manager)
        self.manager.external = self.accounting

    def free(self) -> int:
        comfy_bytes = sum(e.model_loaded_memory() for e in self.mm.current_loaded_models
                          if e.model is not None and not isinstance(e.model, HandleAdapter))
        return self.total - self.devices.counted_bytes(CPU) - comfy_bytes

    def get_free_memory(self, dev: torch.device | None = None, torch_free_too: bool = False) -> object:
        return (self.free(), 0) if torch_free_too else self.free()

    def handle(self, name: str, units: int = 6) -> ModelHandle:
        handle = self.manager.register(Stack(units), engine="t", name=name)
        self.manager.load([handle])
        return handle

    def comfy_model(self, mb: int) -> Any:
        """A ComfyUI model (a real `ModelPatcher` of `mb` 1 MiB layers) loaded by ComfyUI."""
        import comfy.model_patcher

        module = nn.Sequential(*(nn.Linear(512, 512, bias=False) for _ in range(mb)))
        patcher = comfy.model_patcher.ModelPatcher(module, load_device=CPU, offload_device=CPU)
        self.mm.load_models_gpu([patcher])
        assert patcher.loaded_size() == mb * MB, patcher.loaded_size()
        return patcher

    def comfy_unet(self) -> Any:
        """ComfyUI's own diffusion UNet (SD's `UNetModel` with its spatial transformers, tiny
        widths, random weights, ComfyUI's `disable_weight_init` layers, which ComfyUI unloads
        module by module) in a real `ModelPatcher`, not loaded yet."""
        import comfy.model_patcher
        import comfy.ops
        from comfy.ldm.modules.diffusionmodules.openaimodel import UNetModel

        torch.manual_seed(0)
        unet = UNetModel(image_size=32, in_channels=4, model_channels=64, out_channels=4, num_res_blocks=1,
                         channel_mult=(1, 2), num_head_channels=32, use_spatial_transformer=True,
                         transformer_depth=[1, 1], transformer_depth_middle=1, transformer_depth_output=[1, 1, 1, 1],
                         context_dim=64, use_linear_in_transformer=True, operations=comfy.ops.disable_weight_init)
        for parameter in unet.parameters():  # disable_weight_init leaves them uninitialised
            torch.nn.init.normal_(parameter, std=0.02)
        return comfy.model_patcher.ModelPatcher(unet, load_device=CPU, offload_device=CPU)

    def entry_of(self, patcher: object) -> Any:
        return next(e for e in self.mm.current_loaded_models if e.model is patcher)

    def ours(self) -> list[ModelHandle]:
        return [e.model.model for e in self.mm.current_loaded_models if isinstance(e.model, HandleAdapter)]
