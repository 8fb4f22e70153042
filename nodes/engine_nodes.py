"""Memory Settings and Engine Loader: the process runtime's policy, and engines loaded into it."""
from __future__ import annotations

import json
from typing import Any

from comfy_api.latest import io, ui

from mizuoto_runtime import DeviceService
from mizuoto_runtime.host import PROCESS
from mizuoto_runtime.engines import ENGINES
from mizuoto_runtime.policy import HOST_COPIES, VRAM_MODES
from mizuoto_runtime.runtime import DTYPES

from . import paths
from .common import CATEGORY, EngineSocket, MemorySocket

MB = 1 << 20


class MizuotoMemorySettings(io.ComfyNode):
    """`compute.*` settings (M9, M10) for every Mizuoto node in this ComfyUI process."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="MizuotoMemorySettings",
            display_name="Mizuoto Memory Settings",
            category=CATEGORY,
            description="Sets how Mizuoto places its models for the whole ComfyUI process. It runs on its own; "
                        "connect its output to a Mizuoto Engine Loader to apply the settings before that loads.",
            is_output_node=True,
            inputs=[
                io.Combo.Input("vram_mode", options=list(VRAM_MODES), default="normal",
                               tooltip="high: load whole; shared: move whole; normal: partial only when needed; "
                                       "low: small resident share; none: stream everything (M9)"),
                io.Int.Input("vram_reserve_mb", default=-1, min=-1, max=1 << 20,
                             tooltip="VRAM kept free for others; -1 = automatic"),
                io.Int.Input("vram_limit_mb", default=0, min=0, max=1 << 20,
                             tooltip="At most this much VRAM for Mizuoto; 0 = no limit"),
                io.Int.Input("async_offload", default=1, min=0, max=8,
                             tooltip="Streamed copies in flight ahead of the running layer"),
                io.Combo.Input("host_copies", options=list(HOST_COPIES), default="auto",
                               tooltip="Keep host copies of placed weights (moving off the device is then free)"),
                io.Boolean.Input("oom_retry", default=True,
                                 tooltip="M40: on out-of-memory, retry exactly with more streamed"),
                io.Boolean.Input("oom_fallback", default=False,
                                 tooltip="M42: after out-of-memory, let engines use cheaper fallbacks (output "
                                         "differs slightly); a node's allow_fallback toggle allows them for "
                                         "that node even when this is off"),
                io.Int.Input("simulate_vram_mb", default=0, min=0, max=1 << 20,
                             tooltip="Tests: make the CPU act as a GPU of this size (M55); 0 = off. "
                                     "Changing it reloads Mizuoto's engines."),
            ],
            outputs=[MemorySocket.Output(display_name="memory"), io.String.Output(display_name="policy")],
        )

    @classmethod
    def execute(cls, vram_mode: str, vram_reserve_mb: int, vram_limit_mb: int, async_offload: int,
                host_copies: str, oom_retry: bool, oom_fallback: bool, simulate_vram_mb: int) -> io.NodeOutput:
        settings: dict[str, Any] = {
            "compute.vram_mode": vram_mode,
            "compute.vram_reserve_mb": None if vram_reserve_mb < 0 else vram_reserve_mb,
            "compute.vram_limit_mb": vram_limit_mb or None,
            "compute.async_offload": async_offload,
            "compute.host_copies": host_copies,
            "compute.oom_retry": oom_retry,
            "compute.oom_fallback": oom_fallback,
            "compute.simulate_vram_mb": simulate_vram_mb or None,
        }
        runtime = PROCESS.configure(settings)
        policy = json.dumps({**runtime.policy.describe(), "device": runtime.devices.describe()}, indent=1)
        return io.NodeOutput(settings, policy, ui=ui.PreviewText(policy))


class MizuotoEngineLoader(io.ComfyNode):
    """Loads an engine's components into the process runtime (host RAM; placed per phase, M1)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="MizuotoEngineLoader",
            display_name="Mizuoto Engine Loader",
            category=CATEGORY,
            description="Loads a TTS engine. Its components go to the device only for the phases that use them.",
            inputs=[
                io.Combo.Input("engine", options=sorted(ENGINES), default="demo"),
                io.Combo.Input("checkpoint", options=paths.checkpoint_choices(), default=paths.NONE,
                               tooltip=f"A folder under models/{paths.FOLDER}; 'none' = the engine's built-in "
                                       "weights (the demo engine's random weights)"),
                io.Combo.Input("dtype", options=list(DTYPES), default="float32"),
                MemorySocket.Input("memory", optional=True,
                                   tooltip="From Mizuoto Memory Settings: applied before the engine loads"),
                # Optional, after the others: saved workflows and API prompts without it still load.
                io.Combo.Input("device", options=device_choices(), default="auto", optional=True,
                               tooltip="Where the engine runs; auto = ComfyUI's device (or the simulated one)"),
            ],
            outputs=[EngineSocket.Output(display_name="engine")],
        )

    @classmethod
    @PROCESS.around_node
    def execute(cls, engine: str, checkpoint: str, dtype: str, memory: dict[str, Any] | None = None,
                device: str = "auto") -> io.NodeOutput:
        if memory is not None:
            PROCESS.configure(memory)
        ref = PROCESS.engine(engine, paths.resolve(checkpoint), dtype, device)
        components = ", ".join(f"{h.name} {h.size_bytes / MB:.1f} MB" for h in ref.engine.handles())
        return io.NodeOutput(ref, ui=ui.PreviewText(f"{engine} ({dtype}, {ref.engine.device}): {components}"))


def device_choices() -> list[str]:
    """auto, then every device this machine has (the compute device first, then the CPU)."""
    return ["auto", *dict.fromkeys(str(d) for d in DeviceService().devices())]


NODES: list[type[io.ComfyNode]] = [MizuotoMemorySettings, MizuotoEngineLoader]
