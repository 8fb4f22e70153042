"""Prompted voices kept on disk by the engines themselves (issue 33, item 2; M4 across
restarts): with a prompt store configured, `Engine.voice_prompt` reads a voice another process
prompted instead of placing its voice-prompt models, and the line spoken with it is the same,
sample for sample. Engines whose prompt is an upstream object say so (`PROMPT_ON_DISK`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from mizuoto_runtime import Runtime
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines import engine_class
from mizuoto_runtime.engines.voice_store import VoicePromptStore

REPO = Path(__file__).resolve().parents[2]

# One process: prompt a voice (the store configured), speak a line with it, and write what the
# voice-prompt phase placed and the line's samples.
PROCESS = """
import json, sys, torch
from mizuoto_runtime import Runtime
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines.base import Sampling
from mizuoto_runtime.engines.voice_store import VoicePromptStore
store, engine_id, model_dir, out = sys.argv[1:5]
rt = Runtime({"compute.simulate_vram_mb": 512})
rt.prompt_store = VoicePromptStore(store)
engine = rt.engine(engine_id, model_dir or None)
reference = Audio(torch.sin(torch.arange(12000) / 7.0).unsqueeze(0) * 0.3, 24000)
ctx = rt.request()
voice = engine.voice_prompt(ctx, reference, "Hello there.")
placed = [name for action, name, n in rt.manager.events if action == "place"]
audio, _ = rt.say(engine, "A line.", reference=reference, transcript="Hello there.",
                  sampling=Sampling(seed=4, max_new_tokens=8))
torch.save(audio.waveform, out + ".pt")
json.dump(placed, open(out + ".json", "w"))
"""


def run(store: Path, engine_id: str, model_dir: Path | None, out: Path) -> tuple[list[str], torch.Tensor]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", PROCESS, str(store), engine_id, str(model_dir or ""), str(out)],
                   check=True, env=env, timeout=600)
    return json.loads(out.with_suffix(".json").read_text()), torch.load(out.with_suffix(".pt"), weights_only=True)


def across_processes(tmp_path: Path, engine_id: str, model_dir: Path | None) -> None:
    store = tmp_path / "store"
    first_placed, first = run(store, engine_id, model_dir, tmp_path / "first")
    assert first_placed, "the first process prompts the voice: its models are placed"
    assert len(VoicePromptStore(store).entries()) == 1
    second_placed, second = run(store, engine_id, model_dir, tmp_path / "second")
    assert second_placed == []  # the voice-prompt phase placed nothing: the prompt came from disk
    assert torch.equal(first, second)


def test_the_demo_engine_uses_a_voice_another_process_prompted(tmp_path: Path) -> None:
    across_processes(tmp_path, "demo", None)


def test_qwen3tts_uses_a_voice_another_process_prompted(tmp_path: Path,
                                                        qwen3tts_checkpoint: Callable[[str], Path]) -> None:
    across_processes(tmp_path, "qwen3tts", qwen3tts_checkpoint("base"))


def test_without_a_store_nothing_is_written_and_a_store_set_later_reaches_loaded_engines(tmp_path: Path) -> None:
    rt = Runtime()
    engine = rt.engine("demo")
    reference = Audio(torch.sin(torch.arange(4096) / 3.0).unsqueeze(0) * 0.3, 16000)
    engine.voice_prompt(rt.request(), reference, "One.")
    assert engine.prompt_store is None and not (tmp_path / "store").exists()
    rt.prompt_store = VoicePromptStore(tmp_path / "store")
    assert rt.engine("demo") is engine and engine.prompt_store is rt.prompt_store
    engine.voice_prompt(rt.request(), reference, "Two.")
    assert len(rt.prompt_store.entries()) == 1


def test_an_engine_whose_prompt_is_an_upstream_object_keeps_it_in_memory_only() -> None:
    assert engine_class("omnivoice").PROMPT_ON_DISK is False
    assert engine_class("demo").PROMPT_ON_DISK is True
