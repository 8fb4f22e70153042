"""Text to Speech (one node: engine, checkpoint, voice and long text on the node itself), and one
node per engine phase (M1) for step-by-step graphs: Voice Clone / Voice Design (voice prompt),
Text → Speech Codes (talker), Speech Codes → Audio (codec decoder).

Each node runs its phases through the process runtime: only that phase's components are placed,
ComfyUI's progress bar follows the tokens (and the chunks of a long text), `/interrupt` stops it
between tokens and between streamed copies, and the node shows its `meta.memory` (M50).

Text to Speech takes its engine from its own engine and checkpoint widgets, or from its optional
engine input when that is connected; both run `Runtime.say`, the same phases. It outputs the
engine it used, so ComfyUI's output cache keeps that engine loaded between runs.

Node ids and the order of existing widgets never change (saved workflows keep their values):
new inputs go last. Text to Speech shows only inputs every engine reads; options one engine
reads (IndexTTS-2's emotion) arrive through its `options` socket. Its emotion widgets of the
previous release were its last ones, so a saved workflow's values still fill the same widgets
(the frontend drops the values past them); of those inputs ComfyUI still passes the linked
ones (an emotion_audio), and they are still applied (`saved_emotion`).
"""
from __future__ import annotations

from typing import Any

from comfy_api.latest import io, ui

from mizuoto_runtime.app.chunking import CROSSFADE_MS, DEFAULT_CHUNK_CHARS, MIN_CHUNK_CHARS, TextChunking
from mizuoto_runtime.app.comfy_bridge import ProgressReporter, interrupt_check, node_request
from mizuoto_runtime.app.host import PROCESS, EngineRef, fallback_switch
from mizuoto_runtime.engines import Codes, Voice

from . import paths
from .common import (
    CATEGORY,
    FALLBACK_TOOLTIP,
    NO_SPEAKER,
    STEPS_CATEGORY,
    CodesSocket,
    EngineSocket,
    OptionsSocket,
    VoiceSocket,
    audio_in,
    audio_out,
    check_made_by,
    language_input,
    linked_type_errors,
    memory_json,
    memory_text,
    phased_engine,
    sampling_from,
    sampling_inputs,
    schema,
    speaker_input,
    speaker_value,
)
from .engine_nodes import check_choice, checkpoint_input, dtype_input, engine_input
from .indextts_nodes import saved_emotion

VOICE_TOOLTIPS = {
    "reference": "Speech to clone (Qwen3-TTS Base checkpoints); the first item of a batch",
    "transcript": "What the reference says: a closer clone where the engine uses it (Qwen3-TTS Base); "
                  "empty = clone the voice's timbre only",
    "instruct": "Describe the voice or speaking style in words (Qwen3-TTS VoiceDesign, and the 1.7B "
                "CustomVoice; IndexTTS-2: the emotion, read by its emotion model); empty = none",
}


def voice_inputs() -> list[io.Input]:
    """Optional inputs of a voice; new ones go last, so saved workflows keep their widget values."""
    catalog = paths.catalog()
    return [
        io.Audio.Input("reference", optional=True, tooltip=VOICE_TOOLTIPS["reference"]),
        io.String.Input("transcript", optional=True, multiline=True, default="", tooltip=VOICE_TOOLTIPS["transcript"]),
        speaker_input(catalog.speakers()),
        io.String.Input("instruct", optional=True, multiline=True, default="", tooltip=VOICE_TOOLTIPS["instruct"]),
    ]


def long_text_inputs() -> list[io.Input]:
    return [
        io.Boolean.Input("split_long_text", default=True, optional=True,
                         tooltip=f"Cut long text at sentence ends into chunks of at most chunk_chars characters, "
                                 f"speak them one after another and join them with a {CROSSFADE_MS:g} ms "
                                 "crossfade (same seed, same audio). Off: the whole text in one go"),
        io.Int.Input("chunk_chars", default=DEFAULT_CHUNK_CHARS, min=MIN_CHUNK_CHARS, max=10_000, optional=True,
                     tooltip=f"Longest chunk, in characters (default {DEFAULT_CHUNK_CHARS}: about 12 s of English "
                             "or 40 s of Chinese speech)"),
    ]


