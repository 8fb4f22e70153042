"""`mizuoto say` with scripts and subtitles: tagged text (or ``--script FILE``), named voices
(``--voice-dir``, ``--character NAME=WAV[:TRANSCRIPT]``), ``--srt FILE --timing`` and the
progress bar a terminal shows.

Text with a ``[`` or a ``Speaker N:`` line is read as a script (write ``\\[`` for a literal
bracket); other text is spoken exactly as before. Tags name characters given by ``--character``
or by a voice of the ``--voice-dir`` library; the node's own voice (``--voice``, ``--speaker``,
...) speaks the text before any tag.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...audio import Audio
from ...engines.voice_store import VoicePromptStore
from ...errors import ArgumentError
from .runner import CharacterVoice
from .subtitles import TIMINGS, read_srt
from .syntax import Script, ScriptError, check_character_name, looks_like_script, parse_script
from .voices import VoiceLibrary

if TYPE_CHECKING:
    from ...engines.base import Engine, Sampling
    from ..runtime import Runtime

#: Where prompted voices are kept inside a voice library folder.
CACHE_FOLDER = ".cache"
Progress = Callable[[int, int], None]


def add_arguments(say: argparse.ArgumentParser) -> None:
    """The script and subtitle flags of `mizuoto say`."""
    say.add_argument("--script", metavar="FILE", help="speak a script file: [Name] switches the voice to the end "
                                                      "of its line, [pause:1.5s] inserts silence, [seed:N] seeds "
                                                      "the next line")
    say.add_argument("--voice-dir", metavar="DIR", help="a voice library: NAME.wav with NAME.txt (its transcript); "
                                                        "[NAME] tags speak with these voices, and prompted voices "
                                                        f"are kept in DIR/{CACHE_FOLDER}")
    say.add_argument("--voice-cache", metavar="DIR", help="keep prompted voices here across runs (default: "
                                                          f"DIR/{CACHE_FOLDER} of --voice-dir, else not kept)")
    say.add_argument("--character", action="append", default=[], metavar="NAME=WAV[:TRANSCRIPT]",
                     help="a character's voice: a reference WAV and, after a colon, its transcript (repeatable)")
    say.add_argument("--srt", metavar="FILE", help="speak a subtitle file, each cue at its time; the adjusted "
                                                   "SRT is written beside the WAV")
    say.add_argument("--timing", default="pad", choices=TIMINGS,
                     help="with --srt: pad (silence, overruns push later cues back), fit (time-stretch each "
                          "line to its cue), natural (use the gap, then stretch, then shift)")
    say.add_argument("--max-stretch", type=float, default=1.5, help="with --timing fit or natural: the most a "
                                                                    "line is sped up or slowed down (x)")


def wants_script(args: argparse.Namespace) -> bool:
    """Whether `say` speaks a script: a file, subtitles, or text with a tag or a ``Speaker N:`` line."""
    return bool(args.script or args.srt or (args.text is not None and looks_like_script(args.text)))


def script_text(args: argparse.Namespace) -> str:
    """The text `say` speaks: the argument or ``--script``'s file (one, not both)."""
    if args.script and args.text is not None:
        raise ArgumentError("give the text or --script FILE, not both")
    if args.srt and (args.script or args.text is not None):
        raise ArgumentError("--srt speaks the subtitle file: give no text or --script with it")
    if args.srt and adjusted_srt(Path(args.output)).resolve() == Path(args.srt).resolve():
        raise ArgumentError(f"the adjusted subtitles would overwrite {args.srt}: write the WAV under another name")
    if args.script:
        return _read_text(Path(args.script), "script")
    if args.text is None and not args.srt:
        raise ArgumentError("give the text to speak, --script FILE or --srt FILE")
    return args.text or ""


def adjusted_srt(output: Path) -> Path:
    """Where ``--srt`` writes the subtitles at their actual times: beside the WAV, as NAME.srt."""
    return output.with_suffix(".srt")


