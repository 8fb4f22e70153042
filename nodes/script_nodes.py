"""Scripts and subtitles in ComfyUI: Script to Speech, Subtitles to Speech, Character Voices and
Save Voice.

A script is tagged text: ``[Name]`` speaks the rest of its line in that character's voice (the
text before any tag, and lines without one, in the node's own voice), ``[pause:1.5s]`` inserts
silence, ``[seed:N]`` seeds the next line. Its lines run phase by phase (every voice prompt,
then every talker line, then every decode), so each model part is placed once per script; the
progress bar counts the voices and lines x phases, and an interrupt stops between lines. Lines
spoken before with the same engine, voice, words, seed and settings come from the line cache.

Voices by name live in ``models/mizuoto/voices/`` (and ``voices/`` under every other
``mizuoto`` folder of extra_model_paths.yaml): ``NAME.wav`` with ``NAME.txt`` holding what it
says. Prompted voices are kept in the first one's ``.cache`` folder, so after a restart a voice
is not prompted again.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import folder_paths
from comfy_api.latest import io, ui

from mizuoto_runtime.app.comfy_bridge import ProgressReporter, interrupt_check
from mizuoto_runtime.app.host import PROCESS, EngineRef, fallback_switch
from mizuoto_runtime.app.scripts.runner import CharacterVoice
from mizuoto_runtime.app.scripts.segments import SegmentCache
from mizuoto_runtime.app.scripts.subtitles import TIMINGS, parse_srt, read_srt
from mizuoto_runtime.app.scripts.syntax import check_character_name, parse_script
from mizuoto_runtime.app.scripts.voices import VoiceLibrary
from mizuoto_runtime.engines import Voice
from mizuoto_runtime.engines.voice_store import VoicePromptStore
from mizuoto_runtime.errors import MizuotoError

from . import paths
from .common import (
    CATEGORY,
    FALLBACK_TOOLTIP,
    NO_SPEAKER,
    EngineSocket,
    OptionsSocket,
    VoiceSocket,
    audio_in,
    audio_out,
    language_input,
    memory_json,
    memory_text,
    phased_engine,
    sampling_from,
    sampling_inputs,
    schema,
    speaker_input,
    speaker_value,
)

CharactersSocket = io.Custom("MIZUOTO_CHARACTERS")
VOICES_FOLDER = "voices"
PROMPT_CACHE = ".cache"
NO_VOICE = "none"
NO_FILE = "none"
SCRIPT_DEFAULT = ("The narrator opens the scene.\n[Alice] Hello, Bob. Did you see the sky tonight?\n[pause:0.5s]\n"
                  "[Bob] I did. It was full of stars.\nAnd the narrator closes it.")
SRT_DEFAULT = ("1\n00:00:00,000 --> 00:00:02,000\nThe narrator opens the scene.\n\n"
               "2\n00:00:02,500 --> 00:00:04,500\n[Alice] Hello, Bob.\n\n"
               "3\n00:00:05,000 --> 00:00:07,000\nAnd the narrator closes it.\n")
#: Spoken lines kept across runs: re-running after editing one line speaks only that line.
LINES = SegmentCache()


def library() -> VoiceLibrary:
    """``voices/`` under every mizuoto model folder (the first is where Save Voice writes)."""
    return VoiceLibrary([root / VOICES_FOLDER for root in paths.roots()])


def prompt_store() -> VoicePromptStore:
    return VoicePromptStore(library().folders[0] / PROMPT_CACHE)


def srt_files() -> list[str]:
    """The .srt files in ComfyUI's input folder (and its subfolders)."""
    root = Path(folder_paths.get_input_directory())
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.srt") if p.is_file()) if root.is_dir() else []


def own_voice(reference: dict[str, Any] | None, transcript: str, speaker: str, options: dict[str, Any] | None,
              voice: Voice | None = None) -> CharacterVoice:
    return CharacterVoice(audio_in(reference, "reference"), transcript or None, speaker_value(speaker),
                          options=dict(options or {}), prompted=voice)


