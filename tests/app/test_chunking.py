"""Long text: sentence boundaries (English, Chinese), chunks, the crossfade, and chunked
synthesis — same seed same audio, one chunk exactly the unchunked run, phases and progress per
chunk."""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mizuoto_runtime import Audio, MizuotoError, Runtime
from mizuoto_runtime.app.chunking import (
    CROSSFADE_MS,
    NO_CHUNKING,
    ChunkProgress,
    TextChunking,
    chunk_seed,
    chunk_text,
    crossfade_samples,
    join_chunks,
    split_sentences,
)
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.engines import Sampling

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # a loaded 2-core machine: see conftest

ENGLISH = ('Dr. Smith arrived at 3.30 p.m. on Friday. "Is it raining?" he asked. It was! '
           "J. R. R. Tolkien wrote books, e.g. The Hobbit... and more.\nA new line")
CHINESE = "今天天气很好。我们去公园吧！你觉得怎么样？好的……那就走吧。他说：“我来了。”然后离开了"


def test_english_sentence_boundaries() -> None:
    assert split_sentences(ENGLISH) == [
        "Dr. Smith arrived at 3.30 p.m. on Friday.",  # a title, a decimal and a lower-case abbreviation
        '"Is it raining?" he asked.',  # lower case after the quote: the sentence goes on
        "It was!",
        "J. R. R. Tolkien wrote books, e.g. The Hobbit... and more.",  # initials; "e.g." before a capital
        "A new line",  # a line break ends a sentence
    ]


def test_chinese_sentence_boundaries() -> None:
    """Full-width ends need no space after them; closing quotes stay with their sentence."""
    assert split_sentences(CHINESE) == ["今天天气很好。", "我们去公园吧！", "你觉得怎么样？", "好的……", "那就走吧。",
                                        "他说：“我来了。”", "然后离开了"]
    assert split_sentences("Mixed 中文。English next! 再来") == ["Mixed 中文。", "English next!", "再来"]


def test_chunks_pack_whole_sentences_and_lose_nothing() -> None:
    text = " ".join(f"Sentence number {i} is here." for i in range(12))
    chunks = chunk_text(text, 60)
    assert all(len(c) <= 60 for c in chunks) and len(chunks) == 6
    assert all(c.endswith(".") and c.startswith("Sentence") for c in chunks)  # never mid-sentence
    assert " ".join(chunks) == text
    chinese = chunk_text(CHINESE * 3, 30)
    assert all(len(c) <= 30 for c in chinese) and "".join(chinese) == CHINESE * 3
    assert chunk_text("Short one.", 200) == ["Short one."]
    assert chunk_text("   ", 200) == []


def test_an_overlong_sentence_is_cut_at_clauses_then_words_then_anywhere() -> None:
    clauses = "one two three, four five six, seven eight nine."
    assert chunk_text(clauses, 20) == ["one two three,", "four five six,", "seven eight nine."]
    assert chunk_text("春天来了，花开了，鸟儿在唱歌。", 6) == ["春天来了，", "花开了，", "鸟儿在唱歌。"]
    assert chunk_text("alpha beta gamma delta", 11) == ["alpha beta", "gamma delta"]
    assert chunk_text("一二三四五六七八九十", 4) == ["一二三四", "五六七八", "九十"]


def test_chunk_size_is_checked() -> None:
    with pytest.raises(MizuotoError, match="chunk size: at least 20 characters, got 5"):
        TextChunking(max_chars=5)
    assert TextChunking().max_chars == 200 and TextChunking().crossfade_ms == CROSSFADE_MS == 50
    assert NO_CHUNKING.split(ENGLISH) == [ENGLISH]
    assert TextChunking().split("") == [""]  # nothing to cut: the engine gets the text as it is


