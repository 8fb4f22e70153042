"""Scripts on an engine that speaks several voices in one pass (issue 34, item 3): each run of
lines between pauses is one dialogue (`Engine.generate_dialogue`), characters become the pass's
voices in order of first appearance, and what a pass cannot hold is refused naming the lines.

The engine here is the demo with a dialogue mode written for this test (each turn spoken in its
voice, one after another, from the pass's one generator), so the runner is tested on real
phases; the real multi-speaker engines test their own formatting against upstream."""
from __future__ import annotations

import collections
from collections.abc import Sequence

import pytest
import torch

from mizuoto_runtime import Runtime
from mizuoto_runtime.app.scripts.runner import CharacterVoice, speak_script, speak_subtitles
from mizuoto_runtime.app.scripts.segments import SegmentCache
from mizuoto_runtime.app.scripts.subtitles import parse_srt
from mizuoto_runtime.app.scripts.syntax import ScriptError, looks_like_script, parse_script
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines.base import Codes, Sampling, Turn, Voice
from mizuoto_runtime.engines.demo.engine import DemoEngine
from mizuoto_runtime.errors import ArgumentError
from mizuoto_runtime.memory.phases import RequestContext

SEED = 5
SAMPLING = Sampling(seed=SEED, max_new_tokens=12)


class DialogueDemo(DemoEngine):
    """The demo speaking up to two voices per pass: each turn's codes in its voice, in order."""

    VOICES_PER_PASS = 2
    calls: list[tuple[tuple[Turn, ...], tuple[str, ...]]]

    def generate_dialogue(self, ctx: RequestContext, turns: Sequence[Turn], voices: Sequence[Voice],
                          sampling: Sampling) -> Codes:
        self.calls.append((tuple(turns), tuple(v.key for v in voices)))
        parts = [self.generate(ctx, turn.text, voices[turn.voice], sampling).tokens for turn in turns]
        return Codes(torch.cat(parts, dim=1), self.id)


def reference(k: int) -> Audio:
    return Audio(torch.sin(torch.arange(4096) / (4.0 + k)).unsqueeze(0) * 0.3, 16000)


VOICES = {None: CharacterVoice(reference(0), "Narrator."), "Alice": CharacterVoice(reference(1), "Alice."),
          "Bob": CharacterVoice(reference(2), "Bob."), "Speaker 1": CharacterVoice(reference(3), "One.")}
NAMES = ["Alice", "Bob", "Speaker 1"]


def engine(settings: dict[str, object] | None = None) -> tuple[Runtime, DialogueDemo]:
    rt = Runtime(settings or {})
    demo = DialogueDemo(rt.manager)
    demo.calls = []
    return rt, demo


def direct(demo: DialogueDemo, rt: Runtime, turns: list[Turn], characters: list[str | None], seed: int) -> torch.Tensor:
    """The pass spoken by calling the engine's phases directly with the pass's seed."""
    ctx = rt.request(seed)
    voices = [demo.voice_prompt(ctx, VOICES[c].reference, VOICES[c].transcript) for c in characters]
    codes = demo.generate_dialogue(ctx, turns, voices, Sampling(seed=seed, max_new_tokens=12))
    return demo.decode(ctx, codes).waveform


def test_lines_between_pauses_are_one_pass_each_equal_to_calling_the_phases_directly() -> None:
    script = parse_script("[Alice] Hello Bob.\n[Bob] Hello Alice.\n[Alice] How are you?\n[pause:0.5s]\n"
                          "[Bob] Fine.\nAnd the narrator.", NAMES)
    rt, demo = engine()
    out = speak_script(rt, demo, script, VOICES, SAMPLING)
    assert len(out.lines) == 2 and [len(turns) for turns, _ in demo.calls] == [3, 2]
    first = [Turn(0, "Hello Bob."), Turn(1, "Hello Alice."), Turn(0, "How are you?")]
    assert demo.calls[0][0] == tuple(first)
    # The second pass's voices in order of first appearance: Bob, then the node's own voice.
    assert demo.calls[1][0] == (Turn(0, "Fine."), Turn(1, "And the narrator."))
    plain_rt, plain = engine()
    plain.calls = []
    assert torch.equal(out.lines[0].waveform, direct(plain, plain_rt, first, ["Alice", "Bob"], SEED))
    # A pass samples as its first line would alone: the script's seed + that line's index (3).
    second = direct(plain, plain_rt, [Turn(0, "Fine."), Turn(1, "And the narrator.")], ["Bob", None], SEED + 3)
    assert torch.equal(out.lines[1].waveform, second)
    pause = 8000  # 0.5 s at 16 kHz
    assert out.audio.waveform.shape[-1] == out.lines[0].waveform.shape[-1] + pause + second.shape[-1]
    assert torch.equal(out.audio.waveform[:, -second.shape[-1]:], second)


def test_speaker_lines_are_characters_and_the_pass_uses_their_voices() -> None:
    text = "Speaker 1: Good morning.\nAlice: is not a speaker form, the narrator says it."
    assert looks_like_script("Speaker 1: hi") and not looks_like_script("Plain words: no markup.")
    script = parse_script(text, NAMES)
    assert [line.character for line in script.lines] == ["Speaker 1", None]
    rt, demo = engine()
    speak_script(rt, demo, script, VOICES, SAMPLING)
    (turns, keys), = demo.calls
    assert turns == (Turn(0, "Good morning."), Turn(1, "Alice: is not a speaker form, the narrator says it."))
    assert keys == (demo.voice_prompt(rt.request(0), VOICES["Speaker 1"].reference, "One.").key,
                    demo.voice_prompt(rt.request(0), VOICES[None].reference, "Narrator.").key)


