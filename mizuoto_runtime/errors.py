"""Errors the runtime raises: each names the thing at fault (setting key, file, tensor)."""
from __future__ import annotations

import torch


class MizuotoError(Exception):
    """Base class of every error the runtime raises on purpose."""


class SettingError(MizuotoError, ValueError):
    """A `compute.*` / `engines.*` setting has an unknown key, a wrong type or a bad value (M10)."""


class ArgumentError(MizuotoError, ValueError):
    """A request or a runtime call got a value it cannot use (empty text, max_new_tokens < 1, a
    missing file, a negative working-memory estimate); the message names the argument."""


class DeviceTooSmallError(MizuotoError, torch.OutOfMemoryError):
    """A component's minimum working set (M16) is larger than the whole device: no placement and
    no retry can run it (M7). Still an out-of-memory error, so hosts free memory as after one."""


class StrictDeviceError(MizuotoError, RuntimeError):
    """A weight was used where it is not placed, on the simulated strict device (M56)."""


class CheckpointError(MizuotoError, ValueError):
    """A checkpoint is missing, has the wrong layout, or its tensors do not match the model (M27)."""


class CancelledError(MizuotoError):
    """The request was cancelled (interrupt) between streamed copies or while waiting for VRAM."""


def json_kind(value: object) -> str:
    """A parsed JSON value named as JSON names it, for messages ("a list", "null")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)
