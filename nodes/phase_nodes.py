"""One node per engine phase (M1) — voice prompt, talker, codec decoder — and the all-in-one TTS.

Each node runs its phase through the process runtime: only that phase's components are placed,
ComfyUI's progress bar follows the tokens, `/interrupt` stops it between tokens and between
streamed copies, and the node shows its `meta.memory` (M50).
"""
from __future__ import annotations

from typing import Any

from comfy_api.latest import io, ui

from mizuoto_runtime.comfy_bridge import ProgressReporter, interrupt_check, node_request
from mizuoto_runtime.host import PROCESS, EngineRef, fallback_switch
from mizuoto_runtime.engines import Codes, Voice

from .common import (
    CATEGORY, FALLBACK_TOOLTIP, CodesSocket, EngineSocket, VoiceSocket, audio_in, audio_out, check_made_by,
    language_input, memory_json, memory_text, phased_engine, sampling_from, sampling_inputs,
)


def voice_inputs() -> list[io.Input]:
    """Optional inputs of a voice; new ones go last, so saved workflows keep their widget values."""
    return [
        io.Audio.Input("reference", optional=True, tooltip="Reference speech to clone (first item of a batch)"),
        io.String.Input("transcript", optional=True, multiline=True, default="",
                        tooltip="What the reference says (engines that use it)"),
        io.String.Input("speaker", optional=True, default="", tooltip="A built-in speaker (engines that have them)"),
        io.String.Input("instruct", optional=True, multiline=True, default="",
                        tooltip="A description of the voice or speaking style (Qwen3-TTS CustomVoice and "
                                "VoiceDesign checkpoints); empty = none"),
    ]


class MizuotoVoicePrompt(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="MizuotoVoicePrompt",
            display_name="Mizuoto Voice Prompt",
            category=CATEGORY,
            description="Encodes a reference voice (voice-prompt phase). A voice seen before comes from the "
                        "engine's cache without placing the encoder (M4).",
            inputs=[EngineSocket.Input("engine"), *voice_inputs()],
            outputs=[VoiceSocket.Output(display_name="voice")],
        )

    @classmethod
    @PROCESS.around_node
    def execute(cls, engine: EngineRef, reference: dict[str, Any] | None = None, transcript: str = "",
                speaker: str = "", instruct: str = "") -> io.NodeOutput:
        tts = phased_engine(engine, "Mizuoto Voice Prompt")
        ctx = node_request(engine.runtime)
        voice = tts.voice_prompt(ctx, audio_in(reference, "reference"), transcript or None, speaker or None,
                                 instruct=instruct or None)
        return io.NodeOutput(voice, ui=ui.PreviewText(memory_text(ctx.meta)))


class MizuotoTalker(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="MizuotoTalker",
            display_name="Mizuoto Talker",
            category=CATEGORY,
            description="Generates speech codes from text and a voice (talker phase).",
            inputs=[
                EngineSocket.Input("engine"),
                io.String.Input("text", multiline=True, default="Hello from Mizuoto."),
                VoiceSocket.Input("voice", optional=True, tooltip="From Mizuoto Voice Prompt; default: the engine's"),
                *sampling_inputs(),
                language_input(),
            ],
            outputs=[CodesSocket.Output(display_name="codes")],
        )

    @classmethod
    @PROCESS.around_node
    def execute(cls, engine: EngineRef, text: str, seed: int, temperature: float, top_k: int, top_p: float,
                repetition_penalty: float, max_new_tokens: int, do_sample: bool,
                voice: Voice | None = None, language: str = "") -> io.NodeOutput:
        tts = phased_engine(engine, "Mizuoto Talker")
        sampling = sampling_from(seed, temperature, top_k, top_p, repetition_penalty, max_new_tokens, do_sample,
                                 language)
        ctx = node_request(engine.runtime, seed)
        if voice is None:
            voice = tts.voice_prompt(ctx)
        check_made_by(voice, tts, "voice")
        codes = tts.generate(ctx, text, voice, sampling)
        return io.NodeOutput(codes, ui=ui.PreviewText(memory_text(ctx.meta)))


class MizuotoDecoder(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="MizuotoDecoder",
            display_name="Mizuoto Codec Decoder",
            category=CATEGORY,
            description="Turns speech codes into audio (codec-decoder phase).",
            inputs=[
                EngineSocket.Input("engine"),
                CodesSocket.Input("codes"),
                io.Boolean.Input("allow_fallback", default=False, tooltip=FALLBACK_TOOLTIP),
            ],
            outputs=[io.Audio.Output(display_name="audio"), io.String.Output(display_name="memory")],
        )

    @classmethod
    @PROCESS.around_node
    def execute(cls, engine: EngineRef, codes: Codes, allow_fallback: bool) -> io.NodeOutput:
        tts = phased_engine(engine, "Mizuoto Codec Decoder")
        check_made_by(codes, tts, "codes")
        ctx = node_request(engine.runtime)
        audio = tts.decode(ctx, codes, fallback_switch(allow_fallback))
        meta = ctx.meta
        return io.NodeOutput(audio_out(audio), memory_json(meta), ui=ui.PreviewText(memory_text(meta)))


class MizuotoTTS(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="MizuotoTTS",
            display_name="Mizuoto TTS",
            category=CATEGORY,
            description="Text to speech in one node: voice prompt, talker and decoder phases in turn.",
            inputs=[
                EngineSocket.Input("engine"),
                io.String.Input("text", multiline=True, default="Hello from Mizuoto."),
                *sampling_inputs(),
                io.Boolean.Input("allow_fallback", default=False, tooltip=FALLBACK_TOOLTIP),
                *voice_inputs(),
                language_input(),
            ],
            outputs=[io.Audio.Output(display_name="audio"), io.String.Output(display_name="memory")],
        )

    @classmethod
    @PROCESS.around_node
    def execute(cls, engine: EngineRef, text: str, seed: int, temperature: float, top_k: int, top_p: float,
                repetition_penalty: float, max_new_tokens: int, do_sample: bool, allow_fallback: bool,
                reference: dict[str, Any] | None = None, transcript: str = "", speaker: str = "",
                instruct: str = "", language: str = "") -> io.NodeOutput:
        sampling = sampling_from(seed, temperature, top_k, top_p, repetition_penalty, max_new_tokens, do_sample,
                                 language)
        audio, meta = engine.runtime.say(
            engine.engine, text, reference=audio_in(reference, "reference"), transcript=transcript or None,
            speaker=speaker or None, instruct=instruct or None, sampling=sampling,
            allow_fallback=fallback_switch(allow_fallback), cancel_check=interrupt_check,
            on_progress=ProgressReporter(),
        )
        return io.NodeOutput(audio_out(audio), memory_json(meta), ui=ui.PreviewText(memory_text(meta)))


NODES: list[type[io.ComfyNode]] = [MizuotoVoicePrompt, MizuotoTalker, MizuotoDecoder, MizuotoTTS]
