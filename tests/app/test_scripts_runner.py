"""A script run phase by phase (issue 33, item 4) on the demo engine: every voice prompt, then
every talker line, then every decode. On a simulated device too small for the talker and the
decoder together, a 12-line, 3-character script places each component once (the manager's
placement log), and each line's audio is the audio of that line spoken alone with seed + i."""
from __future__ import annotations

import collections

import pytest
import torch

from mizuoto_runtime import Runtime
from mizuoto_runtime.app.scripts.runner import CharacterVoice, speak_script, speak_subtitles
from mizuoto_runtime.app.scripts.segments import SegmentCache
from mizuoto_runtime.app.scripts.subtitles import parse_srt
from mizuoto_runtime.app.scripts.syntax import Line, Script, ScriptError, parse_script
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines.base import Sampling
from mizuoto_runtime.errors import CancelledError

# The demo's talker is 11 MB and its decoder 7.6 MB: each fits on 16 MB with its working
# memory, the two together do not.
SMALL_MB = 16
SEED = 3
SAMPLING = Sampling(seed=SEED, max_new_tokens=16)


def reference(k: int) -> Audio:
    return Audio(torch.sin(torch.arange(4096) / (5.0 + k)).unsqueeze(0) * 0.3, 16000)


VOICES = {None: CharacterVoice(reference(0), "Narrator."), "Alice": CharacterVoice(reference(1), "Alice."),
          "Bob": CharacterVoice(reference(2), "Bob.")}
CAST = [None, "Alice", "Bob"]
TEXT = "\n".join(f"[{c}] Line number {i}." if c else f"Line number {i}." for i, c in enumerate(CAST * 4))
SCRIPT = parse_script(TEXT.replace("Line number 5.", "Line number 5. [pause:250ms]"), ["Alice", "Bob"])


def placements(rt: Runtime) -> dict[str, int]:
    """How many times each component was placed (bytes moved onto the device)."""
    return dict(collections.Counter(name for action, name, placed in rt.manager.events if action == "place" and placed))


def alone(rt: Runtime, line: Line, seed: int) -> torch.Tensor:
    source = VOICES[line.character]
    audio, _ = rt.say(rt.engine("demo"), line.text, reference=source.reference, transcript=source.transcript,
                      sampling=Sampling(seed=seed, max_new_tokens=16))
    return audio.waveform


def test_a_twelve_line_script_places_each_component_once_and_each_line_is_its_alone_run() -> None:
    assert len(SCRIPT.lines) == 12 and set(SCRIPT.characters()) == set(CAST)
    rt = Runtime({"compute.simulate_vram_mb": SMALL_MB})
    grouped = speak_script(rt, rt.engine("demo"), SCRIPT, VOICES, SAMPLING)
    assert placements(rt) == {"demo:speaker_encoder": 1, "demo:talker": 1, "demo:decoder": 1}

    by_line = Runtime({"compute.simulate_vram_mb": SMALL_MB})
    one_by_one = speak_script(by_line, by_line.engine("demo"), SCRIPT, VOICES, SAMPLING, grouped=False)
    # The same device run line by line: the talker and the decoder evict each other every line.
    assert placements(by_line) == {"demo:speaker_encoder": 1, "demo:talker": 12, "demo:decoder": 12}

    plain = Runtime()  # nothing moves: the reference run
    for i, line in enumerate(SCRIPT.lines):
        expected = alone(plain, line, SEED + i)
        assert torch.equal(grouped.lines[i].waveform, expected), i
        assert torch.equal(one_by_one.lines[i].waveform, expected), i
    assert torch.equal(grouped.audio.waveform, one_by_one.audio.waveform)
    pause = 4000  # 250 ms at 16 kHz, after line 5
    assert grouped.audio.waveform.shape[-1] == sum(a.waveform.shape[-1] for a in grouped.lines) + pause
    assert grouped.from_cache == 0 and "memory" in grouped.meta


def test_a_lines_own_seed_and_language_are_used() -> None:
    script = parse_script("[Alice] First.\n[seed:99] Second.\n[de:Bob] Third.", ["Alice", "Bob"])
    rt = Runtime()
    out = speak_script(rt, rt.engine("demo"), script, VOICES, SAMPLING)
    assert torch.equal(out.lines[1].waveform, alone(rt, script.lines[1], 99))
    assert torch.equal(out.lines[2].waveform, alone(rt, script.lines[2], SEED + 2))  # the demo ignores language