def test_the_crossfade_length() -> None:
    rate = 16000
    fade = crossfade_samples(rate, CROSSFADE_MS)
    assert fade == 800
    pieces = [Audio(torch.full((1, n), value), rate) for n, value in ((5000, 1.0), (3000, 0.0), (4000, 1.0))]
    joined = join_chunks(pieces, CROSSFADE_MS)
    assert joined.waveform.shape == (1, 5000 + 3000 + 4000 - 2 * fade) and joined.sample_rate == rate
    # The first overlap fades linearly from the first piece (1.0) into the second (0.0).
    overlap = joined.waveform[0, 5000 - fade:5000]
    assert torch.allclose(overlap, torch.linspace(1, 0, fade))
    assert torch.equal(joined.waveform[0, :5000 - fade], torch.ones(5000 - fade))
    # A piece shorter than the crossfade overlaps by its own length only.
    short = join_chunks([Audio(torch.ones(1, 2000), rate), Audio(torch.zeros(1, 300), rate)], CROSSFADE_MS)
    assert short.waveform.shape[-1] == 2000
    assert join_chunks([pieces[0]]) is pieces[0]
    with pytest.raises(MizuotoError, match="16000 Hz × 1 channels vs 24000 Hz × 1"):
        join_chunks([pieces[0], Audio(torch.zeros(1, 10), 24000)])


LONG = ("The first sentence is short. The second one is a little longer than the first. "
        "A third sentence follows here! Does a question end it? It does, and then the text ends.")
LONG_CHUNKS = 4  # at 60 characters
TOKENS = 16  # codes per chunk: the demo engine's talker stops there (fast tests)
CHUNKING = TextChunking(max_chars=60)


def say(rt: Runtime, text: str, seed: int = 7, chunking: TextChunking = CHUNKING,
        **kwargs: Any) -> tuple[Audio, dict[str, Any]]:
    engine = rt.engine("demo")
    return rt.say(engine, text, sampling=Sampling(seed=seed, max_new_tokens=TOKENS), chunking=chunking, **kwargs)


def test_same_seed_same_audio_and_placement_changes_nothing() -> None:
    first, meta = say(Runtime(), LONG)
    assert meta["chunks"] == len(chunk_text(LONG, 60)) == LONG_CHUNKS
    again, _ = say(Runtime(), LONG)
    streamed, streamed_meta = say(Runtime({"compute.simulate_vram_mb": 10}), LONG)  # every chunk streams
    assert torch.equal(first.waveform, again.waveform) and torch.equal(first.waveform, streamed.waveform)
    assert streamed_meta["memory"]["streamed_mb"] > 0
    other, _ = say(Runtime(), LONG, seed=8)
    assert not torch.equal(first.waveform, other.waveform)


def test_one_chunk_is_exactly_the_unchunked_audio() -> None:
    rt = Runtime()
    text = "One sentence. And another one."
    chunked, meta = say(rt, text, chunking=TextChunking())
    unchunked, _ = say(rt, text, chunking=NO_CHUNKING)
    engine = rt.engine("demo")
    ctx = rt.request(7)  # the phases run by hand, as before chunking existed
    by_hand = engine.synthesize(ctx, text, engine.voice_prompt(ctx), Sampling(seed=7, max_new_tokens=TOKENS))
    assert meta["chunks"] == 1
    assert torch.equal(chunked.waveform, unchunked.waveform) and torch.equal(chunked.waveform, by_hand.waveform)


def test_a_chunk_depends_only_on_the_seed_its_index_and_its_text() -> None:
    rt = Runtime()
    joined, _ = say(rt, LONG, seed=7)
    last = chunk_text(LONG, 60)[-1]
    alone, _ = say(rt, last, seed=chunk_seed(7, LONG_CHUNKS - 1), chunking=NO_CHUNKING)
    fade = crossfade_samples(alone.sample_rate, CROSSFADE_MS)
    tail = alone.waveform.shape[-1] - fade
    assert torch.equal(joined.waveform[..., -tail:], alone.waveform[..., fade:])