class MizuotoVoicePrompt(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return schema(
            node_id="MizuotoVoicePrompt",
            display_name="Voice Clone / Voice Design",
            category=STEPS_CATEGORY,
            search_aliases=["voice clone", "clone voice", "voice design", "reference audio", "speaker",
                            "voice prompt"],
            description="Makes the voice for Text → Speech Codes: clone it from reference speech (Qwen3-TTS Base), "
                        "pick a built-in speaker (CustomVoice) or describe it in words (VoiceDesign). A voice "
                        "used before comes from the engine's cache at once.",
            inputs=[EngineSocket.Input("engine"), *voice_inputs()],
            outputs=[VoiceSocket.Output(display_name="voice")],
        )

    @classmethod
    def validate_inputs(cls, speaker: str = NO_SPEAKER) -> bool:
        return True  # the engine behind the socket checks its speakers when the node runs

    @classmethod
    @PROCESS.around_node
    def execute(cls, engine: EngineRef, reference: dict[str, Any] | None = None, transcript: str = "",
                speaker: str = NO_SPEAKER, instruct: str = "") -> io.NodeOutput:
        tts = phased_engine(engine, "Voice Clone / Voice Design")
        ctx = node_request(engine.runtime)
        voice = tts.voice_prompt(ctx, audio_in(reference, "reference"), transcript or None, speaker_value(speaker),
                                 instruct=instruct or None)
        return io.NodeOutput(voice, ui=ui.PreviewText(memory_text(ctx.meta)))


class MizuotoTalker(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return schema(
            node_id="MizuotoTalker",
            display_name="Text → Speech Codes",
            category=STEPS_CATEGORY,
            search_aliases=["text to speech", "tts", "talker", "speech codes", "generate speech"],
            description="The first half of text to speech: the engine's language model turns text into speech "
                        "codes in the given voice. Speech Codes → Audio makes them audible.",
            inputs=[
                EngineSocket.Input("engine"),
                io.String.Input("text", multiline=True, default="Hello from Mizuoto.", tooltip="What to say"),
                VoiceSocket.Input("voice", optional=True,
                                  tooltip="From Voice Clone / Voice Design; default: the engine's own voice"),
                *sampling_inputs(),
                language_input(paths.catalog().languages()),
            ],
            outputs=[CodesSocket.Output(display_name="codes")],
        )

    @classmethod
    def validate_inputs(cls, language: str = "") -> bool:
        return True  # the engine behind the socket checks its languages when the node runs

    @classmethod
    @PROCESS.around_node
    def execute(cls, engine: EngineRef, text: str, seed: int, temperature: float, top_k: int, top_p: float,
                repetition_penalty: float, max_new_tokens: int, do_sample: bool,
                voice: Voice | None = None, language: str = "") -> io.NodeOutput:
        tts = phased_engine(engine, "Text → Speech Codes")
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
        return schema(
            node_id="MizuotoDecoder",
            display_name="Speech Codes → Audio",
            category=STEPS_CATEGORY,
            search_aliases=["codec decoder", "vocoder", "decode speech", "codes to audio"],
            description="The second half of text to speech: the engine's codec decoder turns speech codes into "
                        "audio.",
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
        tts = phased_engine(engine, "Speech Codes → Audio")
        check_made_by(codes, tts, "codes")
        ctx = node_request(engine.runtime)
        audio = tts.decode(ctx, codes, fallback_switch(allow_fallback))
        meta = ctx.meta
        return io.NodeOutput(audio_out(audio), memory_json(meta), ui=ui.PreviewText(memory_text(meta)))


class MizuotoTTS(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        catalog = paths.catalog()
        return schema(
            node_id="MizuotoTTS",
            display_name="Text to Speech",
            category=CATEGORY,
            search_aliases=["tts", "text to speech", "speech synthesis", "say", "read aloud", "voice",
                            "qwen3-tts", "voice clone", "mizuoto"],
            description="Speaks text in one node: choose the engine and checkpoint below (or connect a Load TTS "
                        "Engine), a speaker, reference speech to clone or a voice description. Long text is cut "
                        "at sentence ends and joined. The demo engine needs no download; its audio is noise.",
            inputs=[
                EngineSocket.Input("engine", optional=True, display_name="loaded engine",
                                   tooltip="Optional: an engine from Load TTS Engine; when connected it replaces "
                                           "the engine, checkpoint and dtype chosen on this node"),
                io.String.Input("text", multiline=True, default="Hello from Mizuoto.", tooltip="What to say"),
                *sampling_inputs(),
                io.Boolean.Input("allow_fallback", default=False, tooltip=FALLBACK_TOOLTIP),
                *voice_inputs(),
                language_input(catalog.languages()),
                engine_input("engine_name", optional=True),
                checkpoint_input(catalog, optional=True),
                dtype_input(optional=True),
                *long_text_inputs(),
                OptionsSocket.Input("options", optional=True,
                                    tooltip="Options one engine reads, e.g. IndexTTS-2's emotion from Emotion "
                                            "Options (IndexTTS-2)"),
            ],
            outputs=[io.Audio.Output(display_name="audio"), io.String.Output(display_name="memory"),
                     EngineSocket.Output(display_name="engine")],
        )

    @classmethod
    def validate_inputs(cls, input_types: dict[str, Any], engine_name: str = "demo", checkpoint: str = "none",
                        speaker: str = NO_SPEAKER, language: str = "") -> bool | str:
        """The node's own engine and checkpoint, and its speaker and language against that
        checkpoint, unless an engine is connected (then that engine checks them as it runs).
        Declaring `input_types` tells which inputs are linked, and leaves the links' types to
        this check."""
        linked = linked_type_errors(cls, input_types)
        if linked:
            return linked
        if "engine" in input_types:
            return True
        return check_choice(engine_name, checkpoint, speaker, language)

    @classmethod
    @PROCESS.around_node
    def execute(cls, text: str, seed: int, temperature: float, top_k: int, top_p: float,
                repetition_penalty: float, max_new_tokens: int, do_sample: bool, allow_fallback: bool,
                engine: EngineRef | None = None, reference: dict[str, Any] | None = None, transcript: str = "",
                speaker: str = NO_SPEAKER, instruct: str = "", language: str = "", engine_name: str = "demo",
                checkpoint: str = "none", dtype: str = "float32", split_long_text: bool = True,
                chunk_chars: int = DEFAULT_CHUNK_CHARS, options: dict[str, Any] | None = None,
                **saved: Any) -> io.NodeOutput:
        if engine is None:  # the node's own choice; the output keeps it loaded between runs
            engine = PROCESS.engine(engine_name, paths.resolve(engine_name, checkpoint), dtype)
        sampling = sampling_from(seed, temperature, top_k, top_p, repetition_penalty, max_new_tokens, do_sample,
                                 language)
        audio, meta = engine.runtime.say(
            engine.engine, text, reference=audio_in(reference, "reference"), transcript=transcript or None,
            speaker=speaker_value(speaker), instruct=instruct or None, sampling=sampling,
            allow_fallback=fallback_switch(allow_fallback), cancel_check=interrupt_check,
            on_progress=ProgressReporter(), chunking=TextChunking(enabled=split_long_text, max_chars=chunk_chars),
            voice_options=options if options is not None else saved_emotion(saved),
        )
        return io.NodeOutput(audio_out(audio), memory_json(meta), engine, ui=ui.PreviewText(memory_text(meta)))


NODES: list[type[io.ComfyNode]] = [MizuotoVoicePrompt, MizuotoTalker, MizuotoDecoder, MizuotoTTS]
