"""The one-shot engines under the memory runtime, side by side in one run (issue 11), CosyVoice
2 / 3 (issue 22: ``--engines cosyvoice2,cosyvoice3``), GPT-SoVITS (issue 26: ``--engines
gptsovits``) and IndexTTS-2 (issue 25: ``--engines indextts2``).

Per engine (F5-TTS, OmniVoice, IndexTTS-2; tiny random checkpoints in their published layouts,
written to a temporary folder), one request of each placement, repeated and interleaved:

* resident — every component whole on the device (simulated: a device larger than the model);
* streamed — `compute.vram_mode = none` on the simulated strict device: every unit streamed.

It prints the streamed/resident time ratio (medians) and `meta.memory.streamed_mb` per request.
``--peaks`` instead measures every phase of Qwen3-TTS, F5-TTS, OmniVoice, VoxCPM 2, the demo,
CosyVoice 2 / 3, Fish Speech S2-Pro / S1-mini (``fishspeech-s1``), IndexTTS-2, GPT-SoVITS and Chatterbox (the
default engines then) on the plain CPU at the request sizes its tests use: the peak of CPU
tensor storage the phase creates (`PeakTracker`) against the engine's working-memory estimate for
it (M45: between 1.0x and 1.3x, `tests/engines/test_engine_estimates.py` asserts it).
For CosyVoice the talker phase is timed alone, in ms per speech token (a built-in speaker, a
fixed number of tokens), resident and all streamed. So is
GPT-SoVITS's (a tiny v2 voice): the T2S decoder's token loop, in ms per generated token.
``--device cuda`` runs on a real GPU instead of the simulated device, and compares prefetch
(``compute.async_offload`` 1: the next unit copies on a side stream) with none (0).
For IndexTTS-2 it also prints the talker's milliseconds per code (three beams), plain and all
streamed.

Fish Speech (``--engines fishspeech``, issue 24), an autoregressive engine, is timed per frame:
the talker phase's milliseconds per frame resident and all streamed, the MB streamed per frame,
and, with the talker capped half-way between its minimum working set and its size, the MB per
frame with the fast transformer marked hot (the engine's layout) and without the mark.

``--weights`` (issue 36) compares the engines that take a `weights` choice (demo, Qwen3-TTS,
VoxCPM 2, F5-TTS, OmniVoice, VibeVoice, Higgs Audio v2, Dia, CSM, Chatterbox in bfloat16; with
``--engines cosyvoice2,fishspeech,indextts2,gptsovits`` those too, CosyVoice, IndexTTS-2 and
GPT-SoVITS in float32; tiny checkpoints; bytes and time per step for the first five) stored fp8
and int8 with as published:
per engine, the output's log-mel L1 distance from the published precision's, and for a talker
the share of its tokens that agree; for scale, the same distance for the published weights
computed in float32 instead. The checkpoints' weights are random: the numbers show that
the path is sane (small distances, most tokens agreeing), not the quality of a trained model.
Tokens are chosen greedily, so they differ only where the weights changed the most likely
one; after a first difference an autoregressive talker goes its own way. Per engine it also
prints the generate phase's MB streamed per step (a token, a patch, an ODE step; every unit
streamed), the host RSS the loaded engine adds (in a child process per
choice, after a first load and unload so the upstream's imports are in the baseline) with the
bytes of its host tensors, and its milliseconds per step plain and streamed.

    python bench/engines.py [--repeat 5] [--steps 8] [--peaks] [--device cuda] [--engines fishspeech,indextts2]
    python bench/engines.py --weights [--engines demo,qwen3tts] [--repeat 3]
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mizuoto_runtime import Runtime  # noqa: E402
from mizuoto_runtime.audio import Audio  # noqa: E402
from mizuoto_runtime.engines import Sampling, engine_class  # noqa: E402
from mizuoto_runtime.memory.phases import RequestContext  # noqa: E402


def _peak_tracker() -> type:
    spec = importlib.util.spec_from_file_location("bench_voxcpm2", Path(__file__).with_name("voxcpm2.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PeakTracker  # type: ignore[no-any-return]


PeakTracker = _peak_tracker()


REFERENCE = Audio(0.3 * torch.sin(torch.arange(24000) / 6.0).unsqueeze(0), 24000)
REFERENCE_44K = Audio(0.3 * torch.sin(torch.arange(44100) / 6.0).unsqueeze(0), 44100)
TRANSCRIPT = "a reference sentence."
TEXT = "The runtime streams every block, step after step."
# Bench name -> the engine whose tiny checkpoint it runs, its version and dtype (None: the
# writer's default; Fish Speech's releases ship bfloat16). GPT-SoVITS: a voice pair with its
# feature models, not a model folder.
TINY: dict[str, tuple[str, str | None, torch.dtype | None]] = {
    "f5tts": ("f5tts", None, None), "omnivoice": ("omnivoice", None, None),
    "fishspeech": ("fishspeech", None, torch.bfloat16), "fishspeech-s1": ("fishspeech", "s1-mini", torch.bfloat16),
    "cosyvoice2": ("cosyvoice", "2", None), "cosyvoice3": ("cosyvoice", "3", None),
    "indextts2": ("indextts2", None, None), "voxcpm2": ("voxcpm2", None, None), "qwen3tts": ("qwen3tts", None, None),
    "gptsovits": ("gptsovits", "v2", None), "higgsaudio": ("higgsaudio", None, None),
    "vibevoice": ("vibevoice", None, None), "dia": ("dia", None, None), "csm": ("csm", None, None),
    "chatterbox": ("chatterbox", None, None), "chatterbox-mtl": ("chatterbox", "multilingual", None)}
# The loader's choice inside a written folder, where it is a file of it (Chatterbox Multilingual).
CHOICES = {"chatterbox-mtl": "t3_mtl23ls_v2.safetensors"}
FISH_TEXT = "The runtime streams every layer of the slow transformer, frame after frame, " * 2
COSYVOICE_TOKENS = 48
INDEX_TEST_TEXT = "hello tiny model. this is a test!"  # test_indextts2.py's
GPTSOVITS_TEXT = "你好，这是一个测试。"
FISH_TEST_TEXT = "Hello world, streaming is exact."  # test_fishspeech.py's
COSYVOICE_TEXT = "Hello there, tiny model."  # test_cosyvoice.py's
CODES = 24  # IndexTTS-2's codes per request (max_new_tokens; the tiny model rarely stops earlier)
MB = 1 << 20
PEAK_STEPS = 4  # ODE / diffusion steps of the estimate tests' requests


def placements(device: str) -> dict[str, dict[str, Any]]:
    if device == "cpu":
        return {"resident": {"compute.simulate_vram_mb": 4096},
                "streamed": {"compute.simulate_vram_mb": 4096, "compute.vram_mode": "none"}}
    return {"resident": {},
            "streamed, prefetch": {"compute.vram_mode": "none", "compute.async_offload": 1},
            "streamed, no prefetch": {"compute.vram_mode": "none", "compute.async_offload": 0}}


def request(rt: Runtime, engine_id: str, folder: Path, steps: int, device: str) -> tuple[float, float]:
    engine = rt.engine(engine_id, folder, device=None if device == "cpu" else device)
    engine.steps = steps
    engine.voices.clear()  # the voice prompt runs every time
    if device != "cpu":
        torch.cuda.synchronize()
    start = time.perf_counter()
    if engine_id == "indextts2":
        _, meta = rt.say(engine, TEXT, reference=REFERENCE, sampling=Sampling(seed=1, max_new_tokens=CODES))
    else:
        _, meta = rt.say(engine, TEXT, reference=REFERENCE, transcript=TRANSCRIPT,
                         sampling=Sampling(seed=1, language="English"))
    if device != "cpu":
        torch.cuda.synchronize()
    return time.perf_counter() - start, meta["memory"]["streamed_mb"]


def time_engines(folders: dict[str, Path], steps: int, repeat: int, device: str) -> None:
    print(f"\n{'engine':10} {'placement':22} {'median s':>9} {'vs resident':>12} {'streamed MB':>12}")
    for engine_id, folder in folders.items():
        runtimes = {name: Runtime(settings) for name, settings in placements(device).items()}
        times: dict[str, list[float]] = {name: [] for name in runtimes}
        streamed: dict[str, float] = {}
        for _name, rt in runtimes.items():
            request(rt, engine_id, folder, steps, device)  # warm-up: load, learn the unit order
        for _ in range(repeat):
            for name, rt in runtimes.items():  # interleaved, so machine noise hits all alike
                seconds, streamed[name] = request(rt, engine_id, folder, steps, device)
                times[name].append(seconds)
        base = statistics.median(times["resident"])
        for name in runtimes:
            median = statistics.median(times[name])
            print(f"{engine_id:10} {name:22} {median:9.3f} {median / base:11.2f}x {streamed[name]:12.1f}")


def talker_ms_per_code(folder: Path, repeat: int, device: str) -> None:
    """IndexTTS-2's decoding loop (three beams, then the latent forward) per code: plain and with
    every GPT block streamed."""
    print(f"\n{'indextts2 talker':22} {'ms per code':>12} {'vs resident':>12} {'streamed MB':>12}")
    rows: dict[str, list[float]] = {}
    streamed: dict[str, float] = {}
    for name, settings in placements(device).items():
        rt = Runtime(settings)
        engine = rt.engine("indextts2", folder, device=None if device == "cpu" else device)
        ctx = rt.request(seed=1)
        voice = engine.voice_prompt(ctx, REFERENCE)
        for i in range(repeat + 1):
            sampling = Sampling(seed=1, max_new_tokens=CODES)
            start = time.perf_counter()
            codes = engine.generate(ctx, TEXT, voice, sampling)
            if device != "cpu":
                torch.cuda.synchronize()
            if i:  # the first is a warm-up
                rows.setdefault(name, []).append(1000 * (time.perf_counter() - start) / codes.tokens.shape[1])
        streamed[name] = engine.talker.streamer.streamed_bytes_of(engine.talker) / MB / (repeat + 1)
    base = statistics.median(rows["resident"])
    for name, values in rows.items():
        median = statistics.median(values)
        print(f"{name:22} {median:12.2f} {median / base:11.2f}x {streamed[name]:12.1f}")


def fish_frames(rt: Runtime, folder: Path, frames: int, cap: bool, hot: bool = True) -> tuple[float, int, float]:
    """One Fish Speech talker phase: (seconds, frames the slow transformer ran, MB streamed)."""
    from mizuoto_runtime.engines.fishspeech.engine import FishSpeechEngine

    engine_type = FishSpeechEngine if hot else type("Unmarked", (FishSpeechEngine,), {"FAST_HOT": False})
    engine = engine_type(rt.manager, folder)
    if cap:
        engine.talker.cap_bytes = (engine.talker.min_working_set + engine.talker.size_bytes) // 2
    ctx = rt.request(seed=1)
    voice = engine.voice_prompt(ctx, REFERENCE_44K, TRANSCRIPT)
    start = time.perf_counter()
    codes = engine.generate(ctx, FISH_TEXT, voice, Sampling(seed=1, max_new_tokens=frames, temperature=1.0, top_p=0.9,
                                                           top_k=30))
    seconds = time.perf_counter() - start
    streamed = engine.talker.streamer.streamed_bytes_of(engine.talker) / MB
    engine.unload()
    return seconds, codes.extra["frames_computed"], streamed


def time_fish(folder: Path, frames: int, repeat: int) -> None:
    rows = {"resident": ({"compute.simulate_vram_mb": 4096}, False, True),
            "streamed": ({"compute.simulate_vram_mb": 4096, "compute.vram_mode": "none"}, False, True),
            "half, fast hot": ({"compute.simulate_vram_mb": 4096}, True, True),
            "half, not hot": ({"compute.simulate_vram_mb": 4096}, True, False)}
    print(f"\n{'engine':10} {'talker placement':22} {'ms/frame':>9} {'vs resident':>12} {'MB/frame':>9}")
    per_frame: dict[str, list[float]] = {name: [] for name in rows}
    streamed: dict[str, float] = {}
    for i in range(repeat + 1):  # the first round warms up
        for name, (settings, cap, hot) in rows.items():
            seconds, n, mb = fish_frames(Runtime(settings), folder, frames, cap, hot)
            if i:
                per_frame[name].append(1000 * seconds / n)
            streamed[name] = mb / n
    base = statistics.median(per_frame["resident"])
    for name in rows:
        median = statistics.median(per_frame[name])
        print(f"{'fishspeech':10} {name:22} {median:9.2f} {median / base:11.2f}x {streamed[name]:9.3f}")


def cosyvoice_talker(rt: Runtime, folder: Path, device: str) -> tuple[float, float]:
    """ms per speech token of one talker phase, and the MB it streamed."""
    engine = rt.engine("cosyvoice", folder, device=None if device == "cpu" else device)
    ctx = rt.request(seed=1)
    voice = engine.voice_prompt(ctx, speaker="tiny")
    before = engine.llm.streamer.streamed_bytes_of(engine.llm) / MB
    if device != "cpu":
        torch.cuda.synchronize()
    start = time.perf_counter()
    codes = engine.generate(ctx, TEXT, voice, Sampling(seed=1, max_new_tokens=COSYVOICE_TOKENS))
    if device != "cpu":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return 1000 * seconds / codes.tokens.shape[1], engine.llm.streamer.streamed_bytes_of(engine.llm) / MB - before


def time_cosyvoice(folders: dict[str, Path], repeat: int, device: str) -> None:
    print(f"\n{'engine':10} {'placement':22} {'ms/token':>9} {'vs resident':>12} {'LM streamed MB':>15}")
    for name, folder in folders.items():
        runtimes = {p: Runtime(settings) for p, settings in placements(device).items()}
        per_token: dict[str, list[float]] = {p: [] for p in runtimes}
        streamed: dict[str, float] = {}
        for rt in runtimes.values():
            cosyvoice_talker(rt, folder, device)  # warm-up
        for _ in range(repeat):
            for p, rt in runtimes.items():
                ms, streamed[p] = cosyvoice_talker(rt, folder, device)
                per_token[p].append(ms)
        base = statistics.median(per_token["resident"])
        for p in runtimes:
            median = statistics.median(per_token[p])
            print(f"{name:10} {p:22} {median:9.2f} {median / base:11.2f}x {streamed[p]:15.1f}")


def time_gptsovits(folder: Path, repeat: int, device: str) -> None:
    """Talker only: ms per generated token of the T2S loop, each placement (the voice prompt is
    cached first; phoneme ids are given, so no text frontend or BERT phase runs)."""
    from mizuoto_runtime.engines.gptsovits.engine import PhonemeText

    target, prompt = PhonemeText(tuple(range(100, 140))), PhonemeText(tuple(range(200, 220)))
    sampling = Sampling(seed=1, top_k=15, temperature=1.0, repetition_penalty=1.35, max_new_tokens=200)
    print(f"\n{'engine':10} {'placement':22} {'ms/token':>9} {'vs resident':>12} {'tokens':>7} {'streamed MB':>12}")
    runtimes = {name: Runtime(settings) for name, settings in placements(device).items()}
    engines = {name: rt.engine("gptsovits", folder, device=None if device == "cpu" else device)
               for name, rt in runtimes.items()}
    voices = {name: engines[name].voice_prompt(rt.request(seed=1), REFERENCE, TRANSCRIPT)
              for name, rt in runtimes.items()}
    times: dict[str, list[float]] = {name: [] for name in runtimes}
    last: dict[str, tuple[int, float]] = {}
    for round_ in range(repeat + 1):  # the first round warms up (and learns the unit order)
        for name, rt in runtimes.items():
            ctx = rt.request(seed=1)
            if device != "cpu":
                torch.cuda.synchronize()
            start = time.perf_counter()
            codes = engines[name].generate(ctx, TEXT, voices[name], sampling, target=target, prompt_text=prompt)
            if device != "cpu":
                torch.cuda.synchronize()
            tokens = codes.tokens.shape[-1]
            if round_:
                times[name].append((time.perf_counter() - start) * 1000 / max(tokens, 1))
            last[name] = (tokens, ctx.meta["memory"]["streamed_mb"])
    base = statistics.median(times["resident"])
    for name, per_token in times.items():
        median = statistics.median(per_token)
        print(f"{'gptsovits':10} {name:22} {median:9.2f} {median / base:11.2f}x {last[name][0]:7} "
              f"{last[name][1]:12.1f}")


@dataclasses.dataclass(frozen=True)
class PeakRequest:
    """One request of the sizes an engine's tests use: reference seconds, text, new tokens."""

    seconds: float
    text: str = TEXT
    max_new_tokens: int = 2048
    language: str = "English"

    def label(self) -> str:
        return f"{self.seconds:g} s ref, {len(self.text)} chars" + (
            f", {self.max_new_tokens} tokens" if self.max_new_tokens != 2048 else "")