def test_each_chunk_runs_its_own_phases_and_the_progress_bar_follows_the_chunks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rt = Runtime({"compute.simulate_vram_mb": 10})
    engine = rt.engine("demo")
    phases: list[str] = []
    acquire = rt.manager.acquire

    def recorded(handles: Any, memory: int, phase: str = "", **kwargs: Any) -> Any:
        phases.append(phase)
        return acquire(handles, memory, phase=phase, **kwargs)

    monkeypatch.setattr(rt.manager, "acquire", recorded)
    seen: list[tuple[int, int]] = []
    reference = Audio(torch.randn(1, 8000) * 0.1, 16000)
    rt.say(engine, LONG, reference=reference, sampling=Sampling(seed=1, max_new_tokens=TOKENS),
           chunking=TextChunking(max_chars=60), on_progress=lambda done, total: seen.append((done, total)))
    # The voice once, then every chunk's talker, then every chunk's decode (grouped by phase).
    assert phases == ["voice prompt", *["talker"] * LONG_CHUNKS, *["codec decoder"] * LONG_CHUNKS]
    steps = ChunkProgress.STEPS
    assert {total for _, total in seen} == {LONG_CHUNKS * steps}
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[0] == 0 and done[-1] >= (LONG_CHUNKS - 1) * steps  # never back
    assert all(any(i * steps <= d < (i + 1) * steps for d in done) for i in range(LONG_CHUNKS))


def test_chunk_progress_passes_one_chunk_through() -> None:
    seen: list[tuple[int, int]] = []
    ChunkProgress(lambda d, t: seen.append((d, t)), 1)(5, 40)
    progress = ChunkProgress(lambda d, t: seen.append((d, t)), 4)
    progress.index = 2
    progress(10, 40)
    assert seen == [(5, 40), (2 * ChunkProgress.STEPS + ChunkProgress.STEPS // 4, 4 * ChunkProgress.STEPS)]


def test_unphased_engines_chunk_too() -> None:
    rt = Runtime()
    engine = rt.engine("dummy")
    audio, meta = rt.say(engine, LONG, chunking=TextChunking(max_chars=60))
    pieces = [rt.say(engine, c, chunking=NO_CHUNKING)[0].waveform.shape[-1] for c in chunk_text(LONG, 60)]
    fade = crossfade_samples(engine.sample_rate, CROSSFADE_MS)
    assert meta["chunks"] == LONG_CHUNKS and audio.waveform.shape[-1] == sum(pieces) - (LONG_CHUNKS - 1) * fade


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(list(argv)) == 0
    return dict(json.loads(capsys.readouterr().out))


def test_mizuoto_say_chunks_long_text_and_has_a_switch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = ("--max-new-tokens", str(TOKENS))
    chunked = cli(capsys, "say", LONG, "-o", str(tmp_path / "a.wav"), "--chunk-chars", "60", *tokens)
    whole = cli(capsys, "say", LONG, "-o", str(tmp_path / "b.wav"), "--no-chunking", *tokens)
    default = cli(capsys, "say", LONG, "-o", str(tmp_path / "c.wav"), *tokens)
    assert (chunked["chunks"], whole["chunks"], default["chunks"]) == (LONG_CHUNKS, 1, 1)  # 176 characters
    alone = [cli(capsys, "say", c, "-o", str(tmp_path / "p.wav"), "--seed", str(i), *tokens)["seconds"]
             for i, c in enumerate(chunk_text(LONG, 60))]
    assert math.isclose(chunked["seconds"], sum(alone) - (LONG_CHUNKS - 1) * CROSSFADE_MS / 1000, abs_tol=1e-3)


def test_qwen3tts_chunks_are_seeded_and_exact(qwen3tts_checkpoint: Callable[[str], Path]) -> None:
    rt = Runtime()
    engine = rt.engine("qwen3tts", qwen3tts_checkpoint("custom_voice"))
    text = "Hello there, this is the first sentence. And here is the second sentence of it."

    def run(chunking: TextChunking, seed: int = 3) -> tuple[Audio, dict[str, Any]]:
        return rt.say(engine, text, speaker="alice", sampling=Sampling(seed=seed, max_new_tokens=6),
                      chunking=chunking)

    (a, meta), (b, _) = run(TextChunking(max_chars=45)), run(TextChunking(max_chars=45))
    one, _ = run(TextChunking())
    whole, _ = run(NO_CHUNKING)
    assert meta["chunks"] == 2 and torch.equal(a.waveform, b.waveform)
    assert torch.equal(one.waveform, whole.waveform)
    frames = 2 * 5 * 1920 - crossfade_samples(24000, CROSSFADE_MS)  # 5 frames per chunk (6 tokens)
    assert a.waveform.shape[-1] == frames
