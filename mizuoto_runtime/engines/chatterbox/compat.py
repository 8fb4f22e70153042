"""resemble-perth (Chatterbox's watermarker) on setuptools >= 81, which no longer ships
`pkg_resources`.

``perth.perth_net`` finds its packaged model folder with ``pkg_resources.resource_filename``;
where that module is missing, ``import perth`` swallows the ImportError and leaves
``perth.PerthImplicitWatermarker`` None, and Chatterbox (ours and upstream's) cannot be built:
the case in current ComfyUI environments (setuptools 84 in the v0.8.0 lab). While Chatterbox's
package is imported, a stand-in `pkg_resources` answers that one call the way setuptools did
(the folder inside the installed package); nothing else is given, and nothing stays behind.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path

WATERMARKER_MODULE = "perth.perth_net.perth_net_implicit.perth_watermarker"


def resource_filename(package: str, resource: str) -> str:
    """`pkg_resources.resource_filename` for a resource folder inside an installed package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{package} is not an installed package")
    return str(Path(list(spec.submodule_search_locations)[0]) / resource)


@contextlib.contextmanager
def pkg_resources_stand_in() -> Iterator[None]:
    """A `pkg_resources` with `resource_filename` only, where setuptools no longer has one."""
    try:
        present = sys.modules.get("pkg_resources") is not None or importlib.util.find_spec("pkg_resources") is not None
    except ValueError:  # an entry of None in sys.modules: not importable
        present = False
    if present:
        yield
        return
    before = sys.modules.get("pkg_resources", ...)
    module = types.ModuleType("pkg_resources")
    module.resource_filename = resource_filename  # type: ignore[attr-defined]
    sys.modules["pkg_resources"] = module
    try:
        yield
    finally:
        if before is ...:
            sys.modules.pop("pkg_resources", None)
        else:
            sys.modules["pkg_resources"] = before


def import_perth() -> None:
    """Import perth with its watermarker, also where it was imported before without one."""
    with pkg_resources_stand_in():
        perth = importlib.import_module("perth")
        if perth.PerthImplicitWatermarker is None:
            perth.PerthImplicitWatermarker = importlib.import_module(WATERMARKER_MODULE).PerthImplicitWatermarker
