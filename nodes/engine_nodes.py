"""Memory Settings and Load TTS Engine: the process runtime's policy, and engines loaded into it;
the engine, checkpoint and precision inputs that the loader and the Text to Speech node share."""
from __future__ import annotations

import json
from typing import Any

from comfy_api.latest import io, ui

from mizuoto_runtime import DeviceService
from mizuoto_runtime.app.checkpoints import NONE, Catalog
from mizuoto_runtime.app.fit import engine_plan
from mizuoto_runtime.app.host import PROCESS
from mizuoto_runtime.app.ui_settings import from_fields
from mizuoto_runtime.engines import ENGINES
from mizuoto_runtime.errors import MizuotoError
from mizuoto_runtime.memory.policy import HOST_COPIES, VRAM_MODES
from mizuoto_runtime.memory.small_weights import CHOICES as WEIGHT_CHOICES
from mizuoto_runtime.memory.small_weights import PUBLISHED
from mizuoto_runtime.nn.dtypes import DTYPES

from . import paths
from .common import AUTO_LANGUAGE, CATEGORY, EngineSocket, MemorySocket, schema, speaker_value

MB = 1 << 20
ENGINE_TOOLTIP = "Which TTS engine speaks. The checkpoint list shows the folders this engine can load."


def engine_input(name: str, optional: bool = False) -> io.Input:
    return io.Combo.Input(name, options=sorted(ENGINES), default="demo", display_name="engine", tooltip=ENGINE_TOOLTIP,
                          optional=optional)


def checkpoint_input(catalog: Catalog, optional: bool = False) -> io.Input:
    """Every engine's checkpoints at definition time; the web extension shows the chosen
    engine's only, and `check_choice` refuses another engine's at queue time."""
    return io.Combo.Input("checkpoint", options=catalog.values() or [NONE], default=NONE, optional=optional,
                          tooltip=f"A checkpoint folder under models/{paths.FOLDER} (its type in parentheses), "
                                  "in the official layout; none = the engine's built-in weights (the demo engine's "
                                  "random weights; its audio is noise)")


FROM_SETTINGS = "from settings"  # the loader's weights: the compute.weights setting


def dtype_input(optional: bool = False) -> io.Input:
    return io.Combo.Input("dtype", options=list(DTYPES), default="float32", optional=optional,
                          tooltip="Precision the engine runs in: bfloat16 or float16 halve its memory")


def check_choice(engine: str, checkpoint: str, speaker: str | None = None, language: str | None = None) -> bool | str:
    """Queue-time check of an engine and checkpoint (and, when given, a speaker and language
    of that checkpoint): True, or the one message ComfyUI shows on the node."""
    if not isinstance(checkpoint, str):
        return True  # linked from another node: checked when the node runs
    try:
        info = paths.catalog().find(engine, checkpoint).info
    except MizuotoError as exc:
        return str(exc)
    speaker = speaker_value(speaker) if isinstance(speaker, str) else None
    if speaker is not None and speaker.lower() not in info.speakers:
        return (f"speaker {speaker!r}: checkpoint {checkpoint!r} has "
                + (f"these speakers: {', '.join(info.speakers)}" if info.speakers else "no built-in speakers (none)"))
    if isinstance(language, str) and language.strip().lower() not in ("", AUTO_LANGUAGE, *info.languages):
        return f"language {language!r}: checkpoint {checkpoint!r} takes {', '.join(info.languages) or 'auto'}"
    return True