# The request sizes each engine's tests use (tests/engines/test_engine_estimates.py, test_qwen3tts.py).
PEAK_REQUESTS: dict[str, list[PeakRequest]] = {
    "f5tts": [PeakRequest(1), PeakRequest(3)],
    "omnivoice": [PeakRequest(1), PeakRequest(3)],
    "voxcpm2": [PeakRequest(1, TEXT, 4), PeakRequest(2, TEXT * 3, 8)],
    "qwen3tts": [PeakRequest(1, TEXT, 4), PeakRequest(3, TEXT, 4)],
    "demo": [PeakRequest(1, TEXT, 16), PeakRequest(3, TEXT * 2, 48)],
    # test_cosyvoice.py: 3 s of reference audio, 8 and 24 speech tokens
    "cosyvoice2": [PeakRequest(1, COSYVOICE_TEXT, 8), PeakRequest(3, COSYVOICE_TEXT, 24)],
    "cosyvoice3": [PeakRequest(1, COSYVOICE_TEXT, 8), PeakRequest(3, COSYVOICE_TEXT, 24)],
    # test_fishspeech.py: a 1 s reference, 8 frames; a longer one and more frames
    "fishspeech": [PeakRequest(1, FISH_TEST_TEXT, 8), PeakRequest(3, FISH_TEST_TEXT * 2, 24)],
    "fishspeech-s1": [PeakRequest(1, FISH_TEST_TEXT, 8), PeakRequest(3, FISH_TEST_TEXT * 2, 24)],
    # test_indextts2.py: a 1 s reference, 12 codes; a longer one and more codes
    "indextts2": [PeakRequest(1, INDEX_TEST_TEXT, 12), PeakRequest(3, INDEX_TEST_TEXT * 2, CODES)],
    # test_gptsovits.py: a 3 s reference, 16 tokens; Chinese text, so the BERT phase runs too
    "gptsovits": [PeakRequest(3, GPTSOVITS_TEXT, 16, "Chinese"), PeakRequest(5, GPTSOVITS_TEXT * 2, 48, "Chinese")],
    # test_higgsaudio.py: a 1 s reference cloned with its transcript, 24 frames; a longer one, more text and frames
    "higgsaudio": [PeakRequest(1, TEXT, 24), PeakRequest(3, TEXT * 3, 64)],
    # test_vibevoice.py: a 1 s reference, 6 frames; a longer one, more text and frames
    "vibevoice": [PeakRequest(1, TEXT, 6), PeakRequest(3, TEXT * 2, 24)],
    # test_dia.py: a 0.5-1 s reference, 24 frames; a longer one, more text and frames
    "dia": [PeakRequest(1, TEXT, 24), PeakRequest(3, TEXT * 2, 64)],
    # test_csm.py: a 0.7-1 s context recording, 10 frames; a longer one, more text and frames
    "csm": [PeakRequest(1, TEXT, 10), PeakRequest(3, TEXT * 2, 32)],
    # test_chatterbox.py: a 1 s reference, 24 speech tokens; a longer one and more tokens
    "chatterbox": [PeakRequest(1, TEXT, 24), PeakRequest(3, TEXT * 2, 48)],
    "chatterbox-mtl": [PeakRequest(1, TEXT, 24, "French"), PeakRequest(3, TEXT * 2, 48, "French")],
}
# The runtime's engine id of each bench name of one engine's version.
RUNTIME_IDS = {"cosyvoice2": "cosyvoice", "cosyvoice3": "cosyvoice", "fishspeech-s1": "fishspeech",
               "chatterbox-mtl": "chatterbox"}