def cast(characters: dict[str, CharacterVoice] | None, own: CharacterVoice) -> dict[str | None, CharacterVoice]:
    """The node's own voice (None) and each character's; the options socket reaches every
    character that has none of its own."""
    voices: dict[str | None, CharacterVoice] = {None: own}
    for name, voice in (characters or {}).items():
        voices[name] = voice if voice.options or voice.prompted else CharacterVoice(
            voice.reference, voice.transcript, voice.speaker, voice.instruct, own.options)
    return voices


def own_voice_inputs() -> list[io.Input]:
    return [
        io.Audio.Input("reference", optional=True, tooltip="The node's own voice (lines without a tag): speech "
                                                           "to clone"),
        io.String.Input("transcript", optional=True, multiline=False, default="",
                        tooltip="What the reference says (empty: the voice's timbre only, where the engine can)"),
        speaker_input(paths.catalog().speakers()),
        VoiceSocket.Input("voice", optional=True, tooltip="The node's own voice, from Voice Clone / Voice Design "
                                                          "(replaces reference and speaker)"),
        CharactersSocket.Input("characters", optional=True, tooltip="Who the [Name] tags are, from Character "
                                                                     "Voices"),
        OptionsSocket.Input("options", optional=True, tooltip="Options one engine reads (e.g. IndexTTS-2's "
                                                              "emotion), for every voice"),
    ]


