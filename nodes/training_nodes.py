"""Training nodes: train a Qwen3-TTS LoRA (its own process, owning the device, M60) and apply a
LoRA to a loaded engine (merged through the talker's handle, M28).

LoRA files live under ComfyUI's ``models/loras/mizuoto/``; the LoRA node lists them there.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import folder_paths
from comfy_api.latest import io, ui

from mizuoto_runtime import MizuotoError
from mizuoto_runtime.app.comfy_bridge import ProgressReporter, interrupt_check
from mizuoto_runtime.app.host import PROCESS, EngineRef
from mizuoto_runtime.app.training.job import TrainingJob
from mizuoto_runtime.app.training.memory import PRESET_NAMES
from mizuoto_runtime.app.training.qwen3tts_lora import DEFAULTS, METHOD
from mizuoto_runtime.engines import LoraChoice

from .common import CATEGORY, SEED_MAX, EngineSocket, schema

log = logging.getLogger(__name__)

LORA_FOLDER = "loras"  # ComfyUI's own folder for LoRA files
SUBFOLDER = "mizuoto"
NONE = "none"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
TRAIN_TITLE = "Train Voice LoRA (Qwen3-TTS)"
APPLY_TITLE = "Apply Voice LoRA (Qwen3-TTS)"
MEMORY_TOOLTIP = ("training.memory — default: fastest; low: gradient checkpointing and the optimizer's state in host "
                  "RAM; lowest: also activations in host RAM and no huge pages (least device memory, slowest)")


def lora_dir() -> Path:
    return Path(folder_paths.get_folder_paths(LORA_FOLDER)[0]) / SUBFOLDER


def lora_choices() -> list[str]:
    """`none`, then every LoRA file under loras/mizuoto/ (as ComfyUI names them, with "/")."""
    names = (n.replace("\\", "/") for n in folder_paths.get_filename_list(LORA_FOLDER))
    return [NONE, *sorted(n for n in names if n.startswith(SUBFOLDER + "/") and n.endswith(".safetensors"))]


def resolve_lora(name: str) -> Path:
    path = folder_paths.get_full_path(LORA_FOLDER, name)
    if path is None:
        raise MizuotoError(f"LoRA {name!r}: no such file under models/{LORA_FOLDER}")
    return Path(path)


def resolve_dataset(text: str) -> Path:
    """A folder path as typed: absolute, or relative to ComfyUI's input folder."""
    path = Path(text.strip()).expanduser()
    return path if path.is_absolute() else Path(folder_paths.get_input_directory()) / path


def qwen3tts_folder(engine: EngineRef, node: str) -> str:
    engine_id, model_dir, *_ = engine.key
    if engine_id != "qwen3tts" or not model_dir:
        raise MizuotoError(f"{node}: needs a qwen3tts engine loaded from a checkpoint folder, got {engine_id!r}")
    return model_dir


