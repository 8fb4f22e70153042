"""Compiled modules above streamed units run eagerly while those units stream (M23).

A compiled graph (`torch.compile(module)`, `module.compile()`) would hold the weights it was
compiled with, so a compiled module whose subtree holds a streamed unit runs eagerly while
that unit streams, and compiles again when the component is whole. The copy engine applies
this after each placement (`transfer.BufferedCopyEngine.placed`). A compiled *function*
wrapping a component cannot be seen from the handle; engines must not compile across streamed
units that way.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from .units import Unit

log = logging.getLogger(__name__)

Restore = Callable[[], None]  # undoes one change


def _optimized_module_type() -> type | None:
    # Without torch._dynamo imported no module can have been compiled; don't import it (slow).
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", None) if eval_frame else None


def run_compiled_eagerly(root: nn.Module, streamed: Sequence[Unit]) -> list[Restore]:
    """Make every compiled module whose subtree holds a streamed unit run eagerly (M23).

    `torch.compile(module)` wraps it in an `OptimizedModule` whose `forward` is the compiled
    call; `module.compile()` sets `_compiled_call_impl`. Both are switched to the eager call;
    the returned callables switch them back (when the component is whole again).
    """
    hooked = {id(m) for u in streamed for m in [u.module, *u.leaves]}
    optimized = _optimized_module_type()
    restores: list[Restore] = []
    for module in root.modules():
        if optimized is not None and isinstance(module, optimized):
            compiled = module.__dict__.get("forward")
            if compiled is None or not _holds(module, hooked):
                continue
            original = module._orig_mod
            assert isinstance(original, nn.Module)
            module.forward = original.__call__
            restores.append(_setter(module, "forward", compiled))
        elif module._compiled_call_impl is not None and _holds(module, hooked):
            compiled_call = module._compiled_call_impl
            module._compiled_call_impl = None
            restores.append(_setter(module, "_compiled_call_impl", compiled_call))
    if restores:
        log.info("%d compiled module(s) above streamed units run eagerly while they stream", len(restores))
    return restores


def _holds(module: nn.Module, hooked: set[int]) -> bool:
    return any(id(m) in hooked for m in module.modules())


def _setter(module: nn.Module, attr: str, value: Any) -> Restore:
    return lambda: setattr(module, attr, value)
