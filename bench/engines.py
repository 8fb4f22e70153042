"""The one-shot engines under the memory runtime, side by side in one run (issue 11), CosyVoice
2 / 3 (issue 22: ``--engines cosyvoice2,cosyvoice3``), GPT-SoVITS (issue 26: ``--engines
gptsovits``) and IndexTTS-2 (issue 25: ``--engines indextts2``).

Per engine (F5-TTS, OmniVoice, IndexTTS-2; tiny random checkpoints in their published layouts,
written to a temporary folder), one request of each placement, repeated and interleaved:

* resident — every component whole on the device (simulated: a device larger than the model);
* streamed — `compute.vram_mode = none` on the simulated strict device: every unit streamed.

It prints the streamed/resident time ratio (medians) and `meta.memory.streamed_mb` per request.
``--peaks`` also measures each phase's working memory on the plain CPU (how far the process's
resident memory rises during the phase, Linux) against the engine's estimate (M45).
For CosyVoice the talker phase is timed alone, in ms per speech token (a built-in speaker, a
fixed number of tokens), resident and all streamed; ``--peaks`` adds its three phases. So is
GPT-SoVITS's (a tiny v2 voice): the T2S decoder's token loop, in ms per generated token.
``--device cuda`` runs on a real GPU instead of the simulated device, and compares prefetch
(``compute.async_offload`` 1: the next unit copies on a side stream) with none (0).
For IndexTTS-2 it also prints the talker's milliseconds per code (three beams), plain and all
streamed, and with ``--peaks`` the voice prompt's peak.

Fish Speech (``--engines fishspeech``, issue 24), an autoregressive engine, is timed per frame:
the talker phase's milliseconds per frame resident and all streamed, the MB streamed per frame,
and, with the talker capped half-way between its minimum working set and its size, the MB per
frame with the fast transformer marked hot (the engine's layout) and without the mark.

    python bench/engines.py [--repeat 5] [--steps 8] [--peaks] [--device cuda] [--engines fishspeech,indextts2]
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mizuoto_runtime import Runtime  # noqa: E402
from mizuoto_runtime.audio import Audio  # noqa: E402
from mizuoto_runtime.engines import Sampling  # noqa: E402

REFERENCE = Audio(0.3 * torch.sin(torch.arange(24000) / 6.0).unsqueeze(0), 24000)
REFERENCE_44K = Audio(0.3 * torch.sin(torch.arange(44100) / 6.0).unsqueeze(0), 44100)
TRANSCRIPT = "a reference sentence."
TEXT = "The runtime streams every block, step after step."
WRITERS = {"f5tts": "mizuoto_runtime.engines.f5tts.tiny", "omnivoice": "mizuoto_runtime.engines.omnivoice.tiny",
           "fishspeech": "mizuoto_runtime.engines.fishspeech.tiny",
           "cosyvoice2": "mizuoto_runtime.engines.cosyvoice.tiny", "cosyvoice3": "mizuoto_runtime.engines.cosyvoice.tiny",
           "indextts2": "mizuoto_runtime.engines.indextts.tiny"}
GPTSOVITS_WRITER = "mizuoto_runtime.engines.gptsovits.tiny"
FISH_TEXT = "The runtime streams every layer of the slow transformer, frame after frame, " * 2
COSYVOICE_TOKENS = 48
CODES = 24  # IndexTTS-2's codes per request (max_new_tokens; the tiny model rarely stops earlier)
MB = 1 << 20
MMAP_ENV = ("MALLOC_MMAP_THRESHOLD_", "65536")


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
        for name, rt in runtimes.items():
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

    engine_class = FishSpeechEngine if hot else type("Unmarked", (FishSpeechEngine,), {"FAST_HOT": False})
    engine = engine_class(rt.manager, folder)
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


def cosyvoice_peaks(folders: dict[str, Path]) -> list[tuple[str, str, int, int]]:
    rows: list[tuple[str, str, int, int]] = []
    for name, folder in folders.items():
        rt = Runtime()
        engine = rt.engine("cosyvoice", folder)
        for tokens in (64, 16, 200):  # the first request also makes one-time tables
            ctx = rt.request(seed=1)
            voice = engine.voice_prompt(ctx, speaker="tiny")
            sampling = Sampling(seed=1, max_new_tokens=tokens)
            codes, talker_peak = live_peak(lambda: engine.generate(ctx, TEXT, voice, sampling))
            plan = engine.plan(engine.text_ids(TEXT, voice), voice, tokens)
            d = voice.data
            with torch.inference_mode():  # what the flow and vocoder phases run
                mel, flow_peak = live_peak(lambda: engine.model.flow(codes.tokens, d["prompt_token"], d["prompt_feat"],
                                                                     d["embedding"]))
                _, vocoder_peak = live_peak(lambda: engine.model.hift(mel))
            frames = (codes.tokens.shape[1] + d["prompt_token"].shape[1]) * engine.model.flow.token_mel_ratio
            rows += [(name, f"talker {tokens} tok", sum(engine.talker_memory(plan).values()), talker_peak),
                     (name, f"flow {tokens} tok", engine.flow_memory(frames), flow_peak),
                     (name, f"vocoder {tokens} tok", engine.vocoder_memory(mel.shape[-1]), vocoder_peak)]
    return rows


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


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def live_peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """`fn()`'s result and how far the process's resident memory rose above where it started
    (Linux: the peak-RSS mark is reset first, `/proc/self/clear_refs` 5). With glibc's mmap
    threshold fixed at 64 KB (`main` sets it), tensors are mapped when allocated and unmapped
    when freed, so RSS follows live tensors; the weights are in place already and not counted."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    start = _status_kb("VmRSS")
    result = fn()
    return result, max(0, _status_kb("VmHWM") - start) * 1024


