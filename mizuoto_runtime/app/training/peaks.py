"""Measured training peaks (M63), one row per method, base model, preset and batch size.

Each row says where it came from. CPU rows are the training phase's peak resident set above
the training process's start (`meter.PeakMeter`), measured by `bench/training.py`; they stand
in for GPU rows until a GPU measures them.
"""
from __future__ import annotations

from .estimate import PeakRow

QWEN3TTS_LORA_PEAKS: tuple[PeakRow, ...] = (
    PeakRow("qwen3tts tiny Base", 5779016, "default", 1, 114.0, "cpu",
            "bench/training.py, 10 steps, 2 clips of 1 s, 2-core CPU, 2026-12-01"),
    PeakRow("qwen3tts tiny Base", 5779016, "low", 1, 115.2, "cpu",
            "bench/training.py, 10 steps, 2 clips of 1 s, 2-core CPU, 2026-12-01"),
    PeakRow("qwen3tts tiny Base", 5779016, "lowest", 1, 125.0, "cpu",
            "bench/training.py, 10 steps, 2 clips of 1 s, 2-core CPU, 2026-12-01"),
    PeakRow("qwen3tts tiny Base", 5779016, "default", 2, 160.6, "cpu",
            "bench/training.py, 10 steps, 2 clips of 1 s, 2-core CPU, 2026-12-01"),
    PeakRow("qwen3tts tiny Base", 5779016, "low", 2, 143.7, "cpu",
            "bench/training.py, 10 steps, 2 clips of 1 s, 2-core CPU, 2026-12-01"),
    PeakRow("qwen3tts tiny Base", 5779016, "lowest", 2, 139.4, "cpu",
            "bench/training.py, 10 steps, 2 clips of 1 s, 2-core CPU, 2026-12-01"),
)
