"""Scripts: tagged text with characters, pauses and seeds (`syntax`), subtitles and their timing
(`subtitles`), the in-memory cache of spoken lines (`segments`), and voices kept by name
(`voices`: a folder of named references, and the on-disk cache of prompted voices).

The application layer above the engines: it uses the engine protocol, audio and errors, and
never imports ComfyUI.
"""
from __future__ import annotations

from .syntax import Line, Pause, Script, ScriptError, parse_script

__all__ = ["Line", "Pause", "Script", "ScriptError", "parse_script"]
