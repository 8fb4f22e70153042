"""Runtime: the one object a host (CLI, ComfyUI nodes) holds — policy, devices, manager, engines."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..audio import Audio
from ..engines import Engine, Sampling, Voice, check_request, engine_class
from ..engines.base import WeightsChoice
from ..engines.voice_store import VoicePromptStore
from ..errors import ArgumentError, DeviceTooSmallError, MizuotoError
from ..memory import cuda_allocator
from ..memory.calibration import Calibration, default_path
from ..memory.devices import DeviceService
from ..memory.manager import ModelManager
from ..memory.phases import RequestContext
from ..memory.policy import MB, VramPolicy
from ..memory.report import model_state, where
from ..memory.service import RuntimeService
from ..memory.small_weights import parse_weights
from ..nn.dtypes import parse_dtype
from .chunking import NO_CHUNKING, ChunkProgress, TextChunking, chunk_seed, join_chunks
from .scripts.runner import CharacterVoice, LineJob, ScriptAudio, run_phases, speak_script, speak_subtitles
from .scripts.subtitles import Cue, Placed, Timing
from .scripts.syntax import Script

log = logging.getLogger(__name__)


def engine_dtype(name: str | torch.dtype) -> torch.dtype:
    """A name parsed; a torch dtype as it is (each engine says which ones it runs)."""
    return name if isinstance(name, torch.dtype) else parse_dtype(name)


class Runtime:
    """Policy, device service, manager and loaded engines for one process."""

    def __init__(self, settings: Mapping[str, Any] | None = None, devices: DeviceService | None = None) -> None:
        self.policy = VramPolicy(settings)
        sim = self.policy.simulate_vram_mb
        self.devices = devices or DeviceService(simulate={"cpu": int(sim * MB)} if sim else None, strict=bool(sim))
        # M47: calibration persists across runs; M54: the allocator is chosen before torch loads
        # (the command line's entry point); here it is only checked, and said once if too late.
        self.manager = ModelManager(self.devices, self.policy, calibration=Calibration(default_path()))
        cuda_allocator.state(self.policy.cuda_allocator)
        self.service = RuntimeService(self.manager, self.policy)  # M29, M34: which engines stay loaded
        self._loading = threading.Lock()  # two requests asking at once load an engine once (M8)
        # Where engines keep prompted voices on disk (M4 across restarts); None: in memory only.
        self.prompt_store: VoicePromptStore | None = None

    def engine(self, engine_id: str, model_dir: str | Path | None = None, dtype: str | torch.dtype = "float32",
               device: str | torch.device | None = None, weights: WeightsChoice | None = None) -> Engine:
        """Load an engine once per (engine, folder, dtype, device, weights) and keep it. `device`:
        where its components run — "auto"/None for the compute device, or one of
        `devices.devices()`. `weights`: how its weights are stored (a choice, phase=choice pairs
        or a mapping of them, see `Engine.weights_per_phase`); None: `compute.weights`."""
        where = self.device(device)
        key = self._engine_key(engine_id, model_dir, dtype, where, weights)
        with self._loading:
            engine = self.service.get(key)
            if engine is None:
                # Outside inference mode (ComfyUI runs nodes inside it): inference-mode parameters
                # have no version counter, and placing them swaps their data.
                with torch.inference_mode(False):
                    engine = engine_class(engine_id).load(self.manager, model_dir, engine_dtype(dtype), where,
                                                          self._weights(weights))
                self.service.add(key, engine)
            engine.prompt_store = self.prompt_store
        return engine

    def loaded_engine(self, engine_id: str, model_dir: str | Path | None = None,
                      dtype: str | torch.dtype = "float32", device: str | torch.device | None = None,
                      weights: WeightsChoice | None = None) -> Engine | None:
        """The engine `engine` would return if it is loaded now; None (nothing loads) otherwise."""
        return self.service.loaded(self._engine_key(engine_id, model_dir, dtype, device, weights))

    def device(self, name: str | torch.device | None) -> torch.device:
        """The device a host names ("auto"/None: the compute device); an unknown one is an error."""
        if name is None or name == "auto":
            return self.devices.compute_device()
        available = self.devices.devices()
        try:
            device = torch.device(name)
        except RuntimeError as exc:
            raise MizuotoError(f"device {name!r} is not a device name ({exc})") from exc
        if device.type in ("cuda", "xpu") and device.index is None:
            device = torch.device(device.type, 0)
        if device not in available:
            raise MizuotoError(f"device {name!r} is not available here; choose auto or one of "
                               f"{', '.join(map(str, available))}")
        return device

    def _weights(self, weights: WeightsChoice | None) -> WeightsChoice:
        """A host's choice: text parsed (`parse_weights`), None is the `compute.weights` setting."""
        if weights is None:
            return str(self.policy.weights)
        return parse_weights(weights) if isinstance(weights, str) else weights

    def _engine_key(self, engine_id: str, model_dir: str | Path | None, dtype: str | torch.dtype,
                    device: str | torch.device | None,
                    weights: WeightsChoice | None = None) -> tuple[str, str, str, str, str]:
        chosen = self._weights(weights)
        text = chosen if isinstance(chosen, str) else ",".join(f"{p}={c}" for p, c in sorted(chosen.items()))
        return engine_id, str(model_dir or ""), str(engine_dtype(dtype)), str(self.device(device)), text

    def unload_engine(self, engine_id: str, model_dir: str | Path | None = None,
                      dtype: str | torch.dtype = "float32", device: str | torch.device | None = None,
                      weights: WeightsChoice | None = None) -> bool:
        """Unload one engine `engine` loaded (a host no longer holds it); False if it was not loaded."""
        return self.service.unload(self._engine_key(engine_id, model_dir, dtype, device, weights))

    def unload_engines(self) -> None:
        self.service.unload_all()

    def request(self, seed: int = 0, cancel_check: Callable[[], None] | None = None,
                on_progress: Callable[[int, int], None] | None = None) -> RequestContext:
        ctx = self.manager.request(generator=torch.Generator().manual_seed(seed), cancel_check=cancel_check,
                                   on_progress=on_progress)
        if self.policy.cuda_allocator != "auto":  # M54: a choice was made: in force, or from the next start
            ctx.applied["cuda_allocator"] = cuda_allocator.state(self.policy.cuda_allocator)
        return ctx

    def say(self, engine: Engine, text: str, *, reference: Audio | None = None, transcript: str | None = None,
            speaker: str | None = None, sampling: Sampling | None = None, allow_fallback: bool | None = None,
            cancel_check: Callable[[], None] | None = None,
            on_progress: Callable[[int, int], None] | None = None,
            instruct: str | None = None, chunking: TextChunking = NO_CHUNKING,
            voice_options: Mapping[str, Any] | None = None) -> tuple[Audio, dict[str, Any]]:
        """Synthesize `text`: phased engines run their phases (M1); others one `ctx.use` (M4).

        Long text is cut as `chunking` says: the voice is prompted once, then every chunk's
        talker phase runs (chunk i with seed + i), then every chunk's decode (`run_phases`:
        each component placed once, not once per chunk), and the chunks are joined by a
        crossfade; `meta["chunks"]` counts them. One chunk is exactly the unchunked run."""
        sampling = sampling or Sampling()
        check_request(text, sampling)  # before the voice prompt runs
        options = dict(voice_options or {})
        unknown = sorted(set(options) - set(engine.VOICE_OPTIONS))
        if unknown:
            raise ArgumentError(f"engine {engine.id!r} takes no {', '.join(unknown)} "
                                f"(its voice options: {', '.join(engine.VOICE_OPTIONS) or 'none'})")
        chunks = chunking.split(text)
        progress = ChunkProgress(on_progress, len(chunks), phases=2 if engine.PHASED else 1)
        ctx = self.request(sampling.seed, cancel_check, progress if on_progress else None)
        seeded = [dataclasses.replace(sampling, seed=chunk_seed(sampling.seed, i)) for i in range(len(chunks))]
        with self.serving(engine):
            if engine.PHASED:
                voice = engine.voice_prompt(ctx, reference, transcript, speaker, instruct=instruct, **options)

                def follow(phase: int, index: int) -> None:
                    progress.phase, progress.index = phase, index

                pieces = run_phases(engine, ctx, [LineJob(chunk, voice, s) for chunk, s in zip(chunks, seeded)],
                                    allow_fallback=allow_fallback, before=follow,
                                    after=progress.finished)
            else:
                pieces = []
                with ctx.use(engine.handles(), engine.memory_required(text), name="all"):
                    for index, (chunk, chunk_sampling) in enumerate(zip(chunks, seeded)):
                        progress.index = index
                        if ctx.generator is not None:
                            ctx.generator.manual_seed(chunk_sampling.seed)
                        pieces.append(engine.synthesize(ctx, chunk, Voice("", {}, engine.id), chunk_sampling,
                                                        allow_fallback))
        return join_chunks(pieces, chunking.crossfade_ms), {**ctx.meta, "chunks": len(chunks)}

    def speak_script(self, engine: Engine, script: Script, voices: Mapping[str | None, CharacterVoice],
                     sampling: Sampling | None = None, **options: Any) -> ScriptAudio:
        """Speak a script phase by phase (`scripts.runner.speak_script`: every voice prompt,
        then every talker line, then every decode), served like `say`."""
        with self.serving(engine):
            return speak_script(self, engine, script, voices, sampling or Sampling(), **options)

    def speak_subtitles(self, engine: Engine, cues: Sequence[Cue], voices: Mapping[str | None, CharacterVoice],
                        sampling: Sampling | None = None, timing: Timing = "pad", max_stretch: float = 1.5,
                        **options: Any) -> Placed:
        """Speak a subtitle track as one phase-grouped script and place it on its cues
        (`scripts.runner.speak_subtitles`), served like `say`."""
        with self.serving(engine):
            return speak_subtitles(self, engine, cues, voices, sampling or Sampling(), timing, max_stretch, **options)

    @contextlib.contextmanager
    def serving(self, engine: Engine) -> Iterator[None]:
        """Around a request on `engine`: the service counts it as in use (M29, M34); after an
        out-of-memory error the next job starts from an empty device; host RAM is relieved after."""
        try:
            with self.service.serving(engine):
                yield
        except DeviceTooSmallError:
            raise  # nothing freed elsewhere makes the device larger
        except Exception as exc:
            if self.manager.is_oom(exc):
                self.service.release_after_oom()  # M34: the next job starts from an empty device
            raise
        finally:
            self.service.relieve_ram()  # M29

    def describe(self) -> dict[str, Any]:
        """M51: the device, the policy, per model loaded, streamed (last request) and host bytes,
        and the last requests' reports (the `/mizuoto/runtime` payload, see report.py)."""
        device = self.devices.describe()
        device["name"] = where(self.devices, self.devices.compute_device()).name
        last = self.manager.requests.last_streamed()
        models = []
        for h in list(self.manager.handles):
            key = self.manager.key(h)
            models.append(model_state(key, h, last.get(key, 0), self.devices.moves(h.device)))
        return {"device": device, "policy": self.policy.describe(), "models": models,
                "requests": self.manager.requests.reports()}