@dataclasses.dataclass
class PhasePeak:
    """A phase as it ran: its components, its working-memory estimate, and the peak of CPU tensor
    storage it created (`PeakTracker`: each tensor counted until freed; on the plain CPU nothing
    is placed or streamed, so that is the phase's working memory plus what it returns)."""

    engine: str
    phase: str
    request: str
    estimate: int
    peak: int
    seconds: float = 0.0  # the phase's wall time
    started: float = 0.0  # its start (time.perf_counter)

    @property
    def ratio(self) -> float:
        return self.estimate / max(self.peak, 1)


@contextlib.contextmanager
def metered_phases(engine_id: str, request: str, tracker: Callable[[], Any] = PeakTracker) -> Iterator[list[PhasePeak]]:
    """Measure every phase with components (`ctx.run` and `ctx.use`) run in the block; `tracker`:
    what measures a phase's peak (a context manager with ``peak`` after it; CPU tensor storage
    by default)."""
    rows: list[PhasePeak] = []
    run, use = RequestContext.run, RequestContext.use

    def key(name: str, handles: Sequence[Any]) -> str:
        return f"{name} ({'+'.join(h.name for h in handles)})"

    def metered_run(self: RequestContext, name: str, handles: Sequence[Any], fn: Callable[[], Any],
                    memory: int = 0, *args: Any, **kwargs: Any) -> Any:
        def measured() -> Any:
            start = time.perf_counter()
            with tracker() as meter:
                out = fn()
            if handles:
                rows.append(PhasePeak(engine_id, key(name, handles), request, memory, meter.peak,
                                      time.perf_counter() - start, start))
            return out

        return run(self, name, handles, measured, memory, *args, **kwargs)

    @contextlib.contextmanager
    def metered_use(self: RequestContext, handles: Sequence[Any], memory: int = 0,
                    name: str = "phase") -> Iterator[Any]:
        start = time.perf_counter()
        with use(self, handles, memory, name) as placements, tracker() as meter:
            yield placements
        if handles:
            rows.append(PhasePeak(engine_id, key(name, handles), request, memory, meter.peak,
                                  time.perf_counter() - start, start))

    RequestContext.run, RequestContext.use = metered_run, metered_use  # type: ignore[method-assign]
    try:
        yield rows
    finally:
        RequestContext.run, RequestContext.use = run, use  # type: ignore[method-assign]


