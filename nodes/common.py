"""What the pack's nodes share: the schema, socket types, AUDIO conversion, sampling, voice and
language inputs, the memory report."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch
from comfy_api.latest import io

from mizuoto_runtime import Audio, MizuotoError
from mizuoto_runtime.app.host import EngineRef
from mizuoto_runtime.engines import Codes, Engine, Sampling, Voice

CATEGORY = "audio/Mizuoto TTS"
STEPS_CATEGORY = f"{CATEGORY}/step by step"

EngineSocket = io.Custom("MIZUOTO_ENGINE")
VoiceSocket = io.Custom("MIZUOTO_VOICE")
CodesSocket = io.Custom("MIZUOTO_CODES")
MemorySocket = io.Custom("MIZUOTO_MEMORY")
# Voice options one engine reads (`Engine.VOICE_OPTIONS`, e.g. IndexTTS-2's emotion), as a dict.
OptionsSocket = io.Custom("MIZUOTO_OPTIONS")

SEED_MAX = 0xFFFF_FFFF_FFFF_FFFF  # torch.Generator.manual_seed takes 64 bits
NO_SPEAKER = "none"
AUTO_LANGUAGE = "auto"


def schema(**fields: Any) -> io.Schema:
    """`io.Schema`, with `search_aliases` where this ComfyUI has them (newer than v0.8.0);
    older frontends search the node id and display name only, so display names carry the
    words users search for."""
    if "search_aliases" not in {f.name for f in dataclasses.fields(io.Schema)}:
        fields.pop("search_aliases", None)
    return io.Schema(**fields)


def linked_type_errors(node: type[io.ComfyNode], input_types: dict[str, Any]) -> str | None:
    """What ComfyUI checks of each link unless a node's `validate_inputs` asks for
    `input_types`: that the type arriving is the one the input takes. None when all match."""
    declared: dict[str, Any] = {}
    for section in node.INPUT_TYPES().values():
        declared.update({name: spec[0] for name, spec in section.items() if isinstance(spec, tuple | list)})
    for name, received in input_types.items():
        expected = declared.get(name)
        if not (isinstance(received, str) and isinstance(expected, str)) or "*" in (received, expected):
            continue
        if not set(received.split(",")) & set(expected.split(",")):
            return f"input {name!r} takes {expected}, but a {received} output is connected to it"
    return None


def phased_engine(ref: EngineRef, node: str) -> Engine:
    """The engine behind a socket, for a node that runs one phase (M1)."""
    engine = ref.engine
    if not engine.PHASED:
        raise MizuotoError(f"{node}: engine {engine.id!r} runs as one call, not in phases; "
                           "use the Text to Speech node with it")
    return engine


def check_made_by(value: Voice | Codes, engine: Engine, what: str) -> None:
    if value.engine != engine.id:
        raise MizuotoError(f"{what} was made by engine {value.engine!r}; this node's engine is {engine.id!r}")


def audio_in(audio: dict[str, Any] | None, name: str) -> Audio | None:
    """ComfyUI AUDIO (`waveform` [B, C, T]) → the runtime's `Audio` ([C, T]) of batch item 0."""
    if audio is None:
        return None
    waveform, rate = audio.get("waveform"), audio.get("sample_rate")
    if not isinstance(waveform, torch.Tensor) or waveform.dim() != 3 or not isinstance(rate, int):
        raise MizuotoError(f"input {name!r}: expected AUDIO {{'waveform': [batch, channels, samples], "
                           f"'sample_rate': int}}, got {type(waveform).__name__} {getattr(waveform, 'shape', '')}")
    return Audio(waveform[0].float().cpu(), rate)


def audio_out(audio: Audio) -> dict[str, Any]:
    """The runtime's `Audio` → ComfyUI AUDIO: float32 [1, C, T] on the CPU."""
    return {"waveform": audio.waveform.float().cpu().unsqueeze(0).contiguous(), "sample_rate": audio.sample_rate}


