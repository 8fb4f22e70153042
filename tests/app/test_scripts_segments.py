"""The line cache (issue 33, item 5): keyed by everything that decides a line's audio, bounded,
and re-running a script after editing one line speaks only that line."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from mizuoto_runtime.app.scripts.segments import SegmentCache, segment_key
from mizuoto_runtime.app.scripts.syntax import ScriptError
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines.base import Sampling, Voice
from mizuoto_runtime.engines.voice_store import VoiceError, canonical, canonical_json, checkpoint_fingerprint


def engine(model_dir: Path | None = None, **changes: Any) -> Any:
    fields = {"id": "demo", "model_dir": model_dir, "dtype": torch.float32, "device": torch.device("cpu"), **changes}
    return SimpleNamespace(**fields)


VOICE = Voice("abc123", {}, "demo")


def test_every_input_that_decides_a_line_changes_its_key(tmp_path: Path) -> None:
    (tmp_path / "talker.safetensors").write_bytes(b"x" * 10)
    base = segment_key(engine(tmp_path), VOICE, "Hello.", Sampling(seed=3), {"emotion": "calm"})
    assert base == segment_key(engine(tmp_path), VOICE, "Hello.", Sampling(seed=3), {"emotion": "calm"})
    variants = [
        segment_key(engine(tmp_path, id="qwen3tts"), VOICE, "Hello.", Sampling(seed=3), {"emotion": "calm"}),
        segment_key(engine(tmp_path, dtype=torch.bfloat16), VOICE, "Hello.", Sampling(seed=3), {"emotion": "calm"}),
        segment_key(engine(tmp_path, device=torch.device("meta")), VOICE, "Hello.", Sampling(seed=3),
                    {"emotion": "calm"}),
        segment_key(engine(None), VOICE, "Hello.", Sampling(seed=3), {"emotion": "calm"}),
        segment_key(engine(tmp_path), Voice("other", {}, "demo"), "Hello.", Sampling(seed=3), {"emotion": "calm"}),
        segment_key(engine(tmp_path), VOICE, "Hello!", Sampling(seed=3), {"emotion": "calm"}),
        segment_key(engine(tmp_path), VOICE, "Hello.", Sampling(seed=4), {"emotion": "calm"}),
        segment_key(engine(tmp_path), VOICE, "Hello.", Sampling(seed=3, temperature=0.5), {"emotion": "calm"}),
        segment_key(engine(tmp_path), VOICE, "Hello.", Sampling(seed=3, language="de"), {"emotion": "calm"}),
        segment_key(engine(tmp_path), VOICE, "Hello.", Sampling(seed=3), {"emotion": "sad"}),
        segment_key(engine(tmp_path), VOICE, "Hello.", Sampling(seed=3)),
    ]
    assert len({base, *variants}) == len(variants) + 1
    (tmp_path / "talker.safetensors").write_bytes(b"y" * 11)  # the checkpoint was rewritten
    assert segment_key(engine(tmp_path), VOICE, "Hello.", Sampling(seed=3), {"emotion": "calm"}) != base


def test_the_checkpoint_fingerprint_reads_names_sizes_and_times_not_weights(tmp_path: Path) -> None:
    weights = tmp_path / "a.safetensors"
    weights.write_bytes(b"1234")
    first = checkpoint_fingerprint(tmp_path)
    assert checkpoint_fingerprint(tmp_path) == first and checkpoint_fingerprint(None) == "builtin"
    os.utime(weights, ns=(1, 1))
    assert checkpoint_fingerprint(tmp_path) != first
    assert checkpoint_fingerprint(weights) != checkpoint_fingerprint(tmp_path)  # a one-file checkpoint
    with pytest.raises(VoiceError, match="checkpoint not found: .*nowhere"):
        checkpoint_fingerprint(tmp_path / "nowhere")


def test_options_are_keyed_by_value_and_what_cannot_be_keyed_is_refused() -> None:
    vector = torch.tensor([0.1, 0.2], dtype=torch.bfloat16)
    assert canonical_json({"b": 1, "a": [vector, 1.5]}) == canonical_json({"a": (vector.clone(), 1.5), "b": 1})
    assert canonical_json({"v": vector}) != canonical_json({"v": vector.float()})
    assert canonical(Audio(torch.zeros(1, 4), 16000)) != canonical(Audio(torch.zeros(1, 4), 24000))
    assert canonical(float("nan")) == "nan"
    with pytest.raises(VoiceError, match=r"options.style: a object cannot be part of a cache key"):
        canonical_json({"style": object()})
    with pytest.raises(VoiceError, match="keys must be strings"):
        canonical({1: 2})


def tone(value: float) -> Audio:
    return Audio(torch.full((1, 8), value), 16000)


def test_only_missing_lines_are_spoken_and_the_count_from_the_cache_is_reported() -> None:
    cache = SegmentCache()
    texts = ["One.", "Two.", "Three."]
    calls: list[list[int]] = []

    def run(lines: list[str]) -> Any:
        keys = [segment_key(engine(), VOICE, text, Sampling(seed=10 + i)) for i, text in enumerate(lines)]

        def speak(missing: list[int]) -> list[Audio]:
            calls.append(missing)
            return [tone(float(len(lines[i]) + i)) for i in missing]

        return cache.speak(keys, speak)

    first = run(texts)
    assert first.from_cache == 0 and calls == [[0, 1, 2]]
    texts[1] = "Two, edited."
    second = run(texts)
    assert second.from_cache == 2 and calls[-1] == [1]
    assert [torch.equal(a.waveform, b.waveform) for a, b in zip(first.audio, second.audio)] == [True, False, True]
    third = run(texts)
    assert third.from_cache == 3 and len(calls) == 2  # nothing to speak: speak is not called


def test_the_cache_is_bounded_and_holds_copies() -> None:
    cache = SegmentCache(kept=2)
    keys = [segment_key(engine(), VOICE, f"Line {i}.", Sampling()) for i in range(3)]
    audio = tone(1.0)
    cache.put(keys[0], audio)
    audio.waveform.fill_(9.0)  # the caller changes its audio afterwards
    assert torch.equal(cache.get(keys[0]).waveform, tone(1.0).waveform)
    cache.get(keys[0]).waveform.fill_(7.0)  # and what it read
    assert torch.equal(cache.get(keys[0]).waveform, tone(1.0).waveform)
    cache.put(keys[1], tone(2.0))
    cache.get(keys[0])  # the newest now
    cache.put(keys[2], tone(3.0))
    assert len(cache) == 2 and cache.get(keys[1]) is None and cache.get(keys[0]) is not None
    with pytest.raises(ScriptError, match="2 lines to speak, but 1 audio clips came back"):
        SegmentCache().speak(keys[:2], lambda missing: [tone(0.0)])
    cache.clear()
    assert len(cache) == 0


def test_a_lines_seed_is_part_of_its_sampling_key() -> None:
    sampling = Sampling(seed=5)
    assert segment_key(engine(), VOICE, "x", sampling).sampling == canonical_json(dataclasses.asdict(sampling),
                                                                                   "sampling")
