"""Dia's constants: the codec's rate and hop, the delay pattern, the audio token ids and the
speaker tags (its published shapes are in `published`).

The token ids are the processor's and the config's: audio codes 0..1023, then EOS 1024, PAD
1025, BOS 1026 (vocabulary 1028, 9 channels under the delay pattern below).
"""
from __future__ import annotations

SAMPLE_RATE = 44100
HOP = 512  # DAC 44 kHz: 2 * 4 * 8 * 8 samples per code frame (86 frames a second)
DELAY_PATTERN = [0, 8, 9, 10, 11, 12, 13, 14, 15]
AUDIO_EOS, AUDIO_PAD, AUDIO_BOS = 1024, 1025, 1026
SPEAKER_TAGS = ("[S1]", "[S2]")  # the tokenizer's two speaker tokens: at most two voices in one pass
