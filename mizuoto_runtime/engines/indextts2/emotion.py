"""How a request sets IndexTTS-2's emotion: a reference audio, weights of its eight emotions, or
text its emotion model reads (upstream infer_v2's emo_audio_prompt / emo_vector / use_emo_text)."""
from __future__ import annotations

import dataclasses

from ...audio import Audio
from ...errors import ArgumentError
from ..base import voice_key

EMOTIONS = ("happy", "angry", "sad", "afraid", "disgusted", "melancholic", "surprised", "calm")  # the model's order
MAX_WEIGHT = 1.2
BIAS = (0.9375, 0.875, 1.0, 1.0, 0.9375, 0.9375, 0.6875, 0.5625)  # upstream's normalize_emo_vec, EMOTIONS order
MAX_TOTAL = 0.8


@dataclasses.dataclass(frozen=True)
class Emotion:
    """One of: a reference audio (mixed with the voice's own emotion by `alpha`); eight weights
    over the checkpoint's emotion matrix in `EMOTIONS` order; or text the emotion model turns into
    those weights (`from_text`; `text` None reads the text being spoken). Weights are scaled by
    `alpha` (clamped to 0..1); `random` picks each emotion's matrix row at random (seeded by the
    request) instead of the row nearest the voice, as upstream's `use_random`."""

    audio: Audio | None = None
    vector: tuple[float, ...] | None = None
    alpha: float = 1.0
    text: str | None = None
    from_text: bool = False
    random: bool = False

    def key(self) -> str:
        extra = f"text={self.text!r},random={self.random}" if self.from_text or self.random else None
        return voice_key(self.audio, repr(self.vector), extra, f"alpha={self.alpha}")

    @property
    def by_weights(self) -> bool:
        """Weights decide it (given, or read from text): resolved per request, under its seed."""
        return self.audio is None and (self.vector is not None or self.from_text)

    @classmethod
    def from_inputs(cls, audio: Audio | None, weights: str, alpha: float, text: str | None = None,
                    from_text: bool = False, random: bool = False, balance: bool = False) -> Emotion | None:
        """From a UI's inputs: an audio wins over `weights` ("sad=0.8, calm=0.2"), which win over
        text for the emotion model (`text`, or with `from_text` the spoken text); None when all
        are unset. `balance` tones the weights down as upstream's web UI does (`balanced`)."""
        vector = parse_weights(weights)
        if audio is not None:
            return cls(audio=audio, alpha=alpha)
        if vector is not None:
            return cls(vector=balanced(vector) if balance else vector, alpha=alpha, random=random)
        if text or from_text:
            return cls(alpha=alpha, text=text or None, from_text=True, random=random)
        return None


def balanced(weights: tuple[float, ...]) -> tuple[float, ...]:
    """Upstream's `normalize_emo_vec` (its web UI's sliders): each weight times its emotion's bias
    (toning down those that sound strange), then all scaled so they sum to at most 0.8."""
    biased = [w * b for w, b in zip(weights, BIAS)]
    total = sum(biased)
    if total <= MAX_TOTAL:
        return tuple(biased)
    scale = MAX_TOTAL / total
    return tuple(w * scale for w in biased)


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