def phase_peaks(folders: dict[str, Path], steps: int) -> None:
    print(f"\n{'engine':10} {'phase':18} {'estimate MB':>12} {'CPU peak MB':>12} {'estimate/peak':>14}")
    rows = cosyvoice_peaks({k: v for k, v in folders.items() if k.startswith("cosyvoice")})
    for engine_id, folder in folders.items():
        if engine_id.startswith("cosyvoice"):
            continue
        rt = Runtime()
        engine = rt.engine(engine_id, folder)
        engine.steps = steps
        for seconds in (1, 3, 6):
            reference = Audio(0.3 * torch.sin(torch.arange(seconds * 24000) / 6.0).unsqueeze(0), 24000)
            engine.voices.clear()
            ctx = rt.request(seed=1)
            if engine_id == "indextts2":
                voice, encode_peak = live_peak(lambda: engine.voice_prompt(ctx, reference))
                samples = int(seconds * 16000)
                rows.append((engine_id, f"prompt {seconds}s", engine.prompt_memory(samples), encode_peak))
                continue
            voice, encode_peak = live_peak(lambda: engine.voice_prompt(ctx, reference, TRANSCRIPT))
            sampling = Sampling(seed=1, language="English")
            codes, flow_peak = live_peak(lambda: engine.generate(ctx, TEXT, voice, sampling))
            _, decode_peak = live_peak(lambda: engine.decode(ctx, codes))
            if engine_id == "f5tts":
                ref, total = engine.durations(voice, TEXT)
                tokens = len(voice.data["ref_text"] + TEXT)
                rows += [(engine_id, f"flow {seconds}s ref", engine.flow_memory(total, tokens, steps), flow_peak),
                         (engine_id, f"vocoder {seconds}s", engine.vocoder_memory(codes.tokens.shape[-1]), decode_peak)]
            else:
                task = engine._task(TEXT, voice, sampling)
                rows += [(engine_id, f"prompt {seconds}s", engine.encoder_memory(seconds * 24000), encode_peak),
                         (engine_id, f"llm {seconds}s ref", engine.llm_memory(engine.sequence_length(task)), flow_peak),
                         (engine_id, f"decoder {seconds}s", engine.decoder_memory(codes.tokens.shape[-1]), decode_peak)]
    for engine_id, phase, estimate, peak in rows:
        print(f"{engine_id:10} {phase:18} {estimate / MB:12.2f} {peak / MB:12.2f} {estimate / max(peak, 1):13.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="ODE / diffusion steps per request (upstream: 32)")
    parser.add_argument("--peaks", action="store_true", help="also measure each phase's CPU working memory")
    parser.add_argument("--device", default="cpu", help="cpu (the simulated device) or cuda")
    parser.add_argument("--engines", default="f5tts,omnivoice,fishspeech")
    parser.add_argument("--frames", type=int, default=48, help="Fish Speech: frames per request at most")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steady on a shared machine)")
    args = parser.parse_args()
    if args.peaks and MMAP_ENV[0] not in os.environ:
        # glibc's dynamic mmap threshold would move freed tensors to the reused heap, hiding a
        # phase's peak from RSS: fixed, every tensor of 64 KB or more is mapped and unmapped.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, MMAP_ENV[0]: MMAP_ENV[1],
                                                                "MALLOC_TRIM_THRESHOLD_": "0"})
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    import importlib

    with tempfile.TemporaryDirectory(prefix="mizuoto-bench-") as tmp:
        chosen = args.engines.split(",")
        folders = {e: importlib.import_module(WRITERS[e]).write_tiny_checkpoint(
                       Path(tmp) / e, **({"version": int(e[-1])} if e.startswith("cosyvoice") else {}))
                   for e in chosen if e != "gptsovits"}
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, "
              f"{args.steps} steps per request, {args.repeat} requests per placement")
        fish = folders.pop("fishspeech", None)
        oneshot = {k: v for k, v in folders.items() if not k.startswith("cosyvoice")}
        if oneshot:
            time_engines(oneshot, args.steps, args.repeat, args.device)
        if "indextts2" in folders:
            talker_ms_per_code(folders["indextts2"], args.repeat, args.device)
        cosy = {k: v for k, v in folders.items() if k.startswith("cosyvoice")}
        if cosy:
            time_cosyvoice(cosy, args.repeat, args.device)
        if fish is not None:
            time_fish(fish, args.frames, args.repeat)
        if "gptsovits" in chosen:
            write_voice = importlib.import_module(GPTSOVITS_WRITER).write_voice
            time_gptsovits(write_voice(Path(tmp) / "gptsovits", "v2"), args.repeat, args.device)
        if args.peaks:
            phase_peaks(folders, args.steps)


if __name__ == "__main__":
    main()
