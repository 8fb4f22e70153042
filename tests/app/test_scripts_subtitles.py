"""Subtitles (issue 33, item 3): SRT parsing, each cue's character, and the pad / fit / natural
timings on crafted cues with synthetic audio: the adjusted SRT's times match the audio within
1 ms. fit and natural need librosa (optional); their tests are skipped where it is missing."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from mizuoto_runtime.app.scripts.assemble import join
from mizuoto_runtime.app.scripts.subtitles import (
    Cue,
    Placed,
    cue_script,
    format_srt,
    parse_srt,
    place_cues,
    read_srt,
    time_stretch,
)
from mizuoto_runtime.app.scripts.syntax import Line, ScriptError, parse_script
from mizuoto_runtime.audio import Audio

RATE = 24000
needs_librosa = pytest.mark.skipif(importlib.util.find_spec("librosa") is None,
                                   reason="librosa (optional: the fit and natural timings) is not installed")

SRT = """\ufeff1\r
00:00:01,000 --> 00:00:02,000\r
[Alice] Hello there,\r
how are you?\r
\r
2\r
00:00:02.500 --> 00:00:03,000 X1:10 X2:20\r
Fine. [pause:200ms] [Bob|seed:4] Thanks.\r
\r
\r
3
00:00:03,000 --> 01:02:03,456
The end.
"""


def tone(seconds: float, hz: float = 220.0, sign: float = 1.0) -> Audio:
    """Never zero and of one sign, so where it lies in the assembled audio can be read back
    (give clips that may touch opposite signs)."""
    t = torch.arange(round(seconds * RATE)) / RATE
    return Audio((sign * (0.5 + 0.2 * torch.sin(2 * math.pi * hz * t))).unsqueeze(0), RATE)


def clips(*seconds: float) -> list[Audio]:
    return [tone(s, sign=(-1) ** i) for i, s in enumerate(seconds)]


def spans(audio: Audio) -> list[tuple[float, float]]:
    """(start, end) in ms of each run of non-zero samples of one sign."""
    sign = torch.sign(audio.waveform[0])
    change = torch.nonzero(torch.diff(sign)).flatten() + 1
    bounds = [0, *change.tolist(), sign.shape[0]]
    return [(a * 1000 / RATE, b * 1000 / RATE) for a, b in zip(bounds, bounds[1:]) if sign[a] != 0]


def assert_srt_matches_audio(placed: Placed) -> None:
    cues = parse_srt(placed.srt)
    assert cues == placed.cues
    found = spans(placed.audio)
    assert len(found) == len(cues)
    for cue, (start, end) in zip(cues, found):
        assert abs(cue.start_ms - start) <= 1 and abs(cue.end_ms - end) <= 1, (cue, start, end)


def test_srt_text_is_read_with_its_variants_and_written_back() -> None:
    cues = parse_srt(SRT)
    assert cues == (Cue(1, 1000, 2000, "[Alice] Hello there,\nhow are you?"),
                    Cue(2, 2500, 3000, "Fine. [pause:200ms] [Bob|seed:4] Thanks."),
                    Cue(3, 3000, 3723456, "The end."))
    assert parse_srt(format_srt(cues)) == cues
    assert format_srt(cues).startswith("1\n00:00:01,000 --> 00:00:02,000\n[Alice] Hello there,\nhow are you?\n\n2\n")


def test_each_cue_is_spoken_by_its_character_and_subtitle_line_breaks_do_not_end_a_turn() -> None:
    first, second, _ = parse_srt(SRT)
    assert cue_script(first, ["Alice"]).items == (Line("Hello there, how are you?", "Alice"),)
    assert [i.source_line for i in cue_script(second, ["Bob"]).items] == [2, 2, 2]
    assert cue_script(second, ["Bob"]).lines[1] == Line("Thanks.", "Bob", seed=4)
    with pytest.raises(ScriptError, match=r"cue 1, \[Alice\]: no character named 'Alice' \(known: Bob\)"):
        cue_script(first, ["Bob"])
    with pytest.raises(ScriptError, match="cue 7: nothing to speak"):
        cue_script(Cue(7, 0, 1000, "[pause:1s]"))


def test_a_file_is_read_and_its_errors_name_it(tmp_path: Path) -> None:
    path = tmp_path / "talk.srt"
    path.write_text(SRT, encoding="utf-8")
    assert read_srt(path) == parse_srt(SRT)
    with pytest.raises(ScriptError, match="subtitle file not found: .*missing.srt"):
        read_srt(tmp_path / "missing.srt")
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ScriptError, match="talk.srt: cannot be read as UTF-8"):
        read_srt(path)
    path.write_text("1\n00:00:01,000 --> 00:00:00,500\nHi\n", encoding="utf-8")
    with pytest.raises(ScriptError, match=r"talk.srt: cue 1: it ends"):
        read_srt(path)


def cue_text(number: int, times: str, text: str = "Hi.") -> str:
    return f"{number}\n{times}\n{text}\n\n"


@pytest.mark.parametrize(("text", "message"), [
    (cue_text(1, "00:00:02,000 --> 00:00:03,000") + cue_text(2, "00:00:01,000 --> 00:00:01,500"),
     r"cue 2: it starts \(00:00:01,000\) before cue 1 \(00:00:02,000\); cues must be in time order"),
    (cue_text(1, "00:00:01,000 --> 00:00:03,000") + cue_text(2, "00:00:02,000 --> 00:00:04,000"),
     r"cue 2: it starts \(00:00:02,000\) before cue 1 ends \(00:00:03,000\); cues must not overlap"),
    (cue_text(4, "00:00:01,000 --> 00:00:01,000"), r"cue 4: it ends \(00:00:01,000\) at or before its start"),
    (cue_text(5, "00:00:61,000 --> 00:01:02,000"), r"cue 5: its second line must be 'HH:MM:SS,mmm --> HH:MM:SS,mmm'"),
    (cue_text(6, "0:0:1,5 --> 0:0:2,0"), r"cue 6: its second line must be"),
    (cue_text(7, "00:00:01,000 -> 00:00:02,000"), r"cue 7: its second line must be"),
    ("8\n00:00:01,000 --> 00:00:02,000\n", r"cue 8: no text"),
    ("9\n", r"cue 9: its second line must be .*got nothing"),
    ("\n\nHello\n00:00:01,000 --> 00:00:02,000\nHi\n", r"the cue at line 3: its first line must be the cue number"),
    ("\n \n", r"the subtitles hold no cue"),
])
def test_bad_subtitles_are_one_error_naming_the_cue(text: str, message: str) -> None:
    with pytest.raises(ScriptError, match=message):
        parse_srt(text)


CUES = (Cue(1, 1000, 2000, "a"), Cue(2, 2500, 3000, "b"), Cue(3, 3000, 4000, "c"), Cue(4, 6000, 6500, "d"))


def test_pad_keeps_the_audio_and_pushes_later_cues_back_by_an_overrun() -> None:
    # cue 2 runs 1.2 s from 2.5 s: 700 ms past cue 3's start; cue 3 (0.5 s) ends at 4.2 s,
    # before cue 4, which is on time again.
    spoken = clips(0.8, 1.2, 0.5, 0.3)
    placed = place_cues(CUES, spoken, "pad")
    assert [(c.start_ms, c.end_ms) for c in placed.cues] == [(1000, 1800), (2500, 3700), (3700, 4200), (6000, 6300)]
    assert [r.shift_ms for r in placed.report] == [0, 0, 700, 0]
    assert [r.stretch for r in placed.report] == [1.0] * 4
    assert placed.audio.waveform.shape[-1] == round(6.5 * RATE)  # to the last cue's end
    assert torch.equal(placed.audio.waveform[:, RATE:RATE + spoken[0].waveform.shape[-1]], spoken[0].waveform)
    assert_srt_matches_audio(placed)
    assert "cue 3: 00:00:03,700 --> 00:00:04,200 (cue 00:00:03,000 --> 00:00:04,000, spoken 500 ms): pushed back " \
           "700 ms by the cues before it" in placed.report_text()
    assert placed.report_text().startswith("timing pad: 4 cues, 0 time-stretched, the furthest pushed back 700 ms")


def test_times_off_the_sample_grid_stay_within_a_millisecond() -> None:
    cues = (Cue(1, 1001, 1999, "a"), Cue(2, 2333, 2777, "b"))
    placed = place_cues(cues, clips(0.4123, 0.0417), "pad")
    assert_srt_matches_audio(placed)


@needs_librosa
def test_fit_stretches_each_line_to_its_cue_within_the_bound_keeping_pitch() -> None:
    # cue 1 (1 s): 0.8 s stretched to fit; cue 2 (0.5 s): 1.2 s would need x0.42, the bound
    # (1.5) gives 0.8 s and pushes cue 3 back 300 ms; cue 3 (1 s) gets 0.75 s -> 1 s; cue 4 untouched.
    spoken = [tone(0.8, 440), *clips(1.2, 0.75, 0.5)]
    placed = place_cues(CUES, spoken, "fit", max_stretch=1.5)
    assert [(c.start_ms, c.end_ms) for c in placed.cues] == [(1000, 2000), (2500, 3300), (3300, 4300), (6000, 6500)]
    assert [round(r.stretch, 4) for r in placed.report] == [1.25, round(1 / 1.5, 4), round(1 / 0.75, 4), 1.0]
    assert [r.shift_ms for r in placed.report] == [0, 0, 300, 0]
    assert_srt_matches_audio(placed)
    first = placed.audio.waveform[0, RATE:2 * RATE]
    assert torch.equal(first, time_stretch(spoken[0].waveform, RATE)[0])
    spectrum = torch.fft.rfft(first - first.mean()).abs()
    assert abs(int(spectrum.argmax()) - 440) <= 2  # 1 s of audio: bin = Hz; a resample would give 352 Hz
    assert "time-stretched x1.250, pitch kept" in placed.report_text()


@needs_librosa
def test_natural_uses_the_gap_then_shortens_within_the_bound_then_shifts() -> None:
    cues = (Cue(1, 0, 1000, "a"), Cue(2, 2000, 2500, "b"), Cue(3, 3000, 3500, "c"), Cue(4, 3700, 4000, "d"))
    # 1: 1.5 s runs into the gap before cue 2 (2 s of room): untouched. 2: 1.2 s for 1 s of room:
    # shortened to 1 s. 3: 0.9 s for 0.7 s of room needs x0.78 > bound 1/1.2: shortened to 0.75 s,
    # pushing cue 4 back 50 ms. 4: the last cue, 0.2 s: never lengthened.
    spoken = clips(1.5, 1.2, 0.9, 0.2)
    placed = place_cues(cues, spoken, "natural", max_stretch=1.2)
    assert [(c.start_ms, c.end_ms) for c in placed.cues] == [(0, 1500), (2000, 3000), (3000, 3750), (3750, 3950)]
    assert [r.shift_ms for r in placed.report] == [0, 0, 0, 50]
    assert [round(r.stretch, 4) for r in placed.report] == [1.0, round(1 / 1.2, 4), round(0.75 / 0.9, 4), 1.0]
    assert torch.equal(placed.audio.waveform[:, :spoken[0].waveform.shape[-1]], spoken[0].waveform)
    assert placed.audio.waveform.shape[-1] == 4 * RATE
    assert_srt_matches_audio(placed)


def test_pad_never_needs_librosa_and_fit_without_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "librosa", None)
    assert place_cues(CUES[:1], [tone(2.0)], "pad").report[0].stretch == 1.0
    assert place_cues(CUES[:1], [tone(0.3)], "natural").report[0].stretch == 1.0  # nothing to shorten
    with pytest.raises(ScriptError, match=r"librosa, which is not installed \(pip install librosa\)"):
        place_cues(CUES[:1], [tone(0.5)], "fit")


def test_placing_refuses_what_it_cannot_use() -> None:
    with pytest.raises(ScriptError, match="timing must be one of pad, fit, natural, got 'stretch'"):
        place_cues(CUES[:1], [tone(1)], "stretch")  # type: ignore[arg-type]
    for bound in (0.5, float("nan"), "2"):
        with pytest.raises(ScriptError, match="max_stretch must be a finite number >= 1"):
            place_cues(CUES[:1], [tone(1)], "fit", max_stretch=bound)  # type: ignore[arg-type]
    with pytest.raises(ScriptError, match="2 cues but 1 audio clips"):
        place_cues(CUES[:2], [tone(1)])
    with pytest.raises(ScriptError, match="cue 2: 1 channel\\(s\\) at 16000 Hz, cue 1 has 1 at 24000 Hz"):
        place_cues(CUES[:2], [tone(1), Audio(torch.ones(1, 10), 16000)])
    with pytest.raises(ScriptError, match="cue 1: its audio is empty"):
        place_cues(CUES[:1], [Audio(torch.ones(1, 0), RATE)])


def test_a_scripts_audio_is_its_lines_in_order_with_pauses_as_silence() -> None:
    script = parse_script("[Alice] One. [pause:250ms] Two.\n[pause:1s]", ["Alice"])
    one, two = tone(0.1), tone(0.2, sign=-1)
    audio = join(script, [one, two])
    assert audio.waveform.shape[-1] == round(0.1 * RATE) + round(0.25 * RATE) + round(0.2 * RATE) + RATE
    assert [(round(a), round(b)) for a, b in spans(audio)] == [(0, 100), (350, 550)]
    assert torch.equal(audio.waveform[:, round(0.35 * RATE):round(0.55 * RATE)], two.waveform)
    with pytest.raises(ScriptError, match="2 spoken lines but 1 audio clips"):
        join(script, [one])
    with pytest.raises(ScriptError, match=r"line 1 \('Two.'\): 1 channel\(s\) at 16000 Hz, the first line has 1 at "
                                          "24000 Hz"):
        join(script, [one, Audio(torch.ones(1, 5), 16000)])
    with pytest.raises(ScriptError, match="no spoken line"):
        join(parse_script("[pause:1s]"), [])
