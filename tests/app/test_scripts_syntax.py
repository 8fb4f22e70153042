"""Script text (issue 33, item 1): character tags, pauses, seeds, escapes, every refused input,
and a round trip of 1,000 random scripts."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mizuoto_runtime.app.scripts.syntax import (
    PAUSE_MAX_SECONDS,
    SEED_MAX,
    Line,
    Pause,
    Script,
    ScriptError,
    escape,
    parse_script,
)

CAST = ("Alice", "Bob", "Narrator")


def parse(text: str) -> Script:
    return parse_script(text, CAST)


def test_text_before_any_tag_is_the_nodes_own_voice_and_a_tag_holds_to_the_end_of_its_line() -> None:
    script = parse("Hello there.\n[Alice] Hi! [Bob] Yo.\nBack to the node.\n\n[alice]  Case  does not matter. ")
    assert script.items == (Line("Hello there."), Line("Hi!", "Alice"), Line("Yo.", "Bob"),
                            Line("Back to the node."), Line("Case  does not matter.", "Alice"))
    assert [line.source_line for line in script.lines] == [1, 2, 2, 3, 5]
    assert script.characters() == [None, "Alice", "Bob"]


def test_language_prefixes() -> None:
    assert parse("[de:Alice] Hallo.\n[fr:] Bonjour.\n[pt-BR:bob] Olá.").items == (
        Line("Hallo.", "Alice", "de"), Line("Bonjour.", None, "fr"), Line("Olá.", "Bob", "pt-BR"))


@pytest.mark.parametrize(("tag", "seconds"), [
    ("[pause:1.5s]", 1.5), ("[pause:300ms]", 0.3), ("[pause:2]", 2.0), ("[wait:1]", 1.0), ("[STOP:0.25s]", 0.25),
    ("[Pause: 1s ]", 1.0), (f"[pause:{PAUSE_MAX_SECONDS:g}]", PAUSE_MAX_SECONDS)])
def test_pauses(tag: str, seconds: float) -> None:
    script = parse(f"[Alice] One. {tag} Two.")
    assert script.items == (Line("One.", "Alice"), Pause(seconds), Line("Two.", "Alice"))
    assert script.items[1].source_line == 1


def test_a_pause_on_its_own_line_and_between_a_tag_and_its_text() -> None:
    assert parse("One.\n[pause:1s]\n[Bob] [pause:500ms] Two.").items == (
        Line("One."), Pause(1.0), Pause(0.5), Line("Two.", "Bob"))


def test_seeds_set_the_next_spoken_line_only() -> None:
    script = parse(f"[seed:7] One. Two [Bob|seed:{SEED_MAX}] Three.\n[seed:0]\n[Alice] Four. Five.\n"
                   "[seed:3] [pause:1s] [Alice] Six.")
    assert script.items == (Line("One. Two", seed=7), Line("Three.", "Bob", seed=SEED_MAX),
                            Line("Four. Five.", "Alice", seed=0),
                            Pause(1.0), Line("Six.", "Alice", seed=3))
    assert parse("[SEED:5|de:Alice] Hallo.").items == (Line("Hallo.", "Alice", "de", 5),)


def test_escapes_give_literal_brackets_and_backslashes() -> None:
    script = parse(r"[Alice] Press \[Enter\] or \\ then C:\path")
    assert script.items == (Line(r"Press [Enter] or \ then C:\path", "Alice"),)
    assert escape(r"a[b]\c") == r"a\[b\]\\c"
    assert parse(escape(r"a[b]\c")).items == (Line(r"a[b]\c"),)


@pytest.mark.parametrize(("text", "message"), [
    ("Hi.\n[Carol] Hello.", r"line 2, \[Carol\]: no character named 'Carol' \(known: Alice, Bob, Narrator\)"),
    ("[pause:abc]", r"line 1, \[pause:abc\]: a pause is written like"),
    ("a [pause:] b", r"line 1, \[pause:\]: a pause is written like"),
    ("[wait:1.5min]", r"line 1, \[wait:1.5min\]: a pause is written like"),
    ("[pause:-1s]", r"line 1, \[pause:-1s\]: a pause is written like"),
    ("[pause:0]", r"line 1, \[pause:0\]: a pause lasts more than 0"),
    ("[pause:61s]", r"line 1, \[pause:61s\]: a pause lasts more than 0 and at most 60 s"),
    (f"[seed:{SEED_MAX + 1}] Hi.", rf"line 1, \[seed:{SEED_MAX + 1}\]: seed {SEED_MAX + 1} is outside 0\.\."),
    ("[seed:-1] Hi.", r"line 1, \[seed:-1\]: seed -1 is outside"),
    ("[Alice|seed:x] Hi.", r"line 1, \[Alice\|seed:x\]: a seed is a whole number"),
    ("[seed:1] [seed:2] Hi.",
     r"line 1, \[seed:2\]: a second seed before a spoken line \(the first: line 1, \[seed:1\]\)"),
    ("[seed:1|seed:2] Hi.", r"more than one seed in one tag"),
    ("Hi.\n[seed:4]", r"line 2, \[seed:4\]: no spoken line after this seed"),
    ("[Alice]\nHi.", r"line 1, \[Alice\]: no text after it on its line"),
    ("[Alice] [Bob] Hi.", r"line 1, \[Alice\]: no text before the next character tag"),
    ("[Alice|temp:0.5] Hi.", r"line 1, \[Alice\|temp:0.5\]: 'temp:0.5' is not a parameter"),
    ("[Alice:angry] Hi.", r"line 1, \[Alice:angry\]: 'Alice' is not a language code"),
    ("[de:Alice:sad] Hi.", r"at most a language and a character"),
    ("[de:Carol] Hi.", r"no character named 'Carol'"),
    ("[pause:1s|seed:2] Hi.", r"line 1, \[pause:1s\|seed:2\]: a pause tag stands alone"),
    ("Hi [Alice", r"line 1: a '\[' that is not closed on its line"),
    ("Hi\n a] b", r"line 2: a '\]' with no '\[' before it"),
    ("[Al[ice] b", r"line 1: a '\[' inside a tag"),
])
def test_bad_input_is_one_error_naming_the_line_and_the_tag(text: str, message: str) -> None:
    with pytest.raises(ScriptError, match=message):
        parse(text)


def test_bad_character_names_are_refused() -> None:
    for name in ("", " Alice", "A:B", "a|b", "x]", "Seed", "pause", "two\nlines"):
        with pytest.raises(ScriptError, match="cannot be written in a tag|reserved tag word"):
            parse_script("Hi.", [name])
    with pytest.raises(ScriptError, match="differ only in case"):
        parse_script("Hi.", ["Alice", "ALICE"])
    with pytest.raises(ScriptError, match=r"known: none"):
        parse_script("[Alice] Hi.")


def test_items_refuse_values_no_text_can_spell() -> None:
    for bad in ("", " padded", "two\nlines", "x\u2028y"):
        with pytest.raises(ScriptError, match="one line without surrounding spaces"):
            Line(bad)
    with pytest.raises(ScriptError, match="outside"):
        Line("hi", seed=-1)
    with pytest.raises(ScriptError, match="language"):
        Line("hi", language="deutsch")
    with pytest.raises(ScriptError, match="a pause lasts"):
        Pause(0.0)
    with pytest.raises(ScriptError, match="cannot be written in a tag"):
        Line("hi", "A|B")


# ---- round trip --------------------------------------------------------------------------------

_WORD = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=24)
_TEXT = _WORD.map(str.strip).filter(lambda t: bool(t) and t.splitlines() == [t])
_LINE = st.builds(Line, _TEXT, st.sampled_from((None, *CAST)),
                  st.sampled_from((None, "de", "en", "pt-BR", "zh")), st.none() | st.integers(0, SEED_MAX))
_PAUSE = st.builds(Pause, st.floats(min_value=1e-6, max_value=PAUSE_MAX_SECONDS, allow_nan=False))
_SCRIPT = st.builds(Script, st.lists(_LINE | _PAUSE, max_size=12).map(tuple))


@settings(max_examples=1000, derandomize=True, deadline=None)
@given(_SCRIPT)
def test_a_script_written_as_text_parses_back_to_itself(script: Script) -> None:
    text = script.to_text()
    again = parse(text)
    assert again == script
    assert [item.source_line for item in again.items] == list(range(1, len(script.items) + 1))
