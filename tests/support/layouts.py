"""Checkpoint folders in their official layouts, written by tests without any engine package:
the real configs, placeholder weights. What `describe_checkpoint` and the listing read."""
from __future__ import annotations

import json
from pathlib import Path

from mizuoto_runtime.engines.qwen3tts import tiny
from mizuoto_runtime.engines.qwen3tts.checkpoint import REQUIRED_FILES


def touch(path: Path, text: str = "{}") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def qwen_layout(folder: Path, model_type: str) -> Path:
    """The official Qwen3-TTS 12 Hz folder: the configs the tiny writer makes, placeholder
    weights and tokenizer files."""
    for name in REQUIRED_FILES:
        touch(folder / name)
    special = tiny.text_tokenizer()[3]
    touch(folder / "config.json", json.dumps(tiny.main_config(model_type, special, "float32")))
    touch(folder / "speech_tokenizer" / "config.json", json.dumps(tiny.speech_tokenizer_config()))
    return folder
