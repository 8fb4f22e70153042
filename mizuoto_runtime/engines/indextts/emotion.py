"""How a request sets IndexTTS-2's emotion: a reference audio, or weights of its eight emotions."""
from __future__ import annotations

import dataclasses

from ...audio import Audio
from ...errors import ArgumentError
from ..base import voice_key

EMOTIONS = ("happy", "angry", "sad", "afraid", "disgusted", "melancholic", "surprised", "calm")  # the model's order
MAX_WEIGHT = 1.2


@dataclasses.dataclass(frozen=True)
class Emotion:
    """A reference audio (mixed with the voice's own emotion by `alpha`), or eight weights over
    the checkpoint's emotion matrix in `EMOTIONS` order (scaled by `alpha`)."""

    audio: Audio | None = None
    vector: tuple[float, ...] | None = None
    alpha: float = 1.0

    def key(self) -> str:
        return voice_key(self.audio, repr(self.vector), None, f"alpha={self.alpha}")

    @classmethod
    def from_inputs(cls, audio: Audio | None, weights: str, alpha: float) -> "Emotion | None":
        """From a UI's inputs: an audio wins over `weights` ("sad=0.8, calm=0.2"); None when both
        are unset."""
        vector = parse_weights(weights)
        if audio is None and vector is None:
            return None
        return cls(audio=audio, vector=None if audio is not None else vector, alpha=alpha)


def parse_weights(text: str) -> tuple[float, ...] | None:
    """'sad=0.8, calm=0.2' -> the eight weights in the model's order; None when empty or all 0."""
    weights = dict.fromkeys(EMOTIONS, 0.0)
    for item in text.replace(";", ",").split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        name = name.strip().lower()
        if not sep or name not in weights:
            raise ArgumentError(f"emotion: {item.strip()!r} is not name=weight with a name of {', '.join(EMOTIONS)}")
        try:
            weights[name] = float(value)
        except ValueError:
            raise ArgumentError(f"emotion: the weight of {name!r} is not a number: {value.strip()!r}") from None
        if not 0.0 <= weights[name] <= MAX_WEIGHT:
            raise ArgumentError(f"emotion: the weight of {name!r} must be from 0 to {MAX_WEIGHT}, got {weights[name]}")
    return tuple(weights.values()) if any(weights.values()) else None