def phase_peaks(folders: dict[str, Path | None], steps: int = PEAK_STEPS) -> list[PhasePeak]:
    """Every phase of every engine, at the request sizes its tests use, on the plain CPU."""
    rows: list[PhasePeak] = []
    for engine_id, folder in folders.items():
        rt = Runtime()
        engine = rt.engine(RUNTIME_IDS.get(engine_id, engine_id), folder)
        if hasattr(engine, "steps"):
            engine.steps = steps
        for req in PEAK_REQUESTS[engine_id]:
            reference = Audio(0.3 * torch.sin(torch.arange(int(req.seconds * 24000)) / 6.0).unsqueeze(0), 24000)
            engine.voices.clear()  # the voice prompt runs every time
            sampling = Sampling(seed=1, language=req.language, max_new_tokens=req.max_new_tokens)
            with metered_phases(engine_id, req.label()) as measured:
                rt.say(engine, req.text, reference=reference, transcript=TRANSCRIPT, sampling=sampling)
            rows += measured
    return rows


def print_peaks(rows: list[PhasePeak]) -> None:
    width = max([40, *(len(r.phase) for r in rows)])
    print(f"\n{'engine':13} {'phase':{width}} {'request':42} {'estimate MB':>12} {'CPU peak MB':>12} "
          f"{'estimate/peak':>14}")
    for r in rows:
        print(f"{r.engine:13} {r.phase:{width}} {r.request:42} {r.estimate / MB:12.3f} {r.peak / MB:12.3f} "
              f"{r.ratio:13.2f}x")