def sampling_inputs() -> list[io.Input]:
    defaults = Sampling()
    return [
        io.Int.Input("seed", default=0, min=0, max=SEED_MAX, control_after_generate=True,
                     tooltip="Same seed, same text, same voice: same audio."),
        io.Float.Input("temperature", default=defaults.temperature, min=0.0, max=2.0, step=0.05,
                       tooltip="Higher: livelier and less predictable speech; lower: flatter and steadier"),
        io.Int.Input("top_k", default=defaults.top_k, min=0, max=1000,
                     tooltip="Sample among the k likeliest codes; 0 = off"),
        io.Float.Input("top_p", default=defaults.top_p, min=0.0, max=1.0, step=0.01,
                       tooltip="Sample among the likeliest codes that make up this probability; 1 = off"),
        io.Float.Input("repetition_penalty", default=defaults.repetition_penalty, min=1.0, max=10.0, step=0.01,
                       tooltip="Above 1 discourages repeated sounds and stutters (IndexTTS-2 is made for 10)"),
        io.Int.Input("max_new_tokens", default=defaults.max_new_tokens, min=1, max=16384,
                     tooltip="Upper bound on the speech codes generated (per chunk of text); memory is "
                             "reserved for what the text needs, not for this bound"),
        io.Boolean.Input("do_sample", default=defaults.do_sample,
                         tooltip="Off: always the likeliest code (deterministic, often monotone)"),
    ]


def speaker_input(speakers: list[str]) -> io.Input:
    """A dropdown of built-in speakers: every checkpoint's at definition time; the web
    extension narrows it to the chosen checkpoint's."""
    return io.Combo.Input("speaker", options=[NO_SPEAKER, *speakers], default=NO_SPEAKER, optional=True,
                          tooltip="A built-in voice of the checkpoint (Qwen3-TTS CustomVoice); none for "
                                  "checkpoints without speakers")


def language_input(languages: list[str]) -> io.Input:
    return io.Combo.Input("language", options=languages or [AUTO_LANGUAGE], default=AUTO_LANGUAGE, optional=True,
                          tooltip="The text's language, from the checkpoint's list; auto = the engine detects it")


def speaker_value(speaker: str) -> str | None:
    """A speaker choice as the engines take it ("none", or empty in older workflows: None)."""
    return None if speaker.strip() in ("", NO_SPEAKER) else speaker.strip()


def sampling_from(seed: int, temperature: float, top_k: int, top_p: float, repetition_penalty: float,
                  max_new_tokens: int, do_sample: bool, language: str = "") -> Sampling:
    language = language.strip()
    return Sampling(seed=seed, temperature=temperature, top_k=top_k, top_p=top_p,
                    repetition_penalty=repetition_penalty, max_new_tokens=max_new_tokens, do_sample=do_sample,
                    language=None if language.lower() in ("", AUTO_LANGUAGE) else language)


FALLBACK_TOOLTIP = ("When the exact out-of-memory retries fail, decode with the engine's cheaper tiled fallback "
                    "(the output differs slightly). On: allowed for this node whatever Memory Settings say. "
                    "Off: Memory Settings' oom_fallback decides (off by default). CosyVoice's vocoder has no "
                    "fallback: its source's phase runs through the whole utterance, so it cannot be cut into tiles.")


def memory_text(meta: dict[str, Any]) -> str:
    """`meta.memory` and `meta.applied` (M50) as the lines a node shows: a summary, then one
    plain line per component (the request report's `line`), then retries and fallbacks."""
    memory, applied = meta["memory"], meta["applied"]
    request = memory["request"]
    chunks = int(meta.get("chunks", 1))
    spoken = [f"spoken in {chunks} chunks of text"] if chunks > 1 else []
    if not request["components"]:
        return "\n".join([*spoken, "no component placed (a cached or built-in voice)"])
    lines = [*spoken, f"loaded {memory['loaded_mb']:.1f} of {memory['size_mb']:.1f} MB · "
             f"{memory['streamed_mb']:.1f} MB streamed from RAM · {request['device']}"]
    lines += [component["line"] for component in request["components"]]
    if applied["oom_retries"]:
        lines.append(f"out of memory: retried exactly {applied['oom_retries']}× (same result, slower)")
    if applied["fallbacks"]:
        lines.append(f"fallback used (output differs slightly): {', '.join(applied['fallbacks'])}")
    return "\n".join(lines)


def memory_json(meta: dict[str, Any]) -> str:
    return json.dumps(meta, indent=1)
