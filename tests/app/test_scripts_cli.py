"""`mizuoto say` with scripts and subtitles (issue 33, item 7): tagged text and --script are
spoken phase by phase with each character's voice (--character, --voice-dir), --srt writes the
adjusted SRT beside the WAV, plain text is spoken exactly as before, and progress shows only on
a terminal."""
from __future__ import annotations

import importlib.util
import json
import wave
from pathlib import Path

import pytest
import torch

from mizuoto_runtime import Runtime
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.app.scripts import command
from mizuoto_runtime.app.scripts.runner import CharacterVoice
from mizuoto_runtime.app.scripts.subtitles import parse_srt
from mizuoto_runtime.app.scripts.syntax import parse_script
from mizuoto_runtime.app.scripts.voices import VoiceLibrary
from mizuoto_runtime.audio import Audio, read_wav, write_wav
from mizuoto_runtime.engines.base import Sampling

SMALL = "compute.simulate_vram_mb=16"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code = main(list(argv))
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def fails(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, *argv: str) -> str:
    assert main(list(argv)) == 2
    capsys.readouterr()
    return caplog.records[-1].getMessage()


def voice(k: int) -> Audio:
    return Audio(torch.sin(torch.arange(8000) / (4.0 + k)).unsqueeze(0) * 0.3, 16000)


@pytest.fixture
def wavs(tmp_path: Path) -> dict[str, Path]:
    paths = {name: tmp_path / f"{name}.wav" for name in ("alice", "bob")}
    for k, path in enumerate(paths.values()):
        write_wav(path, voice(k))
    return paths


def test_tagged_text_speaks_each_line_with_its_characters_voice(tmp_path: Path, wavs: dict[str, Path],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    text = "Hello.\n[Alice] Hi there.\n[pause:0.5s]\n[Bob] Good day."
    out = tmp_path / "dialogue.wav"
    result = run(capsys, "say", text, "-o", str(out), "--seed", "2", "--setting", SMALL,
                 "--character", f"Alice={wavs['alice']}:Hi there.", "--character", f"Bob={wavs['bob']}")
    assert result["lines"] == 3 and result["from_cache"] == 0
    placed = {name: c["placed"] for name, c in result["memory"]["components"].items()}
    assert placed == {"demo:speaker_encoder": 1, "demo:talker": 1, "demo:decoder": 1}  # grouped by phase

    rt = Runtime({"compute.simulate_vram_mb": 16})  # the same script through the runtime
    voices = {None: CharacterVoice(), "Alice": CharacterVoice(read_wav(wavs["alice"]), "Hi there."),
              "Bob": CharacterVoice(read_wav(wavs["bob"]))}
    same = rt.speak_script(rt.engine("demo"), parse_script(text, ["Alice", "Bob"]), voices, Sampling(seed=2))
    assert torch.equal(read_wav(out).waveform, read_wav(write_wav(tmp_path / "same.wav", same.audio)).waveform)


def test_a_script_file_and_a_voice_library(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    library = VoiceLibrary([tmp_path / "voices"])
    library.save("Narrator", voice(3), "A narrator.")
    script = tmp_path / "story.txt"
    script.write_text("[Narrator] Once upon a time.\n[seed:9]\n[narrator] The end.\n", encoding="utf-8")
    result = run(capsys, "say", "--script", str(script), "--voice-dir", str(tmp_path / "voices"),
                 "-o", str(tmp_path / "story.wav"))
    assert result["lines"] == 2
    assert len(list((tmp_path / "voices" / command.CACHE_FOLDER).glob("*.safetensors"))) == 1  # the prompt is kept
    assert library.names() == ["Narrator"]  # the cache folder holds no voice


def test_plain_text_is_spoken_exactly_as_before(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, "say", "Plain words, no tags.", "-o", str(tmp_path / "a.wav"), "--seed", "5")
    assert "lines" not in result
    rt = Runtime()
    audio, _ = rt.say(rt.engine("demo"), "Plain words, no tags.", sampling=Sampling(seed=5))
    assert (tmp_path / "a.wav").read_bytes() == write_wav(tmp_path / "b.wav", audio).read_bytes()


@pytest.mark.parametrize("timing", ["pad", "fit", "natural"])
def test_srt_writes_the_adjusted_subtitles_beside_the_wav(tmp_path: Path, wavs: dict[str, Path], timing: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    if timing != "pad":
        pytest.importorskip("librosa")
    srt = tmp_path / "track.srt"
    srt.write_text("1\n00:00:00,000 --> 00:00:00,400\nHello.\n\n"
                   "2\n00:00:00,500 --> 00:00:01,500\n[Alice] Hi.\n", encoding="utf-8")
    out = tmp_path / "spoken.wav"
    result = run(capsys, "say", "--srt", str(srt), "--timing", timing, "-o", str(out),
                 "--character", f"Alice={wavs['alice']}", "--max-new-tokens", "12")
    assert result["srt"] == str(out.with_suffix(".srt"))
    written = parse_srt(out.with_suffix(".srt").read_text(encoding="utf-8"))
    assert [c.text for c in written] == ["Hello.", "[Alice] Hi."]
    assert len(result["cues"]) == 2 and result["cues"][1].startswith(f"cue 2: {_stamp(written[1].start_ms)}")
    with wave.open(str(out)) as f:
        seconds = f.getnframes() / f.getframerate()
    assert written[-1].end_ms / 1000 <= seconds + 0.001


def _stamp(ms: int) -> str:
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d},{ms % 1000:03d}"


def test_the_adjusted_srt_never_overwrites_its_source(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    srt = tmp_path / "track.srt"
    srt.write_text("1\n00:00:00,000 --> 00:00:01,000\nHello.\n", encoding="utf-8")
    message = fails(capsys, caplog, "say", "--srt", str(srt), "-o", str(tmp_path / "track.wav"))
    assert "overwrite" in message and srt.read_text(encoding="utf-8").startswith("1\n")


def test_bad_script_input_is_one_error_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    assert "Carol" in fails(capsys, caplog, "say", "[Carol] Hi.", "-o", str(tmp_path / "x.wav"))
    assert "--character" in fails(capsys, caplog, "say", "[Carol] Hi.", "--character", "Carol")
    assert "does not exist" in fails(capsys, caplog, "say", "[Carol] Hi.", "--character", "Carol=/no/such.wav")
    assert "not both" in fails(capsys, caplog, "say", "Hi.", "--script", str(tmp_path / "s.txt"))
    assert "give the text" in fails(capsys, caplog, "say")


def test_a_transcript_may_hold_colons(wavs: dict[str, Path]) -> None:
    name, _, transcript = command.parse_character(f"Alice={wavs['alice']}:Note: it works.")
    assert (name, transcript) == ("Alice", "Note: it works.")


def test_progress_shows_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    with command.progress_bar() as on_progress:  # pytest captures both streams: not a terminal
        assert on_progress is None
    monkeypatch.setattr("sys.stdout.isatty", lambda: True, raising=False)
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    find_spec = importlib.util.find_spec
    with monkeypatch.context() as without:  # a terminal, but no tqdm (the core install): silent
        without.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tqdm" else find_spec(name, *a))
        with command.progress_bar() as on_progress:
            assert on_progress is None
    pytest.importorskip("tqdm")
    with command.progress_bar() as on_progress:
        assert on_progress is not None
        on_progress(3, 10)
