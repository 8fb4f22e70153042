"""Higgs Audio v2's prompt text: the system prompt and scene of the published examples (its
published shapes are in `published`)."""
from __future__ import annotations

#: The system prompt of the published examples; speaker tags are read as the voice to use.
SYSTEM_PROMPT = "Generate audio following instruction."
#: The scene description of the published examples.
SCENE = "Audio is recorded from a quiet room."