def prompt_store(args: argparse.Namespace) -> VoicePromptStore | None:
    folder = args.voice_cache or (Path(args.voice_dir) / CACHE_FOLDER if args.voice_dir else None)
    return VoicePromptStore(folder) if folder else None


def character_voices(args: argparse.Namespace, own: CharacterVoice) -> dict[str | None, CharacterVoice]:
    """Every voice a tag may name: the library's, then ``--character``'s (which win); None: `own`."""
    voices: dict[str | None, CharacterVoice] = {}
    if args.voice_dir:
        library = VoiceLibrary([args.voice_dir])
        for name in library.names():
            try:
                check_character_name(name)
            except ScriptError:
                continue  # a name no tag can spell (a subfolder's "a/b" can): not a character
            audio, transcript = library.load(name)
            voices[name] = CharacterVoice(audio, transcript)
    for spec in args.character:
        name, audio, transcript = parse_character(spec)
        voices[name] = CharacterVoice(audio, transcript)
    voices[None] = own
    return voices


def parse_character(spec: str) -> tuple[str, Audio, str | None]:
    """``NAME=WAV[:TRANSCRIPT]``: the WAV is the longest prefix before a colon that is a file
    (so Windows drive letters and colons inside the transcript both work)."""
    name, sep, value = spec.partition("=")
    if not sep or not name.strip() or not value:
        raise ArgumentError(f"--character expects NAME=WAV[:TRANSCRIPT], got {spec!r}")
    name = check_character_name(name.strip())
    path, transcript = Path(value), None
    for i in (i for i, ch in enumerate(value) if ch == ":"):
        if Path(value[:i]).is_file():
            path, transcript = Path(value[:i]), value[i + 1:].strip() or None
    if not path.is_file():
        raise ArgumentError(f"--character {name}: reference file {path} does not exist")
    from ..training.dataset import load_audio  # reads WAV, and FLAC/OGG where soundfile is installed

    return name, load_audio(path), transcript


def speak(rt: Runtime, engine: Engine, args: argparse.Namespace, text: str, voices: dict[str | None, CharacterVoice],
          sampling: Sampling, output: Path, allow_fallback: bool | None) -> tuple[Audio, dict[str, Any]]:
    """The script's (or the subtitle track's) audio, and what the report adds to `say`'s: the
    request's meta, the lines from the cache, and with ``--srt`` the adjusted SRT's path and
    the per-cue report."""
    characters = [name for name in voices if name is not None]
    with progress_bar() as on_progress:
        if args.srt:
            cues = read_srt(args.srt)
            placed = rt.speak_subtitles(engine, cues, voices, sampling, args.timing, args.max_stretch,
                                        allow_fallback=allow_fallback, on_progress=on_progress)
            srt = adjusted_srt(output)
            try:
                srt.write_text(placed.srt, encoding="utf-8")
            except OSError as exc:
                raise ArgumentError(f"cannot write the subtitle file {srt}: {exc}") from exc
            return placed.audio, {"srt": str(srt), "cues": [r.describe() for r in placed.report],
                                  **placed.meta}
        script: Script = parse_script(text, characters)
        spoken = rt.speak_script(engine, script, voices, sampling, allow_fallback=allow_fallback,
                                 on_progress=on_progress)
    return spoken.audio, {"lines": len(script.lines), "from_cache": spoken.from_cache, **spoken.meta}


@contextmanager
def progress_bar() -> Iterator[Progress | None]:
    """A tqdm bar on stderr when both stdout and stderr are a terminal and tqdm is installed (it
    is in ComfyUI's environment, not in the core install); None (silent) otherwise."""
    if not (sys.stdout.isatty() and sys.stderr.isatty()) or importlib.util.find_spec("tqdm") is None:
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=0, unit="step", leave=False, file=sys.stderr) as bar:
        def update(done: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.refresh()

        yield update


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ArgumentError(f"cannot read the {what} file {path}: {exc}") from exc
