"""Save Audio (WAV): ComfyUI's own audio savers write FLAC, MP3 or Opus; TTS users often want
16-bit PCM WAV, which the runtime writes with the standard library (no codec package)."""
from __future__ import annotations

from typing import Any

import folder_paths
from comfy_api.latest import io

from mizuoto_runtime import write_wav

from .common import CATEGORY, audio_in, schema


class MizuotoSaveWav(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return schema(
            node_id="MizuotoSaveWav",
            display_name="Save Audio (WAV)",
            category=CATEGORY,
            search_aliases=["save wav", "wav", "export audio", "write audio"],
            description="Saves each item of an AUDIO batch as a 16-bit PCM WAV file in ComfyUI's output folder.",
            inputs=[
                io.Audio.Input("audio"),
                io.String.Input("filename_prefix", default="audio/mizuoto",
                                tooltip="Folder and file name start under ComfyUI's output folder"),
            ],
            outputs=[],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, audio: dict[str, Any], filename_prefix: str) -> io.NodeOutput:
        folder, name, counter, subfolder, _ = folder_paths.get_save_image_path(
            filename_prefix, folder_paths.get_output_directory())
        saved = []
        for index in range(audio["waveform"].shape[0]):
            item = audio_in({"waveform": audio["waveform"][index:index + 1], "sample_rate": audio["sample_rate"]},
                            "audio")
            assert item is not None
            filename = f"{name}_{counter + index:05}_.wav"
            write_wav(f"{folder}/{filename}", item)
            saved.append({"filename": filename, "subfolder": subfolder, "type": "output"})
        return io.NodeOutput(ui={"audio": saved})


NODES: list[type[io.ComfyNode]] = [MizuotoSaveWav]
