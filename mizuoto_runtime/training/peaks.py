"""Measured training peaks (M63), one row per method, base model, preset and batch size.

Each row says where it came from. CPU rows are the training phase's peak resident set above
the training process's start (`meter.PeakMeter`), measured by `bench/training.py`; they stand
in for GPU rows until a GPU measures them.
"""
from __future__ import annotations

from .estimate import PeakRow

QWEN3TTS_LORA_PEAKS: tuple[PeakRow, ...] = (
    PeakRow("qwen3tts tiny Base", 5_880_000, "default", 1, 100.0, "cpu", "provisional"),
    PeakRow("qwen3tts tiny Base", 5_880_000, "low", 1, 100.0, "cpu", "provisional"),
    PeakRow("qwen3tts tiny Base", 5_880_000, "lowest", 1, 100.0, "cpu", "provisional"),
)
