"""Import cycles in a package: every import statement, lazy ones (inside functions) and
`if TYPE_CHECKING:` ones included, as a graph of modules; its strongly connected components
of more than one module are the cycles (issue 32).

    python tools/import_cycles.py [package_dir] [--no-typing] [--depth N]

Reads the source only (an AST walk): nothing is imported. Relative imports are resolved
against the importing module; `from pkg import name` is an edge to `pkg.name` when that is a
module, else to `pkg`. Importing `a.b` is not counted as importing `a` (as import-linter
counts it), so a package's `__init__` is in a cycle only through its own imports. With
`--depth N` modules are taken together by their first N name parts (`--depth 2`: the package's
subpackages and top-level modules), which shows cycles between subpackages such as
`engines` -> `training` -> `engines` that no two single modules close.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    kind: str  # "top" (at import time), "lazy" (inside a function), "typing" (under TYPE_CHECKING)


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the package directory `root`."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement with its kind, walking into functions and TYPE_CHECKING blocks."""

    def walk(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, kind
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, "typing" if kind == "typing" else "lazy")
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), "typing")
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), kind)
            else:
                yield from walk(child, kind)

    yield from walk(tree, "top")


def edges(known: dict[str, Path]) -> list[Edge]:
    """The package's imports of its own modules (one edge per statement and target)."""
    out: dict[Edge, None] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, kind in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for target in targets:
                while target and target not in known:  # `import a.b.c` of a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    out[Edge(name, target, node.lineno, kind)] = None
    return list(out)


def cycles(names: list[str], graph: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    succ: dict[str, list[str]] = {n: [] for n in names}
    for e in graph:
        succ[e.source].append(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in names:
        if start in index:
            continue
        work = [(start, iter(succ[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(succ[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def group(name: str, depth: int) -> str:
    """`name`'s first `depth` parts (all of it for 0)."""
    return ".".join(name.split(".")[:depth]) if depth else name


def find(package: Path, *, depth: int = 0, typing: bool = True) -> tuple[list[list[str]], list[Edge]]:
    """The import cycles in `package` (modules taken together by `depth`, imports under
    TYPE_CHECKING counted with `typing`), and the imports that close them."""
    known = modules(package.resolve())
    graph = [e for e in edges(known) if typing or e.kind != "typing"]
    across = [e for e in graph if group(e.source, depth) != group(e.target, depth)]
    names = list(dict.fromkeys(group(n, depth) for n in known))
    found = cycles(names, [dataclasses.replace(e, source=group(e.source, depth), target=group(e.target, depth))
                           for e in across])
    members = {m for c in found for m in c}
    closing = [e for e in across if group(e.source, depth) in members and group(e.target, depth) in members]
    return found, sorted(closing, key=lambda e: (e.source, e.line, e.target))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", default=str(Path(__file__).parent.parent / "mizuoto_runtime"))
    parser.add_argument("--no-typing", action="store_true", help="leave out imports under TYPE_CHECKING")
    parser.add_argument("--depth", type=int, default=0, help="take modules together by their first N name parts")
    args = parser.parse_args(argv)
    found, closing = find(Path(args.package), depth=args.depth, typing=not args.no_typing)
    for component in found:
        print(f"cycle of {len(component)} modules: {', '.join(component)}")
        for e in closing:
            if group(e.source, args.depth) in component:
                print(f"    {e.source}:{e.line} -> {e.target} ({e.kind})")
    print(f"{len(found)} cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
