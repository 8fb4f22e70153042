"""IndexTTS-2's emotion control as a step-by-step node: a voice from Voice Clone, made to speak
with the emotion of another recording, or with a mix of eight emotions."""
from __future__ import annotations

from typing import Any

from comfy_api.latest import io, ui

from mizuoto_runtime import Audio, MizuotoError
from mizuoto_runtime.app.comfy_bridge import node_request
from mizuoto_runtime.app.host import PROCESS, EngineRef
from mizuoto_runtime.engines import Voice
from mizuoto_runtime.engines.indextts2.emotion import EMOTIONS, Emotion, balanced

from .common import (
    CATEGORY,
    STEPS_CATEGORY,
    EngineSocket,
    OptionsSocket,
    VoiceSocket,
    audio_in,
    check_made_by,
    memory_text,
    schema,
)

EMOTION_TOOLTIP = ("IndexTTS-2: emotions as name=weight, e.g. 'sad=0.8, calm=0.2' (happy, angry, sad, afraid, "
                   "disgusted, melancholic, surprised, calm; weights 0 to 1.2); empty = the voice's own")


#: The emotion inputs Text to Speech had in the previous release (now Emotion Options' inputs).
SAVED_EMOTION_INPUTS = ("emotion_audio", "emotion", "emotion_strength", "emotion_from_text")


def emotion_options(audio: Audio | None, text: str, strength: float, from_text: bool = False) -> dict[str, Any]:
    """The voice option of a request with emotion inputs; none when they are unset."""
    emotion = Emotion.from_inputs(audio, text, strength, from_text=from_text)
    return {} if emotion is None else {"emotion": emotion}


def saved_emotion(saved: dict[str, Any]) -> dict[str, Any]:
    """The voice options of a Text to Speech prompt saved by the previous release, whose emotion
    inputs sat on the node itself; any other unknown input is one error naming it."""
    unknown = sorted(set(saved) - set(SAVED_EMOTION_INPUTS))
    if unknown:
        raise MizuotoError(f"Text to Speech takes no input {', '.join(unknown)}")
    return emotion_options(audio_in(saved.get("emotion_audio"), "emotion_audio"), saved.get("emotion", ""),
                           saved.get("emotion_strength", 1.0), bool(saved.get("emotion_from_text", False)))


class MizuotoEmotionOptions(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return schema(
            node_id="MizuotoEmotionOptions",
            display_name="Emotion Options (IndexTTS-2)",
            category=CATEGORY,
            search_aliases=["emotion", "indextts", "index-tts", "mood", "expressive", "options"],
            description="IndexTTS-2's emotion for Text to Speech, Script to Speech or Subtitles to Speech (their "
                        "options input): the emotion of a recording, a mix of emotions as name=weight, or the "
                        "emotion its emotion model reads in the text being spoken.",
            inputs=[
                io.Audio.Input("emotion_audio", optional=True,
                               tooltip="Speech whose emotion to take (its voice is not cloned)"),
                io.String.Input("emotion", optional=True, default="", tooltip=EMOTION_TOOLTIP),
                io.Float.Input("emotion_strength", optional=True, default=1.0, min=0.0, max=1.0, step=0.05,
                               tooltip="How much of the emotion; 0 keeps the voice's own"),
                io.Boolean.Input("emotion_from_text", optional=True, default=False,
                                 tooltip="Its emotion model reads the emotion of the text being spoken (when no "
                                         "emotion audio or weights are given)"),
            ],
            outputs=[OptionsSocket.Output(display_name="options")],
        )

    @classmethod
    def execute(cls, emotion_audio: dict[str, Any] | None = None, emotion: str = "", emotion_strength: float = 1.0,
                emotion_from_text: bool = False) -> io.NodeOutput:
        return io.NodeOutput(emotion_options(audio_in(emotion_audio, "emotion_audio"), emotion, emotion_strength,
                                             emotion_from_text))


class MizuotoEmotion(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return schema(
            node_id="MizuotoEmotion",
            display_name="Emotion (IndexTTS-2)",
            category=STEPS_CATEGORY,
            search_aliases=["emotion", "indextts", "index-tts", "mood", "expressive"],
            description="Makes an IndexTTS-2 voice speak with an emotion: the emotion of a second recording "
                        "(its voice is not cloned), a mix of eight emotions set below, or the emotion of a "
                        "sentence. Between Voice Clone "
                        "and Text → Speech Codes.",
            inputs=[
                EngineSocket.Input("engine"),
                VoiceSocket.Input("voice", tooltip="From Voice Clone, with an IndexTTS-2 engine"),
                io.Audio.Input("emotion_audio", optional=True,
                               tooltip="Speech whose emotion to take; when connected the sliders are not used"),
                io.Float.Input("strength", default=1.0, min=0.0, max=1.0, step=0.05,
                               tooltip="How much of the emotion: 0 keeps the voice's own"),
                *(io.Float.Input(name, default=0.0, min=0.0, max=1.2, step=0.05, tooltip=f"Weight of {name}")
                  for name in EMOTIONS),
                io.String.Input("emotion_text", optional=True, default="",
                                tooltip="A sentence whose emotion the checkpoint's emotion model reads (its folder "
                                        "qwen0.6bemo4-merge); used when no emotion_audio is connected and every "
                                        "weight is 0"),
                io.Boolean.Input("random", optional=True, default=False,
                                 tooltip="A random variant of each emotion (fixed by the seed) instead of the one "
                                         "closest to the voice"),
                io.Boolean.Input("balance", optional=True, default=False,
                                 tooltip="Tone the weights down as IndexTTS-2's web UI does: less of the emotions "
                                         "that can sound strange, at most 0.8 in all"),
            ],
            outputs=[VoiceSocket.Output(display_name="voice")],
        )

    @classmethod
    @PROCESS.around_node
    def execute(cls, engine: EngineRef, voice: Voice, strength: float, emotion_audio: dict[str, Any] | None = None,
                emotion_text: str = "", random: bool = False, balance: bool = False,
                **weights: float) -> io.NodeOutput:
        tts = engine.engine
        if not hasattr(tts, "with_emotion"):
            raise MizuotoError(f"Emotion (IndexTTS-2): engine {tts.id!r} has no emotion control; use indextts2")
        check_made_by(voice, tts, "voice")
        audio = audio_in(emotion_audio, "emotion_audio")
        vector = tuple(float(weights.get(name, 0.0)) for name in EMOTIONS)
        if audio is not None:
            emotion = Emotion(audio=audio, alpha=strength)
        elif any(vector):
            emotion = Emotion(vector=balanced(vector) if balance else vector, alpha=strength, random=random)
        elif emotion_text.strip():
            emotion = Emotion(text=emotion_text.strip(), from_text=True, alpha=strength, random=random)
        else:
            raise MizuotoError("Emotion (IndexTTS-2): connect an emotion_audio, set an emotion weight or write "
                               "an emotion_text")
        ctx = node_request(engine.runtime)
        out = tts.with_emotion(ctx, voice, emotion)
        return io.NodeOutput(out, ui=ui.PreviewText(memory_text(ctx.meta)))


NODES: list[type[io.ComfyNode]] = [MizuotoEmotion, MizuotoEmotionOptions]
