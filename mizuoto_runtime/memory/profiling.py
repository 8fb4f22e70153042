"""Labels in a standard PyTorch profiler trace, so it shows what the runtime did (issue 32).

`torch.profiler.profile` records `record_function` ranges by name. The runtime labels its
phases (``mizuoto::phase (talker)``, `phases.py`), placements (``mizuoto::load
(qwen3tts:talker)``, ``mizuoto::partially_unload``, ``mizuoto::offload``, ``mizuoto::unload``,
`handle.py`) and every streamed unit's copy to the device (``mizuoto::copy
(talker.layers.3)``, made when the unit is entered; ``mizuoto::copy_ahead``, made ahead in
the learned order; `streamer.py`). A label covers what the host does there: on a GPU a copy's
range is the time to queue it, and the copy itself is the memcpy beside it in the trace.

Cheap when no profiler runs: one check, no string formatted (a copy is labelled per unit and
step), and no `record_function`, whose own enter and exit cost more than the check.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.autograd import _profiler_enabled

_OFF = contextlib.nullcontext()  # reusable: entering it does nothing


def label(what: str, *names: str) -> contextlib.AbstractContextManager[Any]:
    """A `record_function` range named ``what (names joined by dots)`` while a profiler runs;
    else a context that does nothing."""
    if not _profiler_enabled():
        return _OFF
    return torch.profiler.record_function(f"{what} ({'.'.join(names)})" if names else what)
