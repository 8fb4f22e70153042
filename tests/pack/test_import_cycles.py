"""tools/import_cycles.py, and no import cycle anywhere in the package, between modules or between
its subpackages (issue 32): every import statement counts, lazy ones inside functions and
`if TYPE_CHECKING:` ones included."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("import_cycles", REPO / "tools" / "import_cycles.py")
assert spec is not None and spec.loader is not None
import_cycles = importlib.util.module_from_spec(spec)
sys.modules["import_cycles"] = import_cycles  # its dataclasses look their module up
spec.loader.exec_module(import_cycles)

def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_lazy_and_type_checking_imports_close_cycles(tmp_path: Path) -> None:
    package = write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from .b import x\n",
        "pkg/b.py": "def f():\n    from . import a\n",  # lazy
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import y\n",
        "pkg/d.py": "import pkg.c\n",
        "pkg/e.py": "from .a import x\n",  # imports into a cycle, is not in one
        "pkg/sub/__init__.py": "from ..f import z\n",
        "pkg/f.py": "from .sub.g import w\n",
        "pkg/sub/g.py": "",
    })
    found, closing = import_cycles.find(package)
    assert found == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]
    assert {(e.source, e.target) for e in closing} == {("pkg.a", "pkg.b"), ("pkg.b", "pkg.a"), ("pkg.c", "pkg.d"),
                                                        ("pkg.d", "pkg.c")}
    assert import_cycles.find(package, typing=False)[0] == [["pkg.a", "pkg.b"]]
    edges = {(e.source, e.target): e.kind for e in import_cycles.edges(import_cycles.modules(package))}
    assert edges[("pkg.b", "pkg.a")] == "lazy" and edges[("pkg.c", "pkg.d")] == "typing"
    assert ("pkg.f", "pkg.sub.g") in edges and ("pkg.sub", "pkg.f") in edges  # importing a.b is not importing a
    assert ["pkg.f", "pkg.sub"] in import_cycles.find(package, depth=2)[0]  # subpackages taken together


def test_no_import_cycle_remains() -> None:
    assert import_cycles.find(REPO / "mizuoto_runtime")[0] == []
    assert import_cycles.find(REPO / "mizuoto_runtime", depth=2)[0] == []
