"""Errors the runtime raises: each names the thing at fault (setting key, file, tensor)."""
from __future__ import annotations


class MizuotoError(Exception):
    """Base class of every error the runtime raises on purpose."""


class SettingError(MizuotoError, ValueError):
    """A `compute.*` / `engines.*` setting has an unknown key, a wrong type or a bad value (M10)."""


class StrictDeviceError(MizuotoError, RuntimeError):
    """A weight was used where it is not placed, on the simulated strict device (M56)."""


class CheckpointError(MizuotoError, ValueError):
    """A checkpoint is missing, has the wrong layout, or its tensors do not match the model (M27)."""


class CancelledError(MizuotoError):
    """The request was cancelled (interrupt) between streamed copies or while waiting for VRAM."""