# ---- smaller stored weights (issue 36) -------------------------------------------------------------
SMALL = ("fp8_e4m3fn", "fp8_e5m2", "int8")
WEIGHT_ENGINES = ("demo", "qwen3tts", "voxcpm2", "f5tts", "omnivoice", "vibevoice", "higgsaudio", "dia", "csm",
                  "chatterbox")
TRANSCRIBED = ("f5tts", "omnivoice", "dia", "csm", "cosyvoice2", "indextts2", "gptsovits", "fishspeech")
# Written in bfloat16 for the weights comparison; the others' writers take only their published
# precision, and they run in float32 (CosyVoice's vocoder does not run in bfloat16).
WRITTEN_BF16 = {name: torch.bfloat16 for name in WEIGHT_ENGINES if name != "demo"}
FLOAT32_ONLY = ("cosyvoice2", "indextts2", "gptsovits")  # their voice prompt reads the reference's transcript
TALKERS = ("demo", "qwen3tts")  # their talker's tokens: agreement
BYTES = WEIGHT_ENGINES[:5]  # their generate phase per step (token, patch, ODE step): bytes and time
WEIGHT_TOKENS = 24


@dataclasses.dataclass
class WeightsRun:
    audio: torch.Tensor
    sample_rate: int
    tokens: torch.Tensor | None  # a talker's tokens, one row per step
    talk_s: float  # the generate phase
    talk_streamed: int  # bytes streamed for its components in it
    steps: int  # its steps (tokens, patches), as its progress counts them