class MizuotoCharacterVoices(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return schema(
            node_id="MizuotoCharacterVoices",
            display_name="Character Voices",
            category=CATEGORY,
            search_aliases=["character", "voices", "dialogue", "cast", "speaker", "voice library"],
            description="Gives a [Name] of a script a voice: a voice of the library (models/mizuoto/voices), "
                        "speech to clone with its transcript, a built-in speaker of the checkpoint, or a voice "
                        "from Voice Clone. Chain one node per character.",
            inputs=[
                io.String.Input("name", default="Alice", tooltip="The name its tags use: [Alice]"),
                io.Combo.Input("library_voice", options=[NO_VOICE, *library().names()], default=NO_VOICE,
                               tooltip="A voice of models/mizuoto/voices (NAME.wav with NAME.txt)"),
                io.Audio.Input("audio", optional=True, tooltip="Speech to clone (replaces library_voice)"),
                io.String.Input("transcript", optional=True, default="", tooltip="What the audio says"),
                speaker_input(paths.catalog().speakers()),
                VoiceSocket.Input("voice", optional=True, tooltip="A voice from Voice Clone / Voice Design (replaces "
                                                                  "the others)"),
                CharactersSocket.Input("characters", optional=True, tooltip="Characters given before this one"),
            ],
            outputs=[CharactersSocket.Output(display_name="characters")],
        )

    @classmethod
    def validate_inputs(cls, library_voice: str = NO_VOICE, speaker: str = NO_SPEAKER) -> bool:
        return True  # a voice saved since the list was built, and speakers, are checked when it runs

    @classmethod
    def execute(cls, name: str, library_voice: str, audio: dict[str, Any] | None = None, transcript: str = "",
                speaker: str = NO_SPEAKER, voice: Voice | None = None,
                characters: dict[str, CharacterVoice] | None = None) -> io.NodeOutput:
        name = check_character_name(name.strip())
        reference = audio_in(audio, "audio")
        if voice is not None:
            character = CharacterVoice(prompted=voice)
        elif reference is not None:
            character = CharacterVoice(reference, transcript.strip() or None)
        elif library_voice != NO_VOICE:
            saved, words = library().load(library_voice)
            character = CharacterVoice(saved, transcript.strip() or words)
        elif speaker_value(speaker) is not None:
            character = CharacterVoice(speaker=speaker_value(speaker))
        else:
            raise MizuotoError(f"Character Voices: give {name!r} a library voice, audio, a speaker or a voice")
        return io.NodeOutput({**(characters or {}), name: character},
                             ui=ui.PreviewText(f"{name}: {describe(character)}"))


def describe(voice: CharacterVoice) -> str:
    if voice.prompted is not None:
        return f"a {voice.prompted.engine} voice"
    if voice.reference is not None:
        return f"{voice.reference.seconds:.1f} s of speech" + (" with its transcript" if voice.transcript else "")
    return f"speaker {voice.speaker}"


class MizuotoScriptToSpeech(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return schema(
            node_id="MizuotoScriptToSpeech",
            display_name="Script to Speech",
            category=CATEGORY,
            search_aliases=["script", "dialogue", "characters", "pause", "multi speaker", "tts"],
            description="Speaks a script: [Name] speaks the rest of its line in that character's voice (from "
                        "Character Voices), [pause:1.5s] inserts silence, [seed:N] seeds the next line; \\[ writes "
                        "a bracket. Every voice is prompted, then every line spoken, then every line decoded, so "
                        "each model part goes to the GPU once. Lines spoken before come from the cache.",
            inputs=[
                EngineSocket.Input("engine"),
                io.String.Input("script", multiline=True, default=SCRIPT_DEFAULT, tooltip="The tagged text"),
                *sampling_inputs(),
                io.Boolean.Input("allow_fallback", default=False, tooltip=FALLBACK_TOOLTIP),
                language_input(paths.catalog().languages()),
                *own_voice_inputs(),
            ],
            outputs=[io.Audio.Output(display_name="audio"), io.String.Output(display_name="memory")],
        )

    @classmethod
    def validate_inputs(cls, speaker: str = NO_SPEAKER, language: str = "") -> bool:
        return True  # the engine behind the socket checks its speakers and languages when the node runs

    @classmethod
    @PROCESS.around_node
    def execute(cls, engine: EngineRef, script: str, seed: int, temperature: float, top_k: int, top_p: float,
                repetition_penalty: float, max_new_tokens: int, do_sample: bool, allow_fallback: bool,
                language: str = "", reference: dict[str, Any] | None = None, transcript: str = "",
                speaker: str = NO_SPEAKER, voice: Voice | None = None,
                characters: dict[str, CharacterVoice] | None = None,
                options: dict[str, Any] | None = None) -> io.NodeOutput:
        tts = phased_engine(engine, "Script to Speech")
        voices = cast(characters, own_voice(reference, transcript, speaker, options, voice))
        parsed = parse_script(script, [name for name in voices if name is not None])
        sampling = sampling_from(seed, temperature, top_k, top_p, repetition_penalty, max_new_tokens, do_sample,
                                 language)
        spoken = engine.runtime.speak_script(tts, parsed, voices, sampling, cache=LINES,
                                             allow_fallback=fallback_switch(allow_fallback),
                                             cancel_check=interrupt_check, on_progress=ProgressReporter())
        meta = {**spoken.meta, "lines": len(parsed.lines), "from_cache": spoken.from_cache}
        text = f"{len(parsed.lines)} lines, {spoken.from_cache} from the cache\n{memory_text(meta)}"
        return io.NodeOutput(audio_out(spoken.audio), memory_json(meta), ui=ui.PreviewText(text))


class MizuotoSubtitlesToSpeech(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return schema(
            node_id="MizuotoSubtitlesToSpeech",
            display_name="Subtitles to Speech",
            category=CATEGORY,
            search_aliases=["srt", "subtitles", "captions", "dubbing", "timing", "tts"],
            description="Speaks an SRT track, each cue at its time ([Name] inside a cue: that character). "
                        "Timing: pad waits with silence (an overrun pushes later cues back), fit time-stretches "
                        "each line to its cue, natural uses the gap first. Outputs the audio, the SRT at the "
                        "actual times, and a report per cue.",
            inputs=[
                EngineSocket.Input("engine"),
                io.String.Input("srt", multiline=True, default=SRT_DEFAULT,
                                tooltip="SRT text (used when srt_file is none)"),
                io.Combo.Input("srt_file", options=[NO_FILE, *srt_files()], default=NO_FILE,
                               tooltip="An .srt file from ComfyUI's input folder (replaces the text)"),
                io.Combo.Input("timing", options=list(TIMINGS), default="pad",
                               tooltip="pad: silence until the next cue; fit: stretch each line to its cue (pitch "
                                       "kept); natural: use the gap, then stretch, then shift"),
                io.Float.Input("max_stretch", default=1.5, min=1.0, max=4.0, step=0.05,
                               tooltip="fit and natural: the most a line is sped up or slowed down"),
                *sampling_inputs(),
                io.Boolean.Input("allow_fallback", default=False, tooltip=FALLBACK_TOOLTIP),
                language_input(paths.catalog().languages()),
                *own_voice_inputs(),
            ],
            outputs=[io.Audio.Output(display_name="audio"), io.String.Output(display_name="srt"),
                     io.String.Output(display_name="report")],
        )

    @classmethod
    def validate_inputs(cls, srt_file: str = NO_FILE, speaker: str = NO_SPEAKER, language: str = "") -> bool | str:
        if srt_file != NO_FILE and not (Path(folder_paths.get_input_directory()) / srt_file).is_file():
            return f"srt_file {srt_file!r} is not in ComfyUI's input folder"
        return True

    @classmethod
    @PROCESS.around_node
    def execute(cls, engine: EngineRef, srt: str, srt_file: str, timing: str, max_stretch: float, seed: int,
                temperature: float, top_k: int, top_p: float, repetition_penalty: float, max_new_tokens: int,
                do_sample: bool, allow_fallback: bool, language: str = "", reference: dict[str, Any] | None = None,
                transcript: str = "", speaker: str = NO_SPEAKER, voice: Voice | None = None,
                characters: dict[str, CharacterVoice] | None = None,
                options: dict[str, Any] | None = None) -> io.NodeOutput:
        tts = phased_engine(engine, "Subtitles to Speech")
        cues = (read_srt(Path(folder_paths.get_input_directory()) / srt_file) if srt_file != NO_FILE
                else parse_srt(srt))
        voices = cast(characters, own_voice(reference, transcript, speaker, options, voice))
        sampling = sampling_from(seed, temperature, top_k, top_p, repetition_penalty, max_new_tokens, do_sample,
                                 language)
        placed = engine.runtime.speak_subtitles(tts, cues, voices, sampling, timing, max_stretch, cache=LINES,
                                                allow_fallback=fallback_switch(allow_fallback),
                                                cancel_check=interrupt_check, on_progress=ProgressReporter())
        report = f"{placed.report_text()}\n{placed.from_cache} lines from the cache\n{memory_text(placed.meta)}"
        return io.NodeOutput(audio_out(placed.audio), placed.srt, report, ui=ui.PreviewText(report))


class MizuotoSaveVoice(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return schema(
            node_id="MizuotoSaveVoice",
            display_name="Save Voice",
            category=CATEGORY,
            search_aliases=["save voice", "voice library", "character", "reference"],
            description="Saves speech and what it says to the voice library (models/mizuoto/voices/NAME.wav "
                        "and NAME.txt); Character Voices offers it after a refresh (R).",
            is_output_node=True,
            inputs=[
                io.Audio.Input("audio", tooltip="5-15 s of clear speech"),
                io.String.Input("name", default="my_voice", tooltip="The voice's name (subfolders with /)"),
                io.String.Input("transcript", multiline=True, default="", tooltip="What the audio says (empty: "
                                                                                   "none)"),
                io.Boolean.Input("overwrite", default=False, tooltip="Replace a voice of the same name"),
            ],
            outputs=[],
        )

    @classmethod
    def execute(cls, audio: dict[str, Any], name: str, transcript: str, overwrite: bool) -> io.NodeOutput:
        speech = audio_in(audio, "audio")
        assert speech is not None  # a required input
        path = library().save(name.strip(), speech, transcript.strip() or None, overwrite=overwrite)
        return io.NodeOutput(ui=ui.PreviewText(f"saved {path}"))


NODES: list[type[io.ComfyNode]] = [MizuotoScriptToSpeech, MizuotoSubtitlesToSpeech, MizuotoCharacterVoices,
                                   MizuotoSaveVoice]