def test_more_characters_than_a_pass_takes_is_one_error_naming_the_lines() -> None:
    script = parse_script("[Alice] One.\n[Bob] Two.\nThree.\n[pause:1s]\n[Alice] Four.", NAMES)
    rt, demo = engine()
    with pytest.raises(ScriptError, match=r"lines 1-3: 3 voices .*Alice, Bob, the node's voice.* at most 2"):
        speak_script(rt, demo, script, VOICES, SAMPLING)
    assert demo.calls == [] and not rt.manager.events  # refused before any phase ran
    # The same characters with a pause between them: two passes, each within what one takes.
    fine = parse_script("[Alice] One.\n[Bob] Two.\n[pause:1s]\nThree.", NAMES)
    assert len(speak_script(rt, demo, fine, VOICES, SAMPLING).lines) == 2


def test_a_seed_or_a_language_inside_a_pass_is_refused() -> None:
    rt, demo = engine()
    with pytest.raises(ScriptError, match="line 2: .* only the pass's first line takes a seed"):
        speak_script(rt, demo, parse_script("[Alice] One.\n[Bob|seed:4] Two.", NAMES), VOICES, SAMPLING)
    with pytest.raises(ScriptError, match="line 2: one pass .* one language"):
        speak_script(rt, demo, parse_script("[Alice] One.\n[de:Bob] Zwei.", NAMES), VOICES, SAMPLING)
    seeded = speak_script(rt, demo, parse_script("[seed:77]\n[Alice] One.\n[Bob] Two.", NAMES), VOICES, SAMPLING)
    assert torch.equal(seeded.lines[0].waveform,
                       direct(demo, rt, [Turn(0, "One."), Turn(1, "Two.")], ["Alice", "Bob"], 77))


def test_a_pass_spoken_again_comes_from_the_line_cache() -> None:
    script = parse_script("[Alice] One.\n[Bob] Two.\n[pause:1s]\n[Alice] Three.", NAMES)
    rt, demo = engine()
    cache = SegmentCache()
    first = speak_script(rt, demo, script, VOICES, SAMPLING, cache=cache)
    edited = parse_script("[Alice] One.\n[Bob] Two.\n[pause:1s]\n[Alice] Three, edited.", NAMES)
    again = speak_script(rt, demo, edited, VOICES, SAMPLING, cache=cache)
    assert again.from_cache == 1 and len(demo.calls) == 3
    assert torch.equal(again.lines[0].waveform, first.lines[0].waveform)


def test_a_script_on_a_small_device_places_each_component_once_and_is_exact() -> None:
    script = parse_script("[Alice] One.\n[Bob] Two.\n[pause:1s]\n[Bob] Three.\n[Alice] Four.", NAMES)
    rt, demo = engine({"compute.simulate_vram_mb": 16})  # talker and decoder do not fit together
    small = speak_script(rt, demo, script, VOICES, SAMPLING)
    placed = collections.Counter(name for action, name, moved in rt.manager.events if action == "place" and moved)
    assert placed == {"demo:speaker_encoder": 1, "demo:talker": 1, "demo:decoder": 1}
    plain_rt, plain = engine()
    assert torch.equal(small.audio.waveform, speak_script(plain_rt, plain, script, VOICES, SAMPLING).audio.waveform)


def test_each_subtitle_cue_is_its_own_pass() -> None:
    srt = ("1\n00:00:00,000 --> 00:00:02,000\n[Alice] Hi.\n[Bob] Hello.\n\n"
           "2\n00:00:03,000 --> 00:00:05,000\n[Bob] Next cue.\n")
    rt, demo = engine()
    placed = speak_subtitles(rt, demo, parse_srt(srt), VOICES, SAMPLING)
    assert [turns for turns, _ in demo.calls] == [(Turn(0, "Hi."), Turn(1, "Hello.")), (Turn(0, "Next cue."),)]
    second = direct(demo, rt, [Turn(0, "Next cue.")], ["Bob"], SEED + 2)
    start = 3 * 16000
    assert torch.equal(placed.audio.waveform[:, start:start + second.shape[-1]], second.float())


def test_generate_dialogue_checks_its_turns_and_a_one_voice_engine_refuses_a_dialogue() -> None:
    rt, demo = engine()
    ctx = rt.request(0)
    voice = demo.voice_prompt(ctx, VOICES["Alice"].reference, "Alice.")
    with pytest.raises(ArgumentError, match="turn 1 names voice 1; the pass has voices 0..0"):
        demo.generate_dialogue(ctx, [Turn(1, "Hi.")], [voice], SAMPLING)
    with pytest.raises(ArgumentError, match="turn 2: text is empty"):
        demo.generate_dialogue(ctx, [Turn(0, "Hi."), Turn(0, "  ")], [voice], SAMPLING)
    with pytest.raises(ArgumentError, match="3 voices in one pass; this engine speaks at most 2"):
        demo.generate_dialogue(ctx, [Turn(0, "Hi.")], [voice] * 3, SAMPLING)
    with pytest.raises(ArgumentError, match="no turn"):
        demo.generate_dialogue(ctx, [], [voice], SAMPLING)
    one_voice = rt.engine("demo")
    with pytest.raises(Exception, match="speaks one voice per pass"):
        one_voice.generate_dialogue(ctx, [Turn(0, "Hi.")], [voice], SAMPLING)
    assert demo.calls == []