def weights_request(rt: Runtime, engine_id: str, folder: Path | None, weights: str, steps: int,
                    dtype: str | None = None) -> WeightsRun:
    """One request phase by phase (so the generate phase's own time, steps and bytes are seen),
    in bfloat16, or in float32 for the engines that run only in their published float32."""
    dtype = dtype or ("float32" if engine_id in FLOAT32_ONLY else "bfloat16")
    engine = rt.engine(RUNTIME_IDS.get(engine_id, engine_id), folder, dtype, weights=weights)
    if hasattr(engine, "steps"):
        engine.steps = steps
    engine.voices.clear()
    done: list[int] = []
    ctx = rt.request(seed=1, on_progress=lambda step, _total: done.append(step))
    voice = engine.voice_prompt(ctx, REFERENCE, TRANSCRIPT if engine_id in TRANSCRIBED else None)
    talkers = [h for h in engine.handles() if h.name in engine.WEIGHTS["generate"].components]

    def streamed_now() -> int:
        return sum(h.streamer.streamed_bytes_of(h) for h in talkers)

    before = streamed_now()
    done.clear()
    start = time.perf_counter()
    # greedy: a token differs where the weights changed the most likely one, not the draw
    sampling = Sampling(seed=1, max_new_tokens=WEIGHT_TOKENS, language="English", do_sample=False,
                        subtalker_do_sample=False)
    codes = engine.generate(ctx, TEXT, voice, sampling)
    talk_s = time.perf_counter() - start
    streamed, steps_run = streamed_now() - before, len(done)
    audio = engine.decode(ctx, codes)
    # one row per step: Qwen3-TTS's codes are (frames, codebooks), the demo's (1, frames)
    tokens = codes.tokens.reshape(-1, codes.tokens.shape[-1] if engine_id == "qwen3tts" else 1)
    return WeightsRun(audio.mono().float(), audio.sample_rate, tokens if engine_id in TALKERS else None,
                      talk_s, streamed, max(steps_run, 1))


