"""Build the example workflows (ComfyUI's templates) and their thumbnails from a running ComfyUI.

    python tools/templates.py all --url http://127.0.0.1:8188 [--chromium /usr/bin/chromium]

`all` builds, takes the node sizes the frontend computes, builds again with them and takes the
shots; `build` and `shots` are its two steps.

`build` writes `example_workflows/<title>.json` from the graphs below: every widget value in the
order the running ComfyUI defines it (`/object_info`), defaults where a graph names none, node
sizes as the frontend computes them (`--sizes`, from a previous `shots`). The file name is the
title ComfyUI's template browser shows.

`shots` opens each template in headless Chromium at the frontend's default zoom (the graph's
`extra.ds`: scale 1), checks that every node is inside a `--viewport` (default 1600x900, a
browser window on a 1080p screen) clear of the frontend's bars, and saves the graph as
`<title>.jpg`, the thumbnail the browser shows beside it. It prints the
computed node sizes for `build --sizes`. Run it with ComfyUI's Python (it uses aiohttp, which
ComfyUI has); the server needs the pack and, for the Qwen3-TTS graphs' dropdowns, nothing else.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "example_workflows"
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
FRONTEND_ONLY = {"Note", "MarkdownNote"}
MARGIN = 24  # px between nodes
TITLE_H = 30  # a node's title bar, above its `pos`
#: Where the graph opens: right of the sidebar and below the top bar of the newer frontends.
VIEW_OFFSET = [70, 100]
#: What the frontends' sidebar, top bar and bottom toolbar cover of the canvas (left, top, right, bottom).
COVERED = (60, 100, 0, 40)

DEMO_NOTE = ("The demo engine needs no download: its weights are random, so its audio is noise. "
             "It shows the graph works. For speech, open a Qwen3-TTS template, or choose engine "
             "qwen3tts and a checkpoint on the node.")
WEIGHTS = ("Put the official weights in ComfyUI/models/mizuoto/{name}/ as published on Hugging Face "
           "(Qwen/{name}, with its speech_tokenizer/ folder), then press R to refresh the lists.")

CLONE_NOTE = ("Load 5-15 s of clear speech of the voice to clone and type what it says into transcript. "
              "Each step is its own node: the voice, the speech codes, the audio; each places only its own "
              "model parts on the GPU.")

GPTSOVITS_NOTE = ("Put GPT-SoVITS's pretrained_models folder (lj1995/GPT-SoVITS: gsv-v2final-pretrained/, "
                  "chinese-hubert-base/, chinese-roberta-wwm-ext-large/; for v2Pro also v2Pro/, sv/ and "
                  "s1v3.ckpt) in ComfyUI/models/mizuoto/pretrained_models/, and your own voices (the "
                  "GPT_weights_v2*/ and SoVITS_weights_v2*/ folders) in ComfyUI/models/mizuoto/gptsovits/, "
                  "then press R and pick yours as checkpoint. Load 3-10 s of the voice and type what it says. "
                  "Chinese, English and Japanese, mixed too.")


def clone_graph(engine: str, checkpoint: str, dtype: str, note: str, text: str, prefix: str) -> dict[str, Any]:
    """A voice-clone graph step by step: a recording and its transcript make the voice, the
    talker speaks the text in it, the decoder makes the audio."""
    return {
        "nodes": [
            (1, "Note", 0, {"text": note}),
            (2, "MizuotoEngineLoader", 0, {"engine": engine, "checkpoint": checkpoint, "dtype": dtype}),
            (3, "LoadAudio", 0, {"audio": "voice_to_clone.wav"}),
            (4, "MizuotoVoicePrompt", 1, {"transcript": "Type here exactly what the reference recording says."}),
            (5, "MizuotoTalker", 1, {"text": text}),
            (6, "MizuotoDecoder", 2, {}),
            (7, "MizuotoSaveWav", 2, {"filename_prefix": prefix}),
        ],
        "links": [(2, "engine", 4, "engine"), (3, "AUDIO", 4, "reference"), (2, "engine", 5, "engine"),
                  (4, "voice", 5, "voice"), (2, "engine", 6, "engine"), (5, "codes", 6, "codes"),
                  (6, "audio", 7, "audio")],
    }


def dialogue_graph(engine: str, checkpoint: str, dtype: str, note: str, script: str, prefix: str) -> dict[str, Any]:
    """A script of two characters spoken as one pass of a multi-speaker engine: each character's
    recording and transcript, then the script."""
    return {
        "nodes": [
            (1, "Note", 0, {"text": note}),
            (2, "MizuotoEngineLoader", 0, {"engine": engine, "checkpoint": checkpoint, "dtype": dtype}),
            (3, "LoadAudio", 1, {"audio": "voice_to_clone.wav"}),
            (4, "LoadAudio", 1, {"audio": "voice_to_clone.wav"}),
            (5, "MizuotoCharacterVoices", 2, {"name": "Alice", "transcript": "Type here what Alice's recording says."}),
            (6, "MizuotoCharacterVoices", 2, {"name": "Bob", "transcript": "Type here what Bob's recording says."}),
            (7, "MizuotoScriptToSpeech", 3, {"script": script}),
            (8, "MizuotoSaveWav", 3, {"filename_prefix": prefix}),
        ],
        "links": [(3, "AUDIO", 5, "audio"), (4, "AUDIO", 6, "audio"), (5, "characters", 6, "characters"),
                  (2, "engine", 7, "engine"), (6, "characters", 7, "characters"), (7, "audio", 8, "audio")],
    }


DIALOGUE_NOTE = ("Load a recording of each character with what it says typed into transcript. The lines between "
                 "pauses are spoken in one pass, both voices together, as the model speaks a dialogue.")

# title -> nodes (id, type, column, values) and links (from id, output, to id, input).
GRAPHS: dict[str, dict[str, Any]] = {
    "Text to Speech - demo engine (no download)": {
        "nodes": [
            (1, "Note", 0, {"text": DEMO_NOTE}),
            (2, "MizuotoTTS", 1, {"text": "Hello from Mizuoto. This is the demo engine: its voice is noise, "
                                          "but every step runs as it would with real weights.",
                                  "engine_name": "demo", "checkpoint": "none"}),
            (3, "MizuotoSaveWav", 2, {"filename_prefix": "audio/mizuoto_demo"}),
        ],
        "links": [(2, "audio", 3, "audio")],
    },
    "Text to Speech - Qwen3-TTS CustomVoice (built-in speakers)": {
        "nodes": [
            (1, "Note", 0, {"text": WEIGHTS.format(name="Qwen3-TTS-12Hz-1.7B-CustomVoice")
                            + " Pick one of its nine speakers; instruct describes the speaking style "
                              "(1.7B only). The 0.6B CustomVoice works too."}),
            (2, "MizuotoTTS", 1, {"text": "Good evening. Here is the weather for tomorrow: sunny in the morning, "
                                          "with light rain in the afternoon.",
                                  "engine_name": "qwen3tts", "checkpoint": "Qwen3-TTS-12Hz-1.7B-CustomVoice",
                                  "speaker": "ryan", "language": "english", "dtype": "bfloat16"}),
            (3, "MizuotoSaveWav", 2, {"filename_prefix": "audio/mizuoto_customvoice"}),
        ],
        "links": [(2, "audio", 3, "audio")],
    },
    "Voice Clone - Qwen3-TTS Base (from a reference recording)": {
        "nodes": [
            (1, "Note", 0, {"text": WEIGHTS.format(name="Qwen3-TTS-12Hz-1.7B-Base")
                            + " Load 5-15 s of clear speech of the voice to clone and type what it says "
                              "into transcript (empty: the timbre only)."}),
            (2, "LoadAudio", 0, {"audio": "voice_to_clone.wav"}),
            (3, "MizuotoTTS", 1, {"text": "This sentence is spoken in the voice of the reference recording.",
                                  "transcript": "Type here exactly what the reference recording says.",
                                  "engine_name": "qwen3tts", "checkpoint": "Qwen3-TTS-12Hz-1.7B-Base",
                                  "language": "english", "dtype": "bfloat16"}),
            (4, "MizuotoSaveWav", 2, {"filename_prefix": "audio/mizuoto_clone"}),
        ],
        "links": [(2, "AUDIO", 3, "reference"), (3, "audio", 4, "audio")],
    },
    "Voice Design - Qwen3-TTS VoiceDesign (describe the voice)": {
        "nodes": [
            (1, "Note", 0, {"text": WEIGHTS.format(name="Qwen3-TTS-12Hz-1.7B-VoiceDesign")
                            + " Describe the voice in instruct: who speaks, how, in what mood."}),
            (2, "MizuotoTTS", 1, {"text": "Welcome back. Today we will build a small garden on the balcony.",
                                  "instruct": "A warm, calm female voice in her thirties, speaking slowly "
                                              "and clearly, with a gentle smile.",
                                  "engine_name": "qwen3tts", "checkpoint": "Qwen3-TTS-12Hz-1.7B-VoiceDesign",
                                  "language": "english", "dtype": "bfloat16"}),
            (3, "MizuotoSaveWav", 2, {"filename_prefix": "audio/mizuoto_voicedesign"}),
        ],
        "links": [(2, "audio", 3, "audio")],
    },
    "Text to Speech - CosyVoice 2 (saved voices)": {
        "nodes": [
            (1, "Note", 0, {"text": "Put FunAudioLLM/CosyVoice2-0.5B, as published on Hugging Face, in "
                                    "ComfyUI/models/mizuoto/CosyVoice2-0.5B/, then press R to refresh the lists. "
                                    "Pick a speaker of its spk2info.pt (voices saved with upstream's "
                                    "add_zero_shot_spk); instruct changes the style. Fun-CosyVoice3-0.5B-2512 "
                                    "works the same."}),
            (2, "MizuotoTTS", 1, {"text": "Good evening. Here is the weather for tomorrow: sunny in the morning, "
                                          "with light rain in the afternoon.",
                                  "engine_name": "cosyvoice", "checkpoint": "CosyVoice2-0.5B"}),
            (3, "MizuotoSaveWav", 2, {"filename_prefix": "audio/mizuoto_cosyvoice"}),
        ],
        "links": [(2, "audio", 3, "audio")],
    },
    "Voice Clone - F5-TTS, step by step (from a reference recording)": clone_graph(
        "f5tts", "F5TTS_v1_Base", "float32",
        "Put SWivid/F5-TTS's F5TTS_v1_Base folder (model_1250000.safetensors, vocab.txt) in "
        "ComfyUI/models/mizuoto/F5TTS_v1_Base/, with charactr/vocos-mel-24khz in its vocos-mel-24khz/ "
        "subfolder, then press R to refresh the lists. " + CLONE_NOTE,
        "Hello from Mizuoto. F5-TTS speaks in the voice of the reference recording.", "audio/mizuoto_f5tts"),
    "Voice Clone - OmniVoice, step by step (from a reference recording)": clone_graph(
        "omnivoice", "OmniVoice", "float32",
        "Put the official weights in ComfyUI/models/mizuoto/OmniVoice/ as published on Hugging Face "
        "(k2-fsa/OmniVoice, with its audio_tokenizer/ folder), then press R to refresh the lists. " + CLONE_NOTE,
        "Hello from Mizuoto. OmniVoice speaks in the voice of the reference recording.", "audio/mizuoto_omnivoice"),
    "Voice Clone - Higgs Audio v2, step by step (from a reference recording)": clone_graph(
        "higgsaudio", "higgs-audio-v2-generation-3B-base", "bfloat16",
        "Put Boson AI's Higgs Audio v2 in ComfyUI/models/mizuoto/higgs-audio-v2-generation-3B-base/ as published "
        "on Hugging Face in transformers' format (config.json, the model-*.safetensors shards with their index, "
        "the tokenizer and processor files), with bosonai/higgs-audio-v2-tokenizer in its audio_tokenizer/ "
        "folder (Boson Higgs Audio 2 Community License: read it), then press R to refresh the lists. "
        + CLONE_NOTE,
        "Hello from Mizuoto. Higgs Audio speaks in the voice of the reference recording.", "audio/mizuoto_higgsaudio"),
    "Voice Clone - VoxCPM 2, step by step (from a reference recording)": clone_graph(
        "voxcpm2", "VoxCPM2", "bfloat16",
        "Put the official weights in ComfyUI/models/mizuoto/VoxCPM2/ as published on Hugging Face "
        "(openbmb/VoxCPM2), then press R to refresh the lists. " + CLONE_NOTE,
        "Hello from Mizuoto. VoxCPM 2 speaks in the voice of the reference recording.", "audio/mizuoto_voxcpm2"),
    "Voice Clone - Fish Speech, step by step (from a reference recording)": clone_graph(
        "fishspeech", "s2-pro", "bfloat16",
        "Put Fish Audio S2-Pro in ComfyUI/models/mizuoto/s2-pro/ as published on Hugging Face (fishaudio/s2-pro: "
        "config.json, the model-*.safetensors shards with their index, tokenizer.json, codec.pth; research and "
        "non-commercial licence), or OpenAudio S1-mini (fishaudio/openaudio-s1-mini) in its own folder, then press "
        "R to refresh the lists. " + CLONE_NOTE,
        "Hello from Mizuoto. Fish Speech speaks in the voice of the reference recording.", "audio/mizuoto_fishspeech"),
    "Voice Clone - Chatterbox (from a reference recording)": {
        "nodes": [
            (1, "Note", 0, {"text": "Put Resemble AI's Chatterbox in ComfyUI/models/mizuoto/chatterbox/ as published "
                                    "on Hugging Face (ResembleAI/chatterbox: ve.safetensors, t3_cfg.safetensors, "
                                    "s3gen.safetensors, tokenizer.json, conds.pt; MIT licence), then press R to "
                                    "refresh the lists. Load 5-10 s of clear speech of the voice to clone (no "
                                    "transcript needed), or none for its built-in voice. Pick "
                                    "chatterbox/t3_mtl23ls_v2.safetensors (Chatterbox Multilingual, with its "
                                    "files) for 23 languages. Every output "
                                    "carries Resemble AI's Perth audio watermark, as upstream applies it."}),
            (2, "LoadAudio", 0, {"audio": "voice_to_clone.wav"}),
            (3, "MizuotoTTS", 1, {"text": "Hello from Mizuoto. Chatterbox speaks in the voice of the reference "
                                          "recording.",
                                  "engine_name": "chatterbox", "checkpoint": "chatterbox", "temperature": 0.8,
                                  "repetition_penalty": 1.2}),
            (4, "MizuotoSaveWav", 2, {"filename_prefix": "audio/mizuoto_chatterbox"}),
        ],
        "links": [(2, "AUDIO", 3, "reference"), (3, "audio", 4, "audio")],
    },
    "Voice Clone - GPT-SoVITS v2 (your fine-tuned voice)": {
        "nodes": [
            (1, "Note", 0, {"text": GPTSOVITS_NOTE}),
            (2, "LoadAudio", 0, {"audio": "voice_to_clone.wav"}),
            (3, "MizuotoTTS", 1, {"text": "你好，欢迎使用 Mizuoto。This sentence is spoken in the voice of your "
                                          "GPT-SoVITS model.",
                                  "transcript": "Type here exactly what the reference recording says.",
                                  "engine_name": "gptsovits",
                                  "checkpoint": "pretrained_models/gsv-v2final-pretrained (GPT-SoVITS v2)",
                                  "language": "auto", "top_k": 15, "temperature": 1.0, "repetition_penalty": 1.35}),
            (4, "MizuotoSaveWav", 2, {"filename_prefix": "audio/mizuoto_gptsovits"}),
        ],
        "links": [(2, "AUDIO", 3, "reference"), (3, "audio", 4, "audio")],
    },
    "Voice Clone - IndexTTS-2, step by step (with an emotion)": {
        "nodes": [
            (1, "Note", 0, {"text": "Put the official weights in ComfyUI/models/mizuoto/IndexTTS-2/ as published on "
                                    "Hugging Face (IndexTeam/IndexTTS-2; its licence is bilibili's model licence: read "
                                    "it), with w2v-bert-2.0, the MaskGCT semantic codec, CAM++ and BigVGAN in its "
                                    "hf_cache/ folder (see the README), then press R to refresh the lists. Load 5-15 s "
                                    "of clear speech of the voice to clone. Emotion sets how it speaks: a mix of eight "
                                    "emotions, the emotion of a second recording connected to it, or the "
                                    "emotion its emotion model reads in a sentence (emotion_text)."}),
            (2, "MizuotoEngineLoader", 0, {"engine": "indextts2", "checkpoint": "IndexTTS-2", "dtype": "float32"}),
            (3, "LoadAudio", 0, {"audio": "voice_to_clone.wav"}),
            (4, "MizuotoVoicePrompt", 1, {}),
            (5, "MizuotoEmotion", 1, {"happy": 0.6}),
            (6, "MizuotoTalker", 2, {"text": "Hello from Mizuoto. IndexTTS-2 speaks in the voice of the reference "
                                             "recording, with a happy tone.",
                                     "temperature": 0.8, "top_k": 30, "top_p": 0.8, "repetition_penalty": 10.0,
                                     "max_new_tokens": 1500}),
            (7, "MizuotoDecoder", 2, {}),
            (8, "MizuotoSaveWav", 2, {"filename_prefix": "audio/mizuoto_indextts2"}),
        ],
        "links": [(2, "engine", 4, "engine"), (3, "AUDIO", 4, "reference"), (2, "engine", 5, "engine"),
                  (4, "voice", 5, "voice"), (2, "engine", 6, "engine"), (5, "voice", 6, "voice"),
                  (2, "engine", 7, "engine"), (6, "codes", 7, "codes"), (7, "audio", 8, "audio")],
    },
    "Step by step - demo engine (voice, speech codes, audio)": {
        "nodes": [
            (1, "MizuotoEngineLoader", 0, {"engine": "demo", "checkpoint": "none"}),
            (2, "MizuotoVoicePrompt", 0, {}),
            (3, "MizuotoTalker", 1, {"text": "Each step of text to speech is its own node here."}),
            (4, "MizuotoDecoder", 2, {}),
            (5, "MizuotoSaveWav", 2, {"filename_prefix": "audio/mizuoto_steps"}),
            (6, "Note", 2, {"text": "The same speech as Text to Speech, one step per node: the voice, the "
                                    "speech codes, the audio. Each step places only its own model parts on the "
                                    "GPU. " + DEMO_NOTE.split(": ")[0] + "."}),
        ],
        "links": [(1, "engine", 2, "engine"), (1, "engine", 3, "engine"), (2, "voice", 3, "voice"),
                  (1, "engine", 4, "engine"), (3, "codes", 4, "codes"), (4, "audio", 5, "audio")],
    },
    "Dialogue - Dia, two speakers in one pass (script)": dialogue_graph(
        "dia", "Dia-1.6B-0626", "bfloat16",
        "Put nari-labs/Dia-1.6B-0626 in ComfyUI/models/mizuoto/Dia-1.6B-0626/ as published on Hugging Face, "
        "and its codec descript/dac_44khz in its dac_44khz/ subfolder (or beside it), then press R to refresh "
        "the lists. Dia speaks [S1] and [S2]: Alice and Bob here; nonverbal tags such as (laughs) stay in the "
        "text. " + DIALOGUE_NOTE,
        "[Alice] Did you see the sky tonight?\n[Bob] I did. (laughs) It was full of stars.\n[Alice] Let's go "
        "out again tomorrow.", "audio/mizuoto_dia"),
    "Dialogue - CSM, a conversation of two speakers (script)": dialogue_graph(
        "csm", "csm-1b", "bfloat16",
        "Put sesame/csm-1b in ComfyUI/models/mizuoto/csm-1b/ as published on Hugging Face (the transformers "
        "layout, Mimi inside), then press R to refresh the lists. CSM continues a conversation: each "
        "recording is its speaker's context, each line hears the lines before it. " + DIALOGUE_NOTE,
        "[Alice] Did you see the sky tonight?\n[Bob] I did. It was full of stars.\n[Alice] Let's go out "
        "again tomorrow.", "audio/mizuoto_csm"),
    "Script to Speech - two characters and a pause (demo engine)": {
        "nodes": [
            (1, "Note", 0, {"text": "A script: [Alice] and [Bob] speak the rest of their line in the voices Character "
                                    "Voices gives them (a library voice from models/mizuoto/voices, a recording with "
                                    "its transcript, or a speaker); lines without a tag use the node's own voice; "
                                    "[pause:0.5s] is silence. Load a different recording for each character. "
                                    + DEMO_NOTE.split(": ")[0] + "."}),
            (2, "MizuotoEngineLoader", 0, {"engine": "demo", "checkpoint": "none"}),
            (3, "LoadAudio", 1, {"audio": "voice_to_clone.wav"}),
            (4, "LoadAudio", 1, {"audio": "voice_to_clone.wav"}),
            (5, "MizuotoCharacterVoices", 2, {"name": "Alice"}),
            (6, "MizuotoCharacterVoices", 2, {"name": "Bob"}),
            (7, "MizuotoScriptToSpeech", 3, {}),
            (8, "MizuotoSaveWav", 3, {"filename_prefix": "audio/mizuoto_script"}),
        ],
        "links": [(3, "AUDIO", 5, "audio"), (4, "AUDIO", 6, "audio"), (5, "characters", 6, "characters"),
                  (2, "engine", 7, "engine"), (6, "characters", 7, "characters"), (7, "audio", 8, "audio")],
    },
    "Script to Speech - VibeVoice, two voices in one pass": {
        "nodes": [
            (1, "Note", 0, {"text": "Put VibeVoice-1.5B in ComfyUI/models/mizuoto/VibeVoice-1.5B-hf/ as published on "
                                    "Hugging Face (vibevoice/VibeVoice-1.5B-hf, the transformers layout; "
                                    "VibeVoice-7B-hf works the same; MIT licence, for research use), then press R "
                                    "to refresh the lists. VibeVoice speaks up to four characters in one pass, "
                                    "each line in the voice of its character's recording (10-30 s of clear speech; "
                                    "no transcript needed); a pause ends a pass."}),
            (2, "MizuotoEngineLoader", 0, {"engine": "vibevoice", "checkpoint": "VibeVoice-1.5B-hf",
                                           "dtype": "bfloat16"}),
            (3, "LoadAudio", 1, {"audio": "voice_to_clone.wav"}),
            (4, "LoadAudio", 1, {"audio": "voice_to_clone.wav"}),
            (5, "MizuotoCharacterVoices", 2, {"name": "Alice"}),
            (6, "MizuotoCharacterVoices", 2, {"name": "Bob"}),
            (7, "MizuotoScriptToSpeech", 3, {"script": "[Alice] Did you hear? The whole podcast runs on one card now.\n"
                                                       "[Bob] Even the big model? It does not fit.\n"
                                                       "[Alice] It streams what does not fit. Slower, never wrong."}),
            (8, "MizuotoSaveWav", 3, {"filename_prefix": "audio/mizuoto_vibevoice"}),
        ],
        "links": [(3, "AUDIO", 5, "audio"), (4, "AUDIO", 6, "audio"), (5, "characters", 6, "characters"),
                  (2, "engine", 7, "engine"), (6, "characters", 7, "characters"), (7, "audio", 8, "audio")],
    },
    "Subtitles to Speech - a subtitle track (demo engine)": {
        "nodes": [
            (1, "Note", 0, {"text": "Speaks an SRT track, each cue at its time; [Alice] inside a cue is that "
                                    "character. Paste the SRT or pick an .srt file from ComfyUI's input folder. "
                                    "timing: pad waits with silence, fit time-stretches each line to its cue "
                                    "(pitch kept), natural uses the gap first. The srt output has the actual "
                                    "times. " + DEMO_NOTE.split(": ")[0] + "."}),
            (2, "MizuotoEngineLoader", 0, {"engine": "demo", "checkpoint": "none"}),
            (3, "LoadAudio", 1, {"audio": "voice_to_clone.wav"}),
            (4, "MizuotoCharacterVoices", 1, {"name": "Alice"}),
            (5, "MizuotoSubtitlesToSpeech", 2, {}),
            (6, "MizuotoSaveWav", 3, {"filename_prefix": "audio/mizuoto_subtitles"}),
        ],
        "links": [(3, "AUDIO", 4, "audio"), (2, "engine", 5, "engine"), (4, "characters", 5, "characters"),
                  (5, "audio", 6, "audio")],
    },
}
WIDTHS = {"Note": 300, "MizuotoTTS": 420, "MizuotoTalker": 400, "LoadAudio": 300, "MizuotoSaveWav": 320,
          "MizuotoEmotion": 320, "MizuotoScriptToSpeech": 420, "MizuotoSubtitlesToSpeech": 420,
          "MizuotoCharacterVoices": 320}
NOTE_H = 180
THUMBNAIL_WIDTH = 640


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def _inputs(info: dict[str, Any]) -> Iterator[tuple[str, list[Any]]]:
    for section in ("required", "optional"):
        for name in info["input_order"].get(section, []):
            yield name, info["input"][section][name]


def _is_widget(spec: list[Any]) -> bool:
    return isinstance(spec[0], list) or spec[0] in WIDGET_TYPES


def node_json(node_id: int, kind: str, values: dict[str, Any], info: dict[str, Any] | None,
              pos: list[int], size: list[int]) -> dict[str, Any]:
    node: dict[str, Any] = {"id": node_id, "type": kind, "pos": pos, "size": size, "flags": {}, "order": node_id,
                            "mode": 0, "inputs": [], "outputs": [], "properties": {"Node name for S&R": kind}}
    if info is None:  # a frontend-only note
        node["widgets_values"] = [values["text"]]
        node["color"], node["bgcolor"] = "#432", "#653"
        return node
    widgets: list[Any] = []
    for name, spec in _inputs(info):
        if not _is_widget(spec):
            node["inputs"].append({"name": name, "type": spec[0], "link": None})
            continue
        options = spec[1] if len(spec) > 1 else {}
        value = values.get(name, options.get("default", (spec[0] or [""])[0] if isinstance(spec[0], list) else ""))
        widgets.append(value)
        if options.get("control_after_generate"):
            widgets.append("fixed")
    unknown = set(values) - {name for name, _ in _inputs(info)}
    if unknown:
        raise SystemExit(f"{kind}: no input named {', '.join(sorted(unknown))}")
    node["widgets_values"] = widgets
    node["outputs"] = [{"name": name, "type": kind_, "links": [], "slot_index": i}
                       for i, (name, kind_) in enumerate(zip(info["output_name"], info["output"]))]
    return node


def layout(graph: dict[str, Any], sizes: dict[str, list[int]]) -> dict[int, tuple[list[int], list[int]]]:
    """Columns left to right, nodes top to bottom in each, `MARGIN` apart."""
    columns: dict[int, list[tuple[int, str]]] = {}
    for node_id, kind, column, _ in graph["nodes"]:
        columns.setdefault(column, []).append((node_id, kind))
    placed: dict[int, tuple[list[int], list[int]]] = {}
    x = MARGIN
    for column in sorted(columns):
        y = MARGIN + TITLE_H
        width = 0
        for node_id, kind in columns[column]:
            size = list(sizes.get(kind, [WIDTHS.get(kind, 320), NOTE_H if kind in FRONTEND_ONLY else 100]))
            size[0] = max(size[0], WIDTHS.get(kind, 0))
            placed[node_id] = ([x, y], size)
            y += size[1] + TITLE_H + MARGIN
            width = max(width, size[0])
        x += width + MARGIN
    return placed


def build(url: str, sizes: dict[str, list[int]]) -> None:
    object_info = get(f"{url}/object_info")
    OUT.mkdir(exist_ok=True)
    for title, graph in GRAPHS.items():
        placed = layout(graph, sizes)
        nodes = {node_id: node_json(node_id, kind, values, object_info.get(kind) if kind not in FRONTEND_ONLY else None,
                                    *placed[node_id])
                 for node_id, kind, _, values in graph["nodes"]}
        links = []
        for link_id, (src, output, dst, input_) in enumerate(graph["links"], start=1):
            out_slot = next(i for i, o in enumerate(nodes[src]["outputs"]) if o["name"] == output)
            in_slot = next(i for i, o in enumerate(nodes[dst]["inputs"]) if o["name"] == input_)
            nodes[src]["outputs"][out_slot]["links"].append(link_id)
            nodes[dst]["inputs"][in_slot]["link"] = link_id
            links.append([link_id, src, out_slot, dst, in_slot, nodes[src]["outputs"][out_slot]["type"]])
        workflow = {"last_node_id": max(nodes), "last_link_id": len(links), "nodes": list(nodes.values()),
                    "links": links, "groups": [], "config": {},
                    "extra": {"ds": {"scale": 1, "offset": VIEW_OFFSET}}, "version": 0.4}
        path = OUT / f"{title}.json"
        path.write_text(json.dumps(workflow, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {path.relative_to(REPO)}")


# ---- Chromium over the DevTools protocol --------------------------------------------------------
class Page:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            message = await self.ws.receive_json()
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page: {result['exceptionDetails']}")
        return result["result"].get("value")


@contextlib.contextmanager
def chromium(binary: str, width: int, height: int) -> Iterator[int]:
    port = 9300 + int(time.time()) % 500
    profile = tempfile.mkdtemp(prefix="mizuoto-chromium-")
    process = subprocess.Popen([binary, "--headless=new", "--no-sandbox", "--disable-gpu",
                                f"--remote-debugging-port={port}", f"--window-size={width},{height}",
                                f"--user-data-dir={profile}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with contextlib.suppress(OSError):
                get(f"http://127.0.0.1:{port}/json/version")
                break
            time.sleep(0.2)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=20)
        shutil.rmtree(profile, ignore_errors=True)


LOAD = """(async () => {
  const app = window.app ?? window.comfyAPI?.app?.app;
  // A first start opens the template dialog: close dialogs, change no setting.
  document.querySelectorAll(".p-dialog-close-button, .p-dialog-header-close").forEach((b) => b.click());
  await app.loadGraphData(%s, true, true, %s);
  await new Promise((r) => setTimeout(r, 1500));
  const rect = (app.canvasEl ?? app.canvas.canvas).getBoundingClientRect();
  const ds = app.canvas.ds;
  return {scale: ds.scale, canvas: [rect.left, rect.top, rect.width, rect.height],
          nodes: app.graph.nodes.map((n) => ({type: n.type, pos: [...n.pos], size: [...n.size],
            screen: [(n.pos[0] + ds.offset[0]) * ds.scale + rect.left,
                     (n.pos[1] - %d + ds.offset[1]) * ds.scale + rect.top,
                     n.size[0] * ds.scale, (n.size[1] + %d) * ds.scale]}))};
})()"""
# Overlays a thumbnail should not show (the minimap, the canvas toolbar); hidden for the shot.
HIDE = """document.querySelectorAll('[class*="minimap"], .graph-canvas-menu, .selection-toolbox')
  .forEach((e) => { e.style.visibility = %s; })"""


def outside(node: list[float], canvas: list[float]) -> bool:
    left, top, width, height = canvas
    x, y, w, h = node
    return (x < left + COVERED[0] or y < top + COVERED[1] or x + w > left + width - COVERED[2]
            or y + h > top + height - COVERED[3])


def bounds(nodes: list[dict[str, Any]], pad: int = MARGIN) -> dict[str, float]:
    xs = [n["screen"][0] for n in nodes] + [n["screen"][0] + n["screen"][2] for n in nodes]
    ys = [n["screen"][1] for n in nodes] + [n["screen"][1] + n["screen"][3] for n in nodes]
    return {"x": min(xs) - pad, "y": min(ys) - pad, "width": max(xs) - min(xs) + 2 * pad,
            "height": max(ys) - min(ys) + 2 * pad}


async def shots(url: str, binary: str, width: int, height: int, check: bool = True) -> dict[str, list[int]]:
    import aiohttp

    sizes: dict[str, list[int]] = {}
    failures = []
    with chromium(binary, width, height) as port:
        target = next(t for t in get(f"http://127.0.0.1:{port}/json/list") if t["type"] == "page")
        async with aiohttp.ClientSession() as session, session.ws_connect(target["webSocketDebuggerUrl"],
                                                                          max_msg_size=0) as ws:
            page = Page(ws)
            await page.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                            mobile=False)
            await page.call("Page.navigate", url=url)
            for _ in range(120):
                if await page.evaluate("Boolean((window.app ?? window.comfyAPI?.app?.app)?.graph)"):
                    break
                await asyncio.sleep(0.5)
            await asyncio.sleep(2)
            for path in sorted(OUT.glob("*.json")):
                workflow = path.read_text(encoding="utf-8")
                seen = await page.evaluate(LOAD % (workflow, json.dumps(path.stem), TITLE_H, TITLE_H))
                for node in seen["nodes"]:
                    seen_before = sizes.get(node["type"], [0, 0])
                    sizes[node["type"]] = [round(max(seen_before[i], node["size"][i])) for i in (0, 1)]
                    if outside(node["screen"], seen["canvas"]):
                        failures.append(f"{path.stem}: {node['type']} at {[round(v) for v in node['screen']]} is "
                                        f"not fully in view on a {width}x{height} page")
                print(f"{path.stem}: scale {seen['scale']}, nodes "
                      + ", ".join(f"{n['type']} {[round(v) for v in n['pos']]} {[round(v) for v in n['size']]}"
                                  for n in seen["nodes"]))
                clip = bounds(seen["nodes"])
                await page.evaluate(HIDE % "'hidden'")
                shot = await page.call("Page.captureScreenshot", format="jpeg", quality=85,
                                       clip={**clip, "scale": min(1.0, THUMBNAIL_WIDTH / clip["width"])})
                await page.evaluate(HIDE % "''")
                path.with_suffix(".jpg").write_bytes(base64.b64decode(shot["data"]))
    print("sizes:", json.dumps(sizes))
    if failures and check:
        raise SystemExit("\n".join(failures))
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("all", "build", "shots"))
    parser.add_argument("--url", default="http://127.0.0.1:8188")
    parser.add_argument("--sizes", default="{}", help="node sizes from `shots`, as JSON {type: [w, h]}")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    parser.add_argument("--viewport", default="1600x900")
    args = parser.parse_args(argv)
    url = args.url.rstrip("/")
    width, height = map(int, args.viewport.split("x"))
    if args.command == "build":
        build(url, json.loads(args.sizes))
    elif args.command == "shots":
        asyncio.run(shots(url, args.chromium, width, height))
    else:
        build(url, {})
        build(url, asyncio.run(shots(url, args.chromium, width, height, check=False)))
        asyncio.run(shots(url, args.chromium, width, height))
    return 0


if __name__ == "__main__":
    sys.exit(main())
