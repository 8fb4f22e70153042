"""Importing an engine's upstream package without its console noise.

Upstream TTS packages announce, at import time, optional parts a user cannot act on: Qwen3-TTS
prints a flash-attn banner, its `sox` dependency warns (and its shell complains) that the SoX
program is missing although 12 Hz models never call it, and its config classes log "... is None.
Initializing ... with default values" at INFO on every load. Inside ComfyUI that fills the
console on every first run. `quiet_import` drops exactly the noise an engine names and lets
everything else through: other output printed during the import is written to stderr
afterwards (stdout stays clean for the CLI's JSON), and warnings and errors of the named
loggers still appear.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ImportNoise:
    """The noise one upstream package makes when it is imported."""

    #: Text the import prints (on stdout, on stderr, or from a child process), dropped.
    output: tuple[re.Pattern[str], ...] = ()
    #: (logger name, message start) of log records dropped.
    records: tuple[tuple[str, str], ...] = ()
    #: Loggers whose INFO and DEBUG lines are dropped (their warnings and errors are kept),
    #: unless the host set a level on them itself.
    chatty_loggers: tuple[str, ...] = ()


class _DropRecords(logging.Filter):
    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).lstrip().startswith(self.starts)


def _quiet_loggers(noise: ImportNoise) -> None:
    by_logger: dict[str, tuple[str, ...]] = {}
    for name, start in noise.records:
        by_logger[name] = (*by_logger.get(name, ()), start)
    for name, starts in by_logger.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropRecords) and f.starts == starts for f in logger.filters):
            logger.addFilter(_DropRecords(starts))
    for name in noise.chatty_loggers:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


@contextlib.contextmanager
def _captured_fd(fd: int) -> Iterator[io.StringIO]:
    """What child processes write to `fd` while the block runs (the SoX check runs a shell)."""
    out = io.StringIO()
    try:
        saved = os.dup(fd)
    except OSError:  # no such descriptor (a GUI process): nothing to capture
        yield out
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield out
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            out.write(sink.read().decode(errors="replace"))


def _without(text: str, patterns: tuple[re.Pattern[str], ...]) -> str:
    for pattern in patterns:
        text = pattern.sub("", text)
    return text if text.strip() else ""


def quiet_import(name: str, noise: ImportNoise) -> ModuleType:
    """Import `name` (once per process, as any import), dropping `noise` and nothing else."""
    if name in sys.modules:
        return sys.modules[name]
    _quiet_loggers(noise)
    printed = io.StringIO()
    with contextlib.ExitStack() as stack:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError, OSError):
                stream.flush()
        child = stack.enter_context(_captured_fd(2))
        stack.enter_context(contextlib.redirect_stdout(printed))
        stack.enter_context(contextlib.redirect_stderr(printed))
        try:
            module = importlib.import_module(name)
        finally:
            stack.close()  # restore the streams before writing what is left
            rest = _without(printed.getvalue() + child.getvalue(), noise.output)
            if rest:
                sys.stderr.write(rest)
    log.debug("imported %s quietly", name)
    return module


__all__ = ["ImportNoise", "quiet_import"]
