"""CSM's constants: Mimi's rate and frame (its published shapes are in `published`).

A frame is 32 codes (Mimi's 32 codebooks at 12.5 Hz): the backbone predicts the first, the depth
decoder the other 31; a frame of 32 zeros ends the utterance.
"""
from __future__ import annotations

SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920  # Mimi: 24 kHz / 12.5 Hz
