"""Scripts: tagged text with characters, pauses and seeds (`syntax`), a script's audio from its
lines' (`assemble`), subtitles and their timing (`subtitles`), the in-memory cache of spoken
lines (`segments`), voices kept by name (`voices`: a folder of named references, and the
on-disk store of prompted voices), and the keys both caches share (`keys`).

The application layer above the engines: it uses the engine protocol, audio and errors, and
never imports ComfyUI.
"""
from __future__ import annotations

from .syntax import Line, Pause, Script, ScriptError, parse_script

__all__ = ["Line", "Pause", "Script", "ScriptError", "parse_script"]
