"""The engine protocol: what an engine adapter offers the runtime, the CLI and the nodes.

An engine owns components (registered `ModelHandle`s) and runs a TTS request in phases (M1):
`voice_prompt` (reference audio → a cached voice), `generate` (text + voice → codes) and
`decode` (codes → audio), each wrapping its work in ``ctx.run`` / ``ctx.use`` with its own
working-memory estimate (M45). Unphased engines (`PHASED = False`, e.g. the dummy engine)
get all their handles for the whole call, with `memory_required(text)` (M4, M48).

Hosts list what an engine can load without loading it: `describe_checkpoint(folder)` reads a
folder's configs (never its weights) and says what it is, or None when the engine cannot load
it; `BUILTIN` describes what the engine runs with no folder at all (None: it needs one).
"""
from __future__ import annotations

import dataclasses
import hashlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..audio import Audio

if TYPE_CHECKING:
    from ..handle import Kind, ModelHandle
    from ..manager import ModelManager
    from ..phases import RequestContext


@dataclasses.dataclass
class Sampling:
    """Generation settings a request may set; engines ignore what they do not use."""

    seed: int = 0
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    max_new_tokens: int = 2048
    do_sample: bool = True
    language: str | None = None  # None: the engine detects it ("Auto")
    # A second sampler some engines run per frame (Qwen3-TTS's code predictor); None: the
    # checkpoint's own default.
    subtalker_do_sample: bool | None = None
    subtalker_temperature: float | None = None
    subtalker_top_k: int | None = None
    subtalker_top_p: float | None = None


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint folder is, read from its configs: its type as users know it (Qwen3-TTS
    "Base", "CustomVoice", "VoiceDesign"), its built-in speakers and the languages it takes
    ("auto" first where the engine detects the language)."""

    label: str
    speakers: list[str] = dataclasses.field(default_factory=list)
    languages: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Voice:
    """A voice prompt, cached by the engine under `key` (M4: a cached voice is not re-encoded)."""

    key: str
    data: dict[str, Any]
    engine: str


@dataclasses.dataclass
class Codes:
    """What the talker produced, ready for the codec decoder."""

    tokens: torch.Tensor
    engine: str
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def voice_key(reference: Audio | None, transcript: str | None, speaker: str | None = None,
              instruct: str | None = None) -> str:
    h = hashlib.sha256()
    if reference is not None:
        h.update(str(reference.sample_rate).encode())
        h.update(reference.waveform.detach().float().contiguous().numpy().tobytes())
    h.update(b"\0" + (transcript or "").encode())
    h.update(b"\0" + (speaker or "").encode())
    if instruct is not None:  # only then, so keys of voices without one stay what they were
        h.update(b"\0instruct\0" + instruct.encode())
    return h.hexdigest()[:16]


class Engine(ABC):
    """Base of every engine adapter."""

    id: ClassVar[str]
    title: ClassVar[str] = ""  # the engine's name as users know it ("Qwen3-TTS"); empty: its id
    PHASED: ClassVar[bool] = True
    BUILTIN: ClassVar[CheckpointInfo | None] = None  # what it runs without a checkpoint folder
    sample_rate: int = 24000

    def __init__(self, manager: ModelManager, model_dir: str | Path | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> None:
        self.manager = manager
        self.model_dir = Path(model_dir) if model_dir else None
        self.dtype = dtype
        self.device = device or manager.devices.compute_device()  # where its components run
        self.voices: dict[str, Voice] = {}

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        """What `folder` is for this engine, from its configs alone (no weights are read);
        None when this engine cannot load it. Must not raise for a folder of another kind."""
        return None

    def register(self, module: torch.nn.Module, name: str, kind: Kind = "oneshot",
                 graphable: bool = False) -> ModelHandle:
        """Register one component on this engine's device."""
        return self.manager.register(module, engine=self.id, name=name, kind=kind, graphable=graphable,
                                     device=self.device)

    @abstractmethod
    def handles(self) -> list[ModelHandle]:
        """Every component this engine registered."""

    def memory_required(self, text: str) -> int:
        """Working memory of a whole unphased call (M48)."""
        return 0

    # ---- phases --------------------------------------------------------------------------
    def voice_prompt(self, ctx: RequestContext, reference: Audio | None = None,
                     transcript: str | None = None, speaker: str | None = None,
                     instruct: str | None = None) -> Voice:
        """A voice, from the cache when the same reference was prompted before (M4).

        `instruct` is a natural-language voice or style description, for engines that take one.
        """
        key = voice_key(reference, transcript, speaker, instruct)
        if key not in self.voices:
            data = self.encode_voice(ctx, reference, transcript, speaker, instruct=instruct)
            self.voices[key] = Voice(key, data, self.id)
        return self.voices[key]

    @abstractmethod
    def encode_voice(self, ctx: RequestContext, reference: Audio | None, transcript: str | None,
                     speaker: str | None, instruct: str | None = None) -> dict[str, Any]:
        """The voice-prompt phase proper (placed only when the voice is not cached)."""

    @abstractmethod
    def generate(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling) -> Codes:
        """The talker phase."""

    @abstractmethod
    def decode(self, ctx: RequestContext, codes: Codes, allow_fallback: bool | None = None) -> Audio:
        """The codec-decoder phase. `allow_fallback`: the caller's switch for a cheaper decode after
        OOM (M42, M44); None follows `compute.oom_fallback`."""

    def synthesize(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling,
                   allow_fallback: bool | None = None) -> Audio:
        codes = self.generate(ctx, text, voice, sampling)
        return self.decode(ctx, codes, allow_fallback)

    def unload(self) -> None:
        for h in self.handles():
            self.manager.unregister(h)
        self.voices.clear()
