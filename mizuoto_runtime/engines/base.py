"""The engine protocol: what an engine adapter offers the runtime, the CLI and the nodes.

An engine owns components (registered `ModelHandle`s) and runs a TTS request in phases (M1):
`voice_prompt` (reference audio → a cached voice), `generate` (text + voice → codes) and
`decode` (codes → audio), each wrapping its work in ``ctx.run`` / ``ctx.use`` with its own
working-memory estimate (M45). Unphased engines (`PHASED = False`, e.g. the dummy engine)
get all their handles for the whole call, with `memory_required(text)` (M4, M48).

Every request is checked before any work (`check_request`): `Runtime.say` checks it first, and
every engine's `generate` checks it on entry (the base class wraps each subclass's own), so the
CLI, the runtime and every node refuse bad input with the same one-line error.

Hosts list what an engine can load without loading it: `describe_checkpoint(folder)` reads a
folder's configs (never its weights) and says what it is, or None when the engine cannot load
it; `BUILTIN` describes what the engine runs with no folder at all (None: it needs one).

Everything else about an engine is declared on its class too, and read by the registry
(`engines.__init__`, issue 32): its id (its package's name), its requirements file and upstream
package, the checkpoint versions its package's `tiny.write` writes, its package's reference
stages, its LoRA adapter, and which of its phases and components take a smaller `weights`
choice (`WEIGHTS`, issue 36: one `SmallWeights` per phase; an engine joins by declaring it).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import nn

from ..audio import Audio
from ..errors import ArgumentError, MizuotoError
from ..lru import LruCache
from ..memory.rng import GLOBAL_RNG
from ..memory.small_weights import FP8, PUBLISHED, check_fp8, parse_choice, store_small
from .lora import LoraAdapter, LoraChoice, applied_lora
from .voice_store import VoicePromptStore, prompt_key

if TYPE_CHECKING:
    from ..memory.handle import Kind, ModelHandle
    from ..memory.manager import ModelManager
    from ..memory.phases import RequestContext


class TinyWriter(Protocol):
    """An engine package's `tiny.write`: a small random checkpoint in the engine's own folder
    layout (tests, demos; no download), written into `directory` (created), which it returns.
    `version`: one of the engine's `VERSIONS` (None: the first); `dtype`: the main weights'
    precision (None: float32, or the one precision a writer takes: GPT-SoVITS's float16)."""

    def __call__(self, directory: str | Path, *, version: str | None = None, seed: int = 0,
                 dtype: torch.dtype | None = None) -> Path: ...


SEED_SPACE = 1 << 64  # torch.Generator.manual_seed takes 64 bits


def chunk_seed(seed: int, index: int) -> int:
    """The seed a request's piece `index` samples with (piece 0: the request's own): the chunks
    of long text, the sentences an engine splits it into, a script's lines."""
    return (seed + index) % SEED_SPACE


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


    def check(self) -> None:
        """Values no engine can use are refused, naming the setting."""
        _whole("max_new_tokens", self.max_new_tokens, 1)
        _whole("top_k", self.top_k, 0)
        _finite("temperature", self.temperature, "a finite number >= 0", lambda v: v >= 0)
        _finite("top_p", self.top_p, "a finite number from 0 to 1", lambda v: 0 <= v <= 1)
        _finite("repetition_penalty", self.repetition_penalty, "a finite number > 0", lambda v: v > 0)


def _whole(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ArgumentError(f"{name} must be a whole number >= {least}, got {value!r}")


def _finite(name: str, value: object, what: str, ok: Callable[[float], bool]) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
        raise ArgumentError(f"{name} must be {what}, got {value!r}")


def check_request(text: object, sampling: Sampling) -> None:
    """What every request is checked for before any work: text to speak, and usable sampling."""
    if not isinstance(text, str):
        raise ArgumentError(f"text must be a string, got {type(text).__name__}")
    if not text.strip():
        raise ArgumentError("text is empty: give the words to speak")
    sampling.check()


@dataclasses.dataclass(frozen=True)
class Turn:
    """One turn of a dialogue spoken in one talker pass (issue 34): the index of its voice in
    the pass's voices, and its words."""

    voice: int
    text: str


def check_dialogue(turns: Sequence[Turn], voices: Sequence[Voice], most: int, sampling: Sampling) -> None:
    """What a dialogue pass is checked for before any work: turns with words, each naming one of
    the pass's voices, and no more voices than the engine speaks at once."""
    if not turns:
        raise ArgumentError("the dialogue has no turn: give the lines to speak")
    if len(voices) > most:
        raise ArgumentError(f"{len(voices)} voices in one pass; this engine speaks at most {most} at once")
    for number, turn in enumerate(turns, start=1):
        if isinstance(turn.voice, bool) or not isinstance(turn.voice, int) or not 0 <= turn.voice < len(voices):
            raise ArgumentError(f"turn {number} names voice {turn.voice!r}; the pass has voices 0..{len(voices) - 1}")
        try:
            check_request(turn.text, sampling)
        except ArgumentError as exc:
            raise ArgumentError(f"turn {number}: {exc}") from exc


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


# A typical request (`Engine.typical_phases`, issue 35): a reference voice of 10 s where the
# engine clones one, and text spoken at about 15 characters a second (150 words a minute),
# about 4 characters a token for the BPE tokenizers.
TYPICAL_REFERENCE_SECONDS = 10.0
TYPICAL_CHARS_PER_SECOND = 15
TYPICAL_CHARS_PER_TOKEN = 4


def typical_tokens(seconds: float) -> int:
    """Text tokens of a typical line spoken in `seconds` (BPE; see TYPICAL_CHARS_PER_SECOND)."""
    return max(1, round(seconds * TYPICAL_CHARS_PER_SECOND / TYPICAL_CHARS_PER_TOKEN))


@dataclasses.dataclass(frozen=True)
class PhaseEstimate:
    """One phase of a typical request (`Engine.typical_phases`): its components and the
    working-memory estimate its phase code passes to ``ctx.run`` / ``ctx.use`` (M45)."""

    name: str
    handles: tuple[ModelHandle, ...]
    memory: int
    # Forwards of each streamed unit per token or step: 2 where guidance runs the model's two
    # branches one after the other (VibeVoice's LM), so each streamed unit is copied twice.
    forwards_per_step: int = 1


PHASES: tuple[str, ...] = ("voice_prompt", "generate", "decode")  # the phases of every engine (M1)


@dataclasses.dataclass(frozen=True)
class SmallWeights:
    """What one phase of an engine takes of the `weights` choice (issue 36): the components of
    it whose Linear and Conv weights may be stored small, the layers of them that stay as
    published (a name, or the start of one: a layer read outside its forward), and the choices
    the phase refuses, each with the reason (a vocoder whose quality int8 ruins)."""

    components: tuple[str, ...]
    keep: tuple[str, ...] = ()
    refuses: tuple[tuple[str, str], ...] = ()  # (choice, why)

    def refusal(self, choice: str) -> str | None:
        return next((why for c, why in self.refuses if c == choice), None)


WeightsChoice = str | Mapping[str, str]


# Voices kept per engine (M4): a long session prompting many references must not grow without
# end; a voice a graph still holds keeps working when its cache entry is dropped.
VOICES_KEPT = 32


def element_size(dtype: torch.dtype) -> int:
    """Bytes per element of `dtype` (working-memory estimates count in the run precision)."""
    return torch.empty((), dtype=dtype).element_size()


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


GenerateMethod = Callable[..., Codes]


def _checked_generate(generate: GenerateMethod) -> GenerateMethod:
    @functools.wraps(generate)
    def checked(self: Engine, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling,
                *args: Any, **kwargs: Any) -> Codes:
        check_request(text, sampling)
        return generate(self, ctx, text, voice, sampling, *args, **kwargs)

    return checked


def _checked_dialogue(generate_dialogue: GenerateMethod) -> GenerateMethod:
    @functools.wraps(generate_dialogue)
    def checked(self: Engine, ctx: RequestContext, turns: Sequence[Turn], voices: Sequence[Voice],
                sampling: Sampling, *args: Any, **kwargs: Any) -> Codes:
        check_dialogue(turns, voices, self.VOICES_PER_PASS, sampling)
        return generate_dialogue(self, ctx, turns, voices, sampling, *args, **kwargs)

    return checked


class Engine(ABC):
    """Base of every engine adapter, and what its package declares about it."""

    id: ClassVar[str]  # the name of its package under engines/ (the registry checks it)
    title: ClassVar[str] = ""  # the engine's name as users know it ("Qwen3-TTS"); empty: its id
    # requirements/<REQUIREMENTS>.txt installs what it needs beyond the core (None: nothing).
    REQUIREMENTS: ClassVar[str | None] = None
    # The module `mizuoto doctor` looks for to call it installed (None: the core suffices).
    UPSTREAM: ClassVar[str | None] = None
    # The checkpoint versions its package's `tiny.write` writes, the default first (empty: one).
    VERSIONS: ClassVar[tuple[str, ...]] = ()
    # Modules of its package: the tiny-checkpoint writer (`write`, a `TinyWriter`) and the
    # stages of `mizuoto check-reference` (`stages(ref)`); None: it has none.
    TINY: ClassVar[str | None] = "tiny"
    REFERENCE: ClassVar[str | None] = None
    # The module of its package whose `MODELS` are its published checkpoints as data
    # (`engines.published`, issue 35: "published"); None: it declares none.
    PUBLISHED: ClassVar[str | None] = None
    # Where a LoRA file's update goes (None: it takes no LoRA).
    LORA: ClassVar[LoraAdapter | None] = None
    PHASED: ClassVar[bool] = True
    BUILTIN: ClassVar[CheckpointInfo | None] = None  # what it runs without a checkpoint folder
    # Keyword arguments its `voice_prompt` takes beyond the common ones (IndexTTS-2: "emotion").
    VOICE_OPTIONS: ClassVar[tuple[str, ...]] = ()
    # Whether `encode_voice`'s prompt is kept on disk when the host gives a prompt store
    # (tensors, numbers, strings and containers of them; never pickled). False where the
    # prompt holds an upstream object the store would have to pickle.
    PROMPT_ON_DISK: ClassVar[bool] = True
    # Voices one talker pass speaks (issue 34): above 1, a script's consecutive lines go to
    # `generate_dialogue` together (VibeVoice: 4); 1: a script is spoken line by line.
    VOICES_PER_PASS: ClassVar[int] = 1


    # Which phases take the `weights` choice, and which of their components (issue 36); a phase
    # not named here keeps its weights as published and refuses a choice made for it by name.
    WEIGHTS: ClassVar[Mapping[str, SmallWeights]] = {}
    sample_rate: int = 24000

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Each engine's own `generate` and `generate_dialogue` check their request first (nodes
        call them directly)."""
        super().__init_subclass__(**kwargs)
        generate = cls.__dict__.get("generate")
        if generate is not None and not getattr(generate, "__isabstractmethod__", False):
            cls.generate = _checked_generate(generate)  # type: ignore[method-assign]
        dialogue = cls.__dict__.get("generate_dialogue")
        if dialogue is not None:
            cls.generate_dialogue = _checked_dialogue(dialogue)  # type: ignore[method-assign]

    def __init__(self, manager: ModelManager, model_dir: str | Path | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> None:
        self.manager = manager
        self.model_dir = Path(model_dir) if model_dir else None
        self.dtype = dtype
        self.device = device or manager.devices.compute_device()  # where its components run
        # Set by `load` before this runs (an engine's own __init__ keeps its signature).
        self.weights: dict[str, str] = self.__dict__.get("weights", {p: PUBLISHED for p in self.WEIGHTS})
        self.voices: LruCache[str, Voice] = LruCache(VOICES_KEPT)
        # Prompted voices kept across restarts (M4); the host sets it (`Runtime.prompt_store`).
        self.prompt_store: VoicePromptStore | None = None

    @classmethod
    def load(cls, manager: ModelManager, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
             device: torch.device | None = None, weights: WeightsChoice = PUBLISHED) -> Engine:
        """The engine, its components' weights stored as `weights` says (`weights_per_phase`)."""
        engine = cls.__new__(cls)
        engine.weights = cls.weights_per_phase(weights)
        engine.__init__(manager, model_dir, dtype, device)  # type: ignore[misc]
        return engine

    @classmethod
    def weights_per_phase(cls, weights: WeightsChoice) -> dict[str, str]:
        """The choice for each phase that takes one (`WEIGHTS`). One choice applies to every phase
        that does not refuse it (those keep theirs as published); a choice named for a phase
        must be taken by it. Anything else is one error saying what the engine takes."""
        if isinstance(weights, str):
            choice = parse_choice(weights)
            if choice == PUBLISHED:
                return {p: PUBLISHED for p in cls.WEIGHTS}
            taken = {p: choice if d.refusal(choice) is None else PUBLISHED for p, d in cls.WEIGHTS.items()}
            if not any(c == choice for c in taken.values()):
                raise ArgumentError(f"engine {cls.id!r} takes no {choice} weights: {cls._refusals(choice)}")
            return taken
        if not isinstance(weights, Mapping):
            raise ArgumentError(f"weights must be a choice or a mapping of phase to choice, got {weights!r}")
        out = {p: PUBLISHED for p in cls.WEIGHTS}
        for phase, value in weights.items():
            choice = parse_choice(value, f"weights for {phase!r}")
            if phase not in PHASES:
                raise ArgumentError(f"weights: unknown phase {phase!r}; the phases are {', '.join(PHASES)}")
            declared = cls.WEIGHTS.get(phase)
            if choice != PUBLISHED and (declared is None or declared.refusal(choice) is not None):
                why = "it declares no smaller weights" if declared is None else declared.refusal(choice)
                raise ArgumentError(f"engine {cls.id!r}: the {phase} phase takes no {choice} weights: {why}")
            if declared is not None:
                out[phase] = choice
        return out

    @classmethod
    def _refusals(cls, choice: str) -> str:
        if not cls.WEIGHTS:
            return "its phases declare no smaller weights"
        return "; ".join(f"{p}: {d.refusal(choice)}" for p, d in cls.WEIGHTS.items())

    def weights_phase(self, component: str) -> str | None:
        """The phase whose `weights` choice `component` takes (None: it takes none)."""
        return next((p for p, d in self.WEIGHTS.items() if component in d.components), None)

    @classmethod
    def package_module(cls, name: str) -> ModuleType:
        """The module `name` of this engine's package (imported now: it may import the engine's
        upstream package)."""
        return importlib.import_module(f"{cls.__module__.rpartition('.')[0]}.{name}")

    @classmethod
    def tiny_writer(cls) -> TinyWriter:
        """Its package's tiny-checkpoint writer."""
        if cls.TINY is None:
            raise MizuotoError(f"engine {cls.id!r} has no tiny-checkpoint writer")
        writer: TinyWriter = cls.package_module(cls.TINY).write
        return writer

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        """What `folder` is for this engine, from its configs alone (no weights are read);
        None when this engine cannot load it. Must not raise for a folder of another kind."""
        return None

    @classmethod
    def checkpoint_entries(cls, folder: Path) -> list[tuple[str, CheckpointInfo]]:
        """What `folder` offers this engine: ``("", info)`` for the folder itself, or one entry per
        file inside it that is a choice of its own (``(file name, info)``: GPT-SoVITS's folders
        of several voices). Must not raise for a folder of another kind."""
        info = cls.describe_checkpoint(folder)
        return [("", info)] if info is not None else []

    def register(self, module: torch.nn.Module, name: str, kind: Kind = "oneshot",
                 graphable: bool = False) -> ModelHandle:
        """Register one component on this engine's device, its weights stored as its phase's
        `weights` choice says (converted here, on the host, before the handle counts its bytes)."""
        phase = self.weights_phase(name)
        choice = self.weights.get(phase, PUBLISHED) if phase is not None else PUBLISHED
        if choice != PUBLISHED:
            store_small(module, choice, keep=self.WEIGHTS[phase].keep, what=f"{self.id}:{name}")  # type: ignore[index]
        for dtype in {t.dtype for t in module.parameters()} & set(FP8.values()):
            check_fp8(dtype, self.device, f"{self.id}:{name}")
        handle = self.manager.register(module, engine=self.id, name=name, kind=kind, graphable=graphable,
                                       device=self.device)
        handle.weights_phase = phase
        return handle

    @abstractmethod
    def handles(self) -> list[ModelHandle]:
        """Every component this engine registered."""

    @contextlib.contextmanager
    def seeded(self, seed: int) -> Iterator[None]:
        """For upstream code that samples from torch's global RNG (CPU, or this engine's device):
        seeded for one phase only, so retries and placements replay the same draws and the
        caller's RNG is left as it was (M40, M57). The global RNG is one per process: two
        requests at once (`compute.gpu_jobs` > 1) take turns inside this block (M8)."""
        on_cpu = self.device.type == "cpu"
        with GLOBAL_RNG, torch.random.fork_rng(devices=[] if on_cpu else [self.device.index or 0],
                                               device_type=None if on_cpu else self.device.type):
            torch.manual_seed(seed)
            yield

    def rng_state(self) -> torch.Tensor:
        """The state of the generator this engine's sampling draws from (its device's), for an
        engine whose upstream continues one random stream across phases (the stream `seeded`
        forks)."""
        if self.device.type == "cuda":
            return torch.cuda.get_rng_state(self.device)
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Continue the stream `rng_state` saved, on this engine's device."""
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(state, self.device)
        else:
            torch.set_rng_state(state)

    @staticmethod
    @contextlib.contextmanager
    def progress_per_call(ctx: RequestContext, module: nn.Module, total: int) -> Iterator[None]:
        """Progress and interrupt once per call of `module` (one step of an upstream loop). The
        hook sits on a shared module: it reports only this request's thread."""
        count = iter(range(total + 1))
        thread = threading.get_ident()

        def pre(_module: nn.Module, _args: Any) -> None:
            if threading.get_ident() == thread:
                ctx.progress(next(count, total), total)

        hook = module.register_forward_pre_hook(pre)
        try:
            yield
        finally:
            hook.remove()

    def use_lora(self, choice: LoraChoice | None) -> None:
        """Its checkpoint weights plus `choice`'s update (None: its checkpoint weights), M28;
        nothing happens when it runs with them already."""
        if self.LORA is not None:
            self.LORA.use(self, choice)
        elif choice is not None:
            raise MizuotoError(f"LoRA files do not apply to the {self.id} engine: it takes none")

    def applied_lora(self) -> LoraChoice | None:
        """The LoRA it runs with now (None: its checkpoint weights)."""
        return applied_lora(self)

    def memory_required(self, text: str) -> int:
        """Working memory of a whole unphased call (M48)."""
        return 0

    def typical_phases(self, seconds: float) -> list[PhaseEstimate]:
        """The phases of a typical request giving `seconds` of speech (a 10 s reference voice
        where the engine clones one), each with its components and the estimate the engine's
        own phase code computes for it (issue 35: the fit table places these). From the
        configuration alone: it runs on a model built on meta (`engines.published`)."""
        raise MizuotoError(f"engine {self.id!r} does not describe a typical request")

    # ---- phases --------------------------------------------------------------------------
    def voice_prompt(self, ctx: RequestContext, reference: Audio | None = None,
                     transcript: str | None = None, speaker: str | None = None,
                     instruct: str | None = None) -> Voice:
        """A voice, from the cache when the same reference was prompted before (M4): in memory,
        else in the host's prompt store on disk (also across restarts), else encoded now.

        `instruct` is a natural-language voice or style description, for engines that take one.
        """
        key = voice_key(reference, transcript, speaker, instruct)
        voice = self.voices.get(key)
        if voice is None:  # one read: another request may drop the entry at any moment
            encode = functools.partial(self.encode_voice, ctx, reference, transcript, speaker, instruct=instruct)
            store = self.prompt_store if self.PROMPT_ON_DISK else None
            data = encode() if store is None else store.get_or_encode(
                prompt_key(self, reference, transcript, speaker, instruct), encode)
            voice = Voice(key, data, self.id)
            self.voices[key] = voice
        return voice

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

    def generate_dialogue(self, ctx: RequestContext, turns: Sequence[Turn], voices: Sequence[Voice],
                          sampling: Sampling) -> Codes:
        """The talker phase for several voices in one pass (`VOICES_PER_PASS` > 1): each turn's
        words in `voices[turn.voice]`, formatted as the model takes a dialogue. `decode` turns
        the codes into the dialogue's audio."""
        raise MizuotoError(f"engine {self.id!r} speaks one voice per pass: speak a dialogue line by line")

    def synthesize(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling,
                   allow_fallback: bool | None = None) -> Audio:
        codes = self.generate(ctx, text, voice, sampling)
        return self.decode(ctx, codes, allow_fallback)

    def unload(self) -> None:
        for h in self.handles():
            self.manager.unregister(h)
        self.voices.clear()
