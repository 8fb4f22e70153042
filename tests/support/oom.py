"""Where to inject an OOM (M40 tests): the counted allocations one engine phase makes."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from mizuoto_runtime import OomInjector, Runtime


@contextlib.contextmanager
def allocations_during(rt: Runtime, engine: object, method: str) -> Iterator[list[int]]:
    """Count `rt`'s device allocations; the yielded list ends up as the 1-based range of those
    made inside `engine.<method>` (e.g. the talker phase, `generate`) during the block."""
    counter = OomInjector(at=[])
    rt.devices.fault_hook = counter
    original = getattr(engine, method)
    span: list[int] = []

    def spy(*args: object, **kwargs: object) -> object:
        start = counter.count
        try:
            return original(*args, **kwargs)
        finally:
            span[:] = list(range(start + 1, counter.count + 1))

    setattr(engine, method, spy)
    try:
        yield span
    finally:
        setattr(engine, method, original)
        rt.devices.fault_hook = None