def log_mel_l1(a: torch.Tensor, b: torch.Tensor, sample_rate: int) -> float:
    """Mean |log-mel(a) - log-mel(b)| over the frames both have (80 bands)."""
    import torchaudio

    mel = torchaudio.transforms.MelSpectrogram(sample_rate, n_fft=1024, hop_length=256, n_mels=80)
    n = min(a.shape[-1], b.shape[-1])
    la, lb = (torch.log(mel(x[..., :n]).clamp(min=1e-5)) for x in (a, b))
    return float((la - lb).abs().mean())


def token_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    n = min(a.shape[0], b.shape[0])
    return float((a[:n] == b[:n]).float().mean()) if n else 0.0


def rss_child(engine_id: str, folder: str, weights: str) -> None:
    """In a fresh process: the RSS a loaded engine adds, printed in bytes, with the bytes of its
    host tensors. The engine is loaded and unloaded once first, so what its upstream package
    imports and caches is in the baseline."""
    import gc

    import psutil

    from mizuoto_runtime.memory.small_weights import return_freed_ram

    def settled() -> int:
        gc.collect()
        return_freed_ram()
        return int(psutil.Process().memory_info().rss)

    rt = Runtime()
    rt.engine(engine_id, folder or None, "bfloat16")
    rt.unload_engines()
    base = settled()
    engine = rt.engine(engine_id, folder or None, "bfloat16", weights=weights)
    print(settled() - base, sum(h.describe()["host_bytes"] for h in engine.handles()))