class MizuotoTrainQwen3TTSLoRA(io.ComfyNode):
    """Fine-tunes the talker of a Qwen3-TTS Base checkpoint on a folder of clips (issue 16)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return schema(
            node_id="MizuotoTrainQwen3TTSLoRA",
            display_name=TRAIN_TITLE,
            category=CATEGORY,
            search_aliases=["fine-tune voice", "train tts", "voice lora", "qwen3-tts lora", "mizuoto training"],
            description="Trains a LoRA of the Qwen3-TTS talker on your clips, in its own process. While it trains it "
                        "has the device to itself: idle models are moved off first. Outputs the engine with the "
                        "LoRA applied and the LoRA's name under models/loras.",
            is_output_node=True,
            inputs=[
                EngineSocket.Input("engine", tooltip="A Qwen3-TTS Base checkpoint from Load TTS Engine"),
                io.String.Input("dataset", default="mizuoto_voice",
                                tooltip="A folder of clips (.wav, .flac), each with a .txt transcript of the same "
                                        "name; absolute, or relative to ComfyUI's input folder"),
                io.String.Input("lora_name", default="my_voice",
                                tooltip=f"Saved as models/{LORA_FOLDER}/{SUBFOLDER}/<name>.safetensors"),
                io.Combo.Input("memory", options=list(PRESET_NAMES), default="default", tooltip=MEMORY_TOOLTIP),
                io.Int.Input("steps", default=DEFAULTS["steps"], min=1, max=1_000_000),
                io.Int.Input("batch_size", default=DEFAULTS["batch_size"], min=1, max=256),
                io.Float.Input("learning_rate", default=DEFAULTS["lr"], min=0.0, max=1.0, step=1e-5),
                io.Int.Input("rank", default=DEFAULTS["rank"], min=1, max=512),
                io.Int.Input("seed", default=0, min=0, max=SEED_MAX),
                io.String.Input("language", optional=True, default="",
                                tooltip="The clips' language (english, chinese, …); empty = auto"),
            ],
            outputs=[EngineSocket.Output(display_name="engine"), io.String.Output(display_name="lora")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    @PROCESS.around_node
    def execute(cls, engine: EngineRef, dataset: str, lora_name: str, memory: str, steps: int, batch_size: int,
                learning_rate: float, rank: int, seed: int, language: str = "") -> io.NodeOutput:
        node = TRAIN_TITLE
        if not NAME.match(lora_name):
            raise MizuotoError(f"{node}: lora_name {lora_name!r} must be a file name (letters, digits, . _ -)")
        params = {"model": qwen3tts_folder(engine, node), "data": str(resolve_dataset(dataset)),
                  "output": str(lora_dir() / f"{lora_name}.safetensors"), "steps": steps, "batch_size": batch_size,
                  "lr": learning_rate, "rank": rank, "seed": seed, "language": language.strip() or "auto"}
        job = TrainingJob(engine.runtime, METHOD, params, memory=memory, device=engine.engine.device,
                          on_event=_Progress(cls.hidden.unique_id), cancel_check=interrupt_check)
        result = job.run()
        losses = result["losses"]
        peaks = ", ".join(f"{k} {v:.0f} MB" for k, v in result["memory/peak_mb"].items())
        lines = [f"{lora_name}: {len(losses)} steps, loss {losses[0]:.4f} → {losses[-1]:.4f}",
                 f"training.memory={memory}; peak {peaks}", *result["warnings"]]
        name = f"{SUBFOLDER}/{lora_name}.safetensors"
        trained = engine.with_lora(LoraChoice(Path(result["output"])))
        return io.NodeOutput(trained, name, ui=ui.PreviewText("\n".join(lines)))


class _Progress:
    """Training events on the node: the progress bar (which also honours interrupt) and the loss."""

    def __init__(self, node_id: str | None) -> None:
        self.node_id = node_id
        self.bar = ProgressReporter()

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "step":
            self.bar(event["step"], event["steps"])
            self._text(f"step {event['step']}/{event['steps']}  loss {event['loss']:.4f}")
        elif kind == "phase":
            self._text(f"{event['name']}: peak {event['memory/peak_mb']:.0f} MB")
        elif kind == "warning":
            self._text(str(event["message"]))

    def _text(self, text: str) -> None:
        from server import PromptServer

        server = getattr(PromptServer, "instance", None)
        if server is not None and self.node_id is not None:
            server.send_progress_text(text, self.node_id)


class MizuotoQwen3TTSLoRA(io.ComfyNode):
    """Applies a LoRA file to a Qwen3-TTS engine (merged into the talker's weights)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return schema(
            node_id="MizuotoQwen3TTSLoRA",
            display_name=APPLY_TITLE,
            category=CATEGORY,
            search_aliases=["load voice lora", "voice lora", "qwen3-tts lora", "mizuoto lora"],
            description="Applies a LoRA trained by Mizuoto to a Qwen3-TTS engine. Nodes using the output run with "
                        "the LoRA; nodes using the loader's own output run without it.",
            inputs=[
                EngineSocket.Input("engine"),
                io.Combo.Input("lora", options=lora_choices(), default=NONE,
                               tooltip=f"A file under models/{LORA_FOLDER}/{SUBFOLDER}/"),
                io.Float.Input("strength", default=1.0, min=-4.0, max=4.0, step=0.05),
            ],
            outputs=[EngineSocket.Output(display_name="engine")],
        )

    @classmethod
    @PROCESS.around_node
    def execute(cls, engine: EngineRef, lora: str, strength: float) -> io.NodeOutput:
        qwen3tts_folder(engine, APPLY_TITLE)
        choice = None if lora == NONE else LoraChoice(resolve_lora(lora), strength)
        ref = engine.with_lora(choice)
        _ = ref.engine  # applied now: a bad file fails at this node
        return io.NodeOutput(ref)


NODES: list[type[io.ComfyNode]] = [MizuotoTrainQwen3TTSLoRA, MizuotoQwen3TTSLoRA]
