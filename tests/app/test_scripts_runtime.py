"""Scripts and long text through the runtime hosts use (issue 33, item 4): `Runtime.speak_script`
and `Runtime.say` run phase by phase, serve the engine like every request (after an
out-of-memory error the device is emptied), and `meta.memory` says per component how many
times the request placed it, so the grouping shows in every report."""
from __future__ import annotations

import collections

import pytest
import torch

from mizuoto_runtime import Runtime
from mizuoto_runtime.app.chunking import NO_CHUNKING, TextChunking, chunk_seed, chunk_text
from mizuoto_runtime.app.scripts.runner import CharacterVoice
from mizuoto_runtime.app.scripts.subtitles import parse_srt
from mizuoto_runtime.app.scripts.syntax import parse_script
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines.base import Sampling

SMALL_MB = 16  # the demo's talker or decoder fits with its working memory, not both (test_scripts_runner)
VOICES = {None: CharacterVoice(Audio(torch.sin(torch.arange(4096) / 5.0).unsqueeze(0) * 0.3, 16000), "Narrator."),
          "Alice": CharacterVoice(Audio(torch.sin(torch.arange(4096) / 7.0).unsqueeze(0) * 0.3, 16000), "Alice.")}
SCRIPT = parse_script("\n".join(f"[Alice] Alice says {i}." if i % 2 else f"The narrator says {i}." for i in range(6)),
                      ["Alice"])
LONG = " ".join(f"This is sentence number {i} of a long text." for i in range(8))
COMPONENTS = ("demo:speaker_encoder", "demo:talker", "demo:decoder")


def placed(meta: dict) -> dict[str, int]:
    return {name: c["placed"] for name, c in meta["memory"]["components"].items()}


def logged(rt: Runtime) -> dict[str, int]:
    return dict(collections.Counter(name for action, name, n in rt.manager.events if action == "place" and n))


def test_a_script_through_the_runtime_reports_each_component_placed_once() -> None:
    rt = Runtime({"compute.simulate_vram_mb": SMALL_MB})
    grouped = rt.speak_script(rt.engine("demo"), SCRIPT, VOICES, Sampling(seed=2, max_new_tokens=16))
    assert placed(grouped.meta) == dict.fromkeys(COMPONENTS, 1) == logged(rt)
    assert all(c["copied_mb"] > 0 for c in grouped.meta["memory"]["components"].values())

    by_line = Runtime({"compute.simulate_vram_mb": SMALL_MB})
    apart = by_line.speak_script(by_line.engine("demo"), SCRIPT, VOICES, Sampling(seed=2, max_new_tokens=16),
                                 grouped=False)
    assert placed(apart.meta) == {"demo:speaker_encoder": 1, "demo:talker": 6, "demo:decoder": 6} == logged(by_line)
    assert all(torch.equal(a.waveform, b.waveform) for a, b in zip(grouped.lines, apart.lines))


def test_a_request_that_places_nothing_reports_zero_placements() -> None:
    rt = Runtime({"compute.simulate_vram_mb": 64})  # everything fits: the second request finds it placed
    engine = rt.engine("demo")
    _, first = rt.say(engine, "Hello there.", sampling=Sampling(max_new_tokens=8))
    _, second = rt.say(engine, "Hello there.", sampling=Sampling(max_new_tokens=8))
    assert placed(first) == {"demo:talker": 1, "demo:decoder": 1}
    assert placed(second) == {"demo:talker": 0, "demo:decoder": 0}
    assert {c["copied_mb"] for c in second["memory"]["components"].values()} == {0}


def test_long_text_places_the_talker_and_decoder_once_and_each_chunk_is_its_alone_run() -> None:
    rt = Runtime({"compute.simulate_vram_mb": SMALL_MB})
    engine = rt.engine("demo")
    chunks = chunk_text(LONG, 60)
    assert len(chunks) >= 3
    audio, meta = rt.say(engine, LONG, sampling=Sampling(seed=5, max_new_tokens=12),
                         chunking=TextChunking(max_chars=60))
    assert placed(meta) == {"demo:talker": 1, "demo:decoder": 1}  # not once per chunk
    alone, _ = rt.say(engine, chunks[-1], sampling=Sampling(seed=chunk_seed(5, len(chunks) - 1), max_new_tokens=12),
                      chunking=NO_CHUNKING)
    tail = alone.waveform.shape[-1] - round(alone.sample_rate * TextChunking().crossfade_ms / 1000)
    assert torch.equal(audio.waveform[..., -tail:], alone.waveform[..., -tail:])


def test_subtitles_through_the_runtime_place_each_component_once() -> None:
    rt = Runtime({"compute.simulate_vram_mb": SMALL_MB})
    cues = parse_srt("1\n00:00:00,000 --> 00:00:01,000\nHello.\n\n2\n00:00:02,000 --> 00:00:03,000\n[Alice] Hi.\n")
    placed_track = rt.speak_subtitles(rt.engine("demo"), cues, VOICES, Sampling(max_new_tokens=8))
    assert len(placed_track.report) == 2
    assert logged(rt) == dict.fromkeys(COMPONENTS, 1)


def test_an_out_of_memory_error_in_a_script_empties_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    rt = Runtime({"compute.simulate_vram_mb": 64})
    engine = rt.engine("demo")
    released: list[bool] = []
    monkeypatch.setattr(rt.service, "release_after_oom", lambda: released.append(True))

    def out_of_memory(*_args: object, **_kwargs: object) -> None:
        raise torch.OutOfMemoryError("simulated")

    monkeypatch.setattr(engine, "decode", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        rt.speak_script(engine, SCRIPT, VOICES, Sampling(max_new_tokens=8))
    assert released == [True]