def test_a_rerun_after_editing_one_line_speaks_only_that_line() -> None:
    rt = Runtime({"compute.simulate_vram_mb": SMALL_MB})
    engine = rt.engine("demo")
    cache = SegmentCache()
    first = speak_script(rt, engine, SCRIPT, VOICES, SAMPLING, cache=cache)
    edited = Script(tuple(Line("An edited line.", "Bob") if item == SCRIPT.lines[7] else item
                          for item in SCRIPT.items))
    rt.manager.events.clear()
    progress: list[tuple[int, int]] = []
    second = speak_script(rt, engine, edited, VOICES, SAMPLING, cache=cache,
                          on_progress=lambda done, total: progress.append((done, total)))
    assert second.from_cache == 11
    assert "demo:speaker_encoder" not in placements(rt)  # the voices were prompted before (M4)
    # 3 voices, the 11 cached lines at once, then the edited line's talker and decoder phases
    assert progress == [(1, 27), (2, 27), (3, 27), (25, 27), (26, 27), (27, 27)]
    for i in range(12):
        assert torch.equal(first.lines[i].waveform, second.lines[i].waveform) == (i != 7), i
    assert torch.equal(second.lines[7].waveform, alone(Runtime(), edited.lines[7], SEED + 7))
    progress.clear()
    third = speak_script(rt, engine, edited, VOICES, SAMPLING, cache=cache,
                         on_progress=lambda done, total: progress.append((done, total)))
    assert progress == [(1, 27), (2, 27), (3, 27), (27, 27)]
    assert third.from_cache == 12 and torch.equal(third.audio.waveform, second.audio.waveform)


def test_progress_counts_voices_and_lines_times_phases() -> None:
    rt = Runtime()
    progress: list[tuple[int, int]] = []
    speak_script(rt, rt.engine("demo"), SCRIPT, VOICES, SAMPLING, on_progress=lambda d, t: progress.append((d, t)))
    assert progress == [(d, 3 + 2 * 12) for d in range(1, 28)]


def test_an_interrupt_stops_between_lines_with_nothing_held() -> None:
    rt = Runtime({"compute.simulate_vram_mb": SMALL_MB})
    engine = rt.engine("demo")
    calls = 0

    def cancel() -> None:
        nonlocal calls
        calls += 1
        if calls > 4:
            raise CancelledError("interrupted")

    with pytest.raises(CancelledError):
        speak_script(rt, engine, SCRIPT, VOICES, SAMPLING, cancel_check=cancel)
    assert not any(h.in_use for h in engine.handles())


def test_every_character_needs_a_voice_and_the_engine_must_be_phased() -> None:
    rt = Runtime()
    with pytest.raises(ScriptError, match=r"no voice for 'Bob'"):
        speak_script(rt, rt.engine("demo"), SCRIPT, {k: v for k, v in VOICES.items() if k != "Bob"}, SAMPLING)
    with pytest.raises(ScriptError, match="no voice for the node"):
        speak_script(rt, rt.engine("demo"), SCRIPT, {k: v for k, v in VOICES.items() if k}, SAMPLING)
    with pytest.raises(ScriptError, match="does not run in phases"):
        speak_script(rt, rt.engine("dummy"), SCRIPT, VOICES, SAMPLING)


def test_a_subtitle_track_is_spoken_as_one_script_and_placed_on_its_cues() -> None:
    cues = parse_srt("1\n00:00:00,500 --> 00:00:01,000\n[Alice] First cue.\n\n"
                     "2\n00:00:01,200 --> 00:00:02,000\nSecond [pause:100ms] [Bob] cue.\n\n"
                     "3\n00:00:09,000 --> 00:00:09,500\n[seed:42] Third.\n")
    rt = Runtime({"compute.simulate_vram_mb": SMALL_MB})
    placed = speak_subtitles(rt, rt.engine("demo"), cues, VOICES, SAMPLING, "pad")
    assert placements(rt) == {"demo:speaker_encoder": 1, "demo:talker": 1, "demo:decoder": 1}
    plain = Runtime()
    lines = [alone(plain, Line("First cue.", "Alice"), SEED), alone(plain, Line("Second"), SEED + 1),
             alone(plain, Line("cue.", "Bob"), SEED + 2), alone(plain, Line("Third."), 42)]
    rate = 16000
    starts = [round(c.start_ms * rate / 1000) for c in placed.cues]
    wave = placed.audio.waveform
    assert torch.equal(wave[:, starts[0]:starts[0] + lines[0].shape[-1]], lines[0])
    second = torch.cat([lines[1], torch.zeros(1, 1600), lines[2]], dim=-1)
    assert torch.equal(wave[:, starts[1]:starts[1] + second.shape[-1]], second)
    assert torch.equal(wave[:, starts[2]:starts[2] + lines[3].shape[-1]], lines[3])
    assert placed.cues[2].start_ms == 9000 and placed.cues[1].start_ms >= 1200