class MizuotoMemorySettings(io.ComfyNode):
    """`compute.*` settings (M9, M10) for the graph it is in, over those of ComfyUI's settings
    dialog (`mizuoto_runtime.app.ui_settings`: defaults < dialog < this node)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return schema(
            node_id="MizuotoMemorySettings",
            display_name="TTS Memory Settings (VRAM)",
            category=CATEGORY,
            search_aliases=["vram", "low vram", "memory", "offload", "mizuoto settings"],
            description="How Mizuoto's TTS models use VRAM in this workflow: whole, partly, or streamed layer by "
                        "layer from RAM when VRAM is short (slower, same audio). Its values replace those of "
                        "Settings → Mizuoto while this workflow runs; workflows without this node use those. "
                        "Connect its output to Load TTS Engine to apply it before that engine loads.",
            is_output_node=True,
            inputs=[
                io.Combo.Input("vram_mode", options=list(VRAM_MODES), default="normal",
                               tooltip="high: load whole; shared: move whole; normal: partly only when VRAM is "
                                       "short; low: keep little on the GPU; none: stream every layer from RAM"),
                io.Int.Input("vram_reserve_mb", default=-1, min=-1, max=1 << 20,
                             tooltip="VRAM kept free for others; -1 = automatic"),
                io.Int.Input("vram_limit_mb", default=0, min=0, max=1 << 20,
                             tooltip="At most this much VRAM for Mizuoto; 0 = no limit"),
                io.Int.Input("async_offload", default=1, min=0, max=8,
                             tooltip="Streamed copies in flight ahead of the running layer"),
                io.Combo.Input("host_copies", options=list(HOST_COPIES), default="auto",
                               tooltip="Keep host copies of placed weights (moving off the device is then free)"),
                io.Boolean.Input("oom_retry", default=True,
                                 tooltip="On out-of-memory, run the step again with more streamed from RAM: "
                                         "same audio, slower"),
                io.Boolean.Input("oom_fallback", default=False,
                                 tooltip="When the retries still run out of memory, let engines use cheaper "
                                         "fallbacks (the output differs slightly); a node's allow_fallback toggle "
                                         "allows them for that node even when this is off"),
                io.Int.Input("simulate_vram_mb", default=0, min=0, max=1 << 20,
                             tooltip="Tests and demos: make the CPU act as a GPU of this many MB; 0 = off. "
                                     "Changing it reloads Mizuoto's engines."),
            ],
            outputs=[MemorySocket.Output(display_name="memory"), io.String.Output(display_name="policy")],
        )

    @classmethod
    def execute(cls, vram_mode: str, vram_reserve_mb: int, vram_limit_mb: int, async_offload: int,
                host_copies: str, oom_retry: bool, oom_fallback: bool, simulate_vram_mb: int) -> io.NodeOutput:
        # -1 / 0 mean automatic / no limit / off, as in the settings dialog (`from_fields`).
        settings = from_fields({
            "compute.vram_mode": vram_mode, "compute.vram_reserve_mb": vram_reserve_mb,
            "compute.vram_limit_mb": vram_limit_mb, "compute.async_offload": async_offload,
            "compute.host_copies": host_copies, "compute.oom_retry": oom_retry, "compute.oom_fallback": oom_fallback,
            "compute.simulate_vram_mb": simulate_vram_mb,
        })
        runtime = PROCESS.set_graph_settings(settings)  # over the settings dialog's, for this graph
        policy = json.dumps({**runtime.policy.describe(), "device": runtime.devices.describe()}, indent=1)
        return io.NodeOutput(settings, policy, ui=ui.PreviewText(policy))


class MizuotoEngineLoader(io.ComfyNode):
    """Loads an engine's components into the process runtime (host RAM; placed per phase, M1)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return schema(
            node_id="MizuotoEngineLoader",
            display_name="Load TTS Engine",
            category=CATEGORY,
            search_aliases=["tts model", "load tts", "speech model", "qwen3-tts loader", "mizuoto loader"],
            description="Loads a TTS engine and checkpoint for the step-by-step nodes (or a Text to Speech node's "
                        "engine input). Its parts go to the GPU only while a step uses them.",
            inputs=[
                engine_input("engine"),
                checkpoint_input(paths.catalog()),
                dtype_input(),
                MemorySocket.Input("memory", optional=True,
                                   tooltip="From TTS Memory Settings: applied before the engine loads"),
                # Optional, after the others: saved workflows and API prompts without it still load.
                io.Combo.Input("device", options=device_choices(), default="auto", optional=True,
                               tooltip="Where the engine runs; auto = ComfyUI's device (or the simulated one)"),
                io.Combo.Input("weights", options=[FROM_SETTINGS, *WEIGHT_CHOICES], default=FROM_SETTINGS,
                               optional=True,
                               tooltip="How its Linear and Conv weights are stored. fp8 and int8 halve a bfloat16 "
                                       "model's RAM, VRAM and streamed bytes, and change the audio slightly; "
                                       "phases that refuse one keep theirs as published. from settings = the "
                                       "Mizuoto setting (as published unless changed)"),
            ],
            outputs=[EngineSocket.Output(display_name="engine"),
                     io.String.Output(display_name="memory",
                                      tooltip="Before the first run: for a 20 s line, what each step will keep on "
                                              "the GPU and what it will stream from RAM, with the VRAM free now "
                                              "(JSON; the node shows it in words)")],
        )

    @classmethod
    def validate_inputs(cls, engine: str, checkpoint: str) -> bool | str:
        return check_choice(engine, checkpoint)

    @classmethod
    @PROCESS.around_node
    def execute(cls, engine: str, checkpoint: str, dtype: str, memory: dict[str, Any] | None = None,
                device: str = "auto", weights: str = FROM_SETTINGS) -> io.NodeOutput:
        if memory is not None:
            PROCESS.set_graph_settings(memory)
        ref = PROCESS.engine(engine, paths.resolve(engine, checkpoint), dtype, device,
                             None if weights == FROM_SETTINGS else weights)
        components = ", ".join(f"{h.name} {h.size_bytes / MB:.1f} MB"
                               + (f" {h.weights}" if h.weights != PUBLISHED else "") for h in ref.engine.handles())
        plan = engine_plan(ref.engine)
        text = "\n".join([f"{engine} ({dtype}, {ref.engine.device}): {components}", *plan["lines"]])
        return io.NodeOutput(ref, json.dumps(plan), ui=ui.PreviewText(text))


def device_choices() -> list[str]:
    """auto, then every device this machine has (the compute device first, then the CPU)."""
    return ["auto", *dict.fromkeys(str(d) for d in DeviceService().devices())]


NODES: list[type[io.ComfyNode]] = [MizuotoMemorySettings, MizuotoEngineLoader]