def engine_rss(engine_id: str, folder: Path | None, weights: str) -> tuple[int, int]:
    import subprocess

    done = subprocess.run([sys.executable, __file__, "--rss-child", engine_id, str(folder or ""), weights],
                          capture_output=True, text=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    rss, host = done.stdout.split()[-2:]
    return int(rss), int(host)


def time_weights(folders: dict[str, Path | None], steps: int, repeat: int) -> None:
    print("\nWeights stored small against as published, each engine's tiny bfloat16 checkpoint. Its weights are "
          "random: these numbers show the path is sane, not the quality of a trained model.")
    print(f"{'engine':10} {'weights':15} {'log-mel L1':>10} {'tokens agree':>13}")
    for engine_id, folder in folders.items():
        published = weights_request(Runtime(), engine_id, folder, "as published", steps)
        # For scale: the same weights computed in float32 instead of bfloat16.
        wider = weights_request(Runtime(), engine_id, folder, "as published", steps, "float32")
        for choice in (*SMALL, "float32 compute"):
            run = wider if choice == "float32 compute" else weights_request(Runtime(), engine_id, folder, choice, steps)
            agree = (f"{token_agreement(run.tokens, published.tokens):12.0%}"
                     if run.tokens is not None and published.tokens is not None else f"{'-':>12}")
            print(f"{engine_id:10} {choice:15} {log_mel_l1(run.audio, published.audio, run.sample_rate):10.3f} {agree}")
    print(f"\n{'engine':10} {'weights':12} {'MB/step':>9} {'vs bf16':>8} {'RSS MB':>8} {'vs bf16':>8} "
          f"{'host MB':>8} {'ms/step plain':>15} {'streamed':>9}")
    for engine_id, folder in folders.items():
        if engine_id not in BYTES:
            continue
        base: tuple[float, float] | None = None
        for choice in ("as published", "fp8_e4m3fn", "int8"):
            plain = Runtime()
            streamed = Runtime({"compute.simulate_vram_mb": 4096, "compute.vram_mode": "none"})
            runs: dict[str, list[WeightsRun]] = {"plain": [], "streamed": []}
            for rt in (plain, streamed):
                weights_request(rt, engine_id, folder, choice, steps)  # warm-up: load
            for _ in range(repeat):
                for name, rt in (("plain", plain), ("streamed", streamed)):  # interleaved
                    runs[name].append(weights_request(rt, engine_id, folder, choice, steps))
            count = runs["streamed"][0].steps
            per_token = runs["streamed"][0].talk_streamed / count / MB
            ms = {k: 1000 * statistics.median(r.talk_s for r in v) / count for k, v in runs.items()}
            rss, host = engine_rss(engine_id, folder, choice)
            base = base or (per_token, rss)
            print(f"{engine_id:10} {choice:12} {per_token:9.3f} {per_token / base[0]:7.2f}x {rss / MB:8.1f} "
                  f"{rss / base[1]:7.2f}x {host / MB:8.1f} {ms['plain']:15.2f} {ms['streamed']:9.2f}")


def checkpoint_folders(engines: Sequence[str], tmp: Path) -> dict[str, Path | None]:
    """Tiny random checkpoints in each engine's published layout (the demo engine needs none)."""
    folders: dict[str, Path | None] = {}
    for name in engines:
        if name not in TINY:
            folders[name] = None
            continue
        engine, version, dtype = TINY[name]
        folder = engine_class(engine).tiny_writer()(tmp / name, version=version, dtype=dtype)
        folders[name] = folder / CHOICES[name] if name in CHOICES else folder
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="ODE / diffusion steps per request (upstream: 32)")
    parser.add_argument("--peaks", action="store_true",
                        help="instead: each phase's working-memory estimate / its measured CPU peak")
    parser.add_argument("--device", default="cpu", help="cpu (the simulated device) or cuda")
    parser.add_argument("--engines", default=None,
                        help="comma-separated (default: f5tts,omnivoice,fishspeech; with --peaks the engines of "
                             "the estimate tests)")
    parser.add_argument("--frames", type=int, default=48, help="Fish Speech: frames per request at most")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steady on a shared machine)")
    parser.add_argument("--weights", action="store_true",
                        help="instead: fp8 and int8 weights against as published (distance, bytes, time)")
    parser.add_argument("--rss-child", nargs=3, metavar=("ENGINE", "FOLDER", "WEIGHTS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        torch.set_num_threads(args.threads)
        rss_child(*args.rss_child)
        return
    if args.weights:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        torch.set_num_threads(args.threads)
        chosen = (args.engines or ",".join(WEIGHT_ENGINES)).split(",")
        with tempfile.TemporaryDirectory(prefix="mizuoto-bench-") as tmp:
            folders = {name: None if name == "demo" else engine_class(TINY[name][0]).tiny_writer()(
                Path(tmp) / name, version=TINY[name][1], dtype=TINY[name][2] or WRITTEN_BF16.get(name))
                for name in chosen}
            print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.steps} steps per request, "
                  f"{WEIGHT_TOKENS} tokens at most")
            time_weights(folders, args.steps, args.repeat)
        return
    engines = (args.engines or (",".join(PEAK_REQUESTS) if args.peaks else "f5tts,omnivoice,fishspeech")).split(",")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="mizuoto-bench-") as tmp:
        folders = checkpoint_folders(engines, Path(tmp))
        cosy = {k: v for k, v in folders.items() if k.startswith("cosyvoice") and v is not None}
        if args.peaks:
            print(f"torch {torch.__version__}, plain CPU, {PEAK_STEPS} steps per request")
            print_peaks(phase_peaks({k: v for k, v in folders.items() if k in PEAK_REQUESTS}))
            return
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, "
              f"{args.steps} steps per request, {args.repeat} requests per placement")
        fish = folders.pop("fishspeech", None)
        oneshot = {k: v for k, v in folders.items() if k in ("f5tts", "omnivoice") and v is not None}
        if oneshot:
            time_engines(oneshot, args.steps, args.repeat, args.device)
        if "indextts2" in folders:
            talker_ms_per_code(folders["indextts2"], args.repeat, args.device)
        if cosy:
            time_cosyvoice(cosy, args.repeat, args.device)
        if fish is not None:
            time_fish(fish, args.frames, args.repeat)
        gptsovits = folders.get("gptsovits")
        if gptsovits is not None:
            time_gptsovits(gptsovits, args.repeat, args.device)


if __name__ == "__main__":
    main()
