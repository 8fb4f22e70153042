"""The text frontend's data files (``data/*.txt``): word lists, character tables and the English
dictionary taken from upstream as data, each file's header naming its source, commit and licence.

A file holds named lists: a line ``[name]`` starts one, every other line is one entry (a word, or
two fields apart by a space), and ``#`` starts a comment line. A missing or malformed file is an
error naming it.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"


@cache
def lists(name: str) -> dict[str, tuple[str, ...]]:
    """The lists of ``data/<name>``, entries in file order."""
    return read_lists(DATA / name)


def read_lists(path: Path) -> dict[str, tuple[str, ...]]:
    """The lists of the data file `path`, entries in file order."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise FileNotFoundError(f"the GPT-SoVITS text data file {path} cannot be read: {exc}") from exc
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = found.setdefault(line[1:-1], [])
        elif current is None:
            raise ValueError(f"{path}:{number}: an entry before any [list] line")
        else:
            current.append(line)
    return {key: tuple(entries) for key, entries in found.items()}


def entries(name: str, key: str) -> tuple[str, ...]:
    """The list `key` of ``data/<name>``."""
    found = lists(name)
    if key not in found:
        raise ValueError(f"{DATA / name} has no [{key}] list (it has {sorted(found)})")
    return found[key]
