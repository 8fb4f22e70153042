"""Importing an engine's upstream package without its console noise.

Upstream TTS packages announce, at import time, optional parts a user cannot act on: Qwen3-TTS
prints a flash-attn banner, its `sox` dependency warns (and its shell complains) that the SoX
program is missing although 12 Hz models never call it, and its config classes log "... is None.
Initializing ... with default values" at INFO on every load. Run on transformers 5.x, its 4.57
code also draws transformers' notices about itself: "[ERROR] ... is part of ...'s signature, but
not documented" (printed while its classes are defined) and deprecation warnings each time a
config is built. Inside ComfyUI that fills the console on every first run, with lines a user
reads as failures of a run that succeeded. `quiet_import` drops exactly the noise an engine
names and lets everything else through: other output printed during the import is written to
stderr afterwards (stdout stays clean for the CLI's JSON), warnings and errors of the named
loggers still appear, and a Python warning is dropped only for the message and the module
named (`WarningNoise`); `drop_noise` installs the same filters for an engine whose package is
imported piece by piece.
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
import warnings
from collections.abc import Iterator
from types import ModuleType

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class WarningNoise:
    """One Python warning an upstream package draws: dropped only where all three match."""

    category: type[Warning]
    #: How the message starts (text, not a pattern).
    message: str
    #: The module that issues it (the warning's module as `warnings` sees it), exactly.
    module: str


#: `torch.jit.script` on torch 2.10+: F5-TTS's `x_transformers` and VoxCPM's audio VAE decorate
#: functions with it at import time; scripting happens upstream, nothing to act on here.
TORCH_JIT_SCRIPT = WarningNoise(FutureWarning, "`torch.jit.script` is deprecated", "torch.jit._script")


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
    #: Python warnings dropped, from the import on (some come later, when a config is built).
    warnings: tuple[WarningNoise, ...] = ()


class _DropRecords(logging.Filter):
    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).lstrip().startswith(self.starts)


def drop_noise(noise: ImportNoise) -> None:
    """Install `noise`'s filters on the loggers and warnings it names (idempotent)."""
    _quiet_loggers(noise)
    for item in noise.warnings:
        # `filterwarnings` replaces an identical filter rather than adding a second one.
        warnings.filterwarnings("ignore", message=re.escape(item.message), category=item.category,
                                module=re.escape(item.module) + r"\Z")


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
    # The blank lines a removed banner leaves before what is kept.
    return re.sub(r"\A([ \t]*\n)+", "", text) if text.strip() else ""


def quiet_import(name: str, noise: ImportNoise) -> ModuleType:
    """Import `name` (once per process, as any import), dropping `noise` and nothing else."""
    drop_noise(noise)  # also when imported already: some of the noise comes after the import
    if name in sys.modules:
        return sys.modules[name]
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


__all__ = ["TORCH_JIT_SCRIPT", "ImportNoise", "WarningNoise", "drop_noise", "quiet_import"]
