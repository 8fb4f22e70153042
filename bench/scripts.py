"""A script phase-grouped vs line by line (issue 33): Qwen3-TTS (Base), CosyVoice 2 and
IndexTTS-2, tiny random checkpoints in their published layouts, the same 12-line script of
three characters (each with its own reference recording), on a simulated device that holds
the engine's largest component but not every component at once.

Grouped: every voice prompt, then every talker line, then every decode (`Runtime.speak_script`).
Line by line: each line's talker and decoder in turn (``grouped=False``), as long text ran
before. Each run starts from a fresh runtime (no voice or line cached). It prints, per engine
and mode, how many times the request placed each component (`meta.memory`), the bytes it
copied onto the device doing so, and the wall time (best of ``--repeat``), and checks that
both modes give the same audio, sample for sample.

    python bench/scripts.py [--engines qwen3tts,cosyvoice2,indextts2] [--repeat 1] [--tokens 16]
                            [--device-mb indextts2=7]
"""
from __future__ import annotations

import argparse
import importlib
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mizuoto_runtime import Runtime  # noqa: E402
from mizuoto_runtime.app.scripts.runner import CharacterVoice, ScriptAudio  # noqa: E402
from mizuoto_runtime.app.scripts.syntax import parse_script  # noqa: E402
from mizuoto_runtime.audio import Audio  # noqa: E402
from mizuoto_runtime.engines import Sampling  # noqa: E402
from mizuoto_runtime.errors import DeviceTooSmallError  # noqa: E402

MB = 1 << 20
WRITERS: dict[str, tuple[str, str, dict[str, Any]]] = {  # bench name -> engine id, tiny writer, its arguments
    "qwen3tts": ("qwen3tts", "mizuoto_runtime.engines.qwen3tts.tiny", {"model_type": "base"}),
    "cosyvoice2": ("cosyvoice", "mizuoto_runtime.engines.cosyvoice.tiny", {"version": 2}),
    "indextts2": ("indextts2", "mizuoto_runtime.engines.indextts.tiny", {}),
}
CAST = [None, "Alice", "Bob"]
SCRIPT = parse_script("\n".join(
    (f"[{c}] " if c else "") + f"This is line number {i + 1}, spoken by {c or 'the narrator'}."
    for i, c in enumerate(CAST * 4)), ["Alice", "Bob"])
TRANSCRIPT = "a reference sentence."


def voices() -> dict[str | None, CharacterVoice]:
    """Three references at 24 kHz, one per character (their own pitch)."""
    return {c: CharacterVoice(Audio(0.3 * torch.sin(torch.arange(24000) / (6.0 + 2 * k)).unsqueeze(0), 24000),
                              TRANSCRIPT) for k, c in enumerate(CAST)}


def device_mb(engine_id: str, folder: Path) -> int:
    """A simulated device for the largest component, smaller than the two largest together: a
    phase's components fit (partly streamed where its working memory needs room), the talker's
    and the decoder's do not stay placed together."""
    sizes = sorted((h.size_bytes for h in Runtime().engine(engine_id, folder).handles()), reverse=True)
    return max(math.ceil(sizes[0] * 1.1 / MB) + 1, math.ceil((sizes[0] + sizes[1]) * 0.75 / MB))


def run(engine_id: str, folder: Path, simulate_mb: int, grouped: bool, tokens: int) -> tuple[ScriptAudio, float]:
    rt = Runtime({"compute.simulate_vram_mb": simulate_mb})
    engine = rt.engine(engine_id, folder)
    start = time.perf_counter()
    spoken = rt.speak_script(engine, SCRIPT, voices(), Sampling(seed=1, max_new_tokens=tokens), grouped=grouped)
    return spoken, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default=",".join(WRITERS))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=16, help="max_new_tokens per line")
    parser.add_argument("--device-mb", action="append", default=[], metavar="ENGINE=MB",
                        help="the simulated device of one engine (default: from its components' sizes)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    chosen = {name: int(mb) for name, _, mb in (pair.partition("=") for pair in args.device_mb)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.engines.split(","):
            engine_id, writer, writer_args = WRITERS[name]
            folder = importlib.import_module(writer).write_tiny_checkpoint(Path(tmp) / name, **writer_args)
            simulate = chosen.get(name) or device_mb(engine_id, folder)
            while True:  # a phase whose working memory does not fit: a larger device, a quarter more
                try:
                    run(engine_id, folder, simulate, True, 2)
                    break
                except DeviceTooSmallError:
                    simulate = math.ceil(simulate * 1.25)
            audio = {}
            for grouped in (True, False):
                best = math.inf
                for _ in range(args.repeat):
                    spoken, seconds = run(engine_id, folder, simulate, grouped, args.tokens)
                    best = min(best, seconds)
                components = spoken.meta["memory"]["components"]
                placed = ", ".join(f"{c.split(':', 1)[1]} {v['placed']}" for c, v in sorted(components.items()))
                copied = sum(v["copied_mb"] for v in components.values())
                audio[grouped] = spoken.lines
                rows.append((name, simulate, "grouped" if grouped else "line by line",
                             sum(v["placed"] for v in components.values()), placed, copied, best))
            same = all(torch.equal(a.waveform, b.waveform) for a, b in zip(audio[True], audio[False]))
            rows.append((name, simulate, "same audio", "", "yes" if same else "NO", "", math.nan))
    print(f"{len(SCRIPT.lines)}-line script, {len(CAST)} characters, max_new_tokens {args.tokens}, best of "
          f"{args.repeat}\n")
    print("| engine | device MB | mode | placements | per component | MB copied | wall s |")
    print("|---|---|---|---|---|---|---|")
    for name, simulate, mode, total, placed, copied, seconds in rows:
        wall = "" if math.isnan(seconds) else f"{seconds:.2f}"
        mb = f"{copied:.1f}" if copied != "" else ""
        print(f"| {name} | {simulate} | {mode} | {total} | {placed} | {mb} | {wall} |")


if __name__ == "__main__":
    main()
