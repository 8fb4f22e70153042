"""Same seed, same bytes (issue 31): every tiny checkpoint `mizuoto tiny-checkpoint` writes, in
every version and type it offers, is byte-identical when written twice with one seed, into
folders of other names and from other states of the global random generators (torch, numpy,
random): each weight comes from the seed, and nothing else (a path, a thread count, the
caller's RNG) reaches the files."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from mizuoto_runtime.app.cli import main
from mizuoto_runtime.engines import ENGINES, engine_class

from conftest import require_engine

TENSOR_FILES = (".pth", ".pt", ".bin", ".ckpt")


def cases() -> list[tuple[str, tuple[str, ...]]]:
    """(engine, command-line options): each version of an engine that has versions (each
    Qwen3-TTS model type, as `--type` names it), and every other engine with a writer once."""
    out: list[tuple[str, tuple[str, ...]]] = []
    for engine in ENGINES:
        cls = engine_class(engine)
        if cls.TINY is None:
            continue
        flag = "--type" if engine == "qwen3tts" else "--version"
        out += [(engine, (flag, v)) for v in cls.VERSIONS] if cls.VERSIONS else [(engine, ())]
    return out


def write_twice(tmp_path: Path, engine: str, options: tuple[str, ...]) -> tuple[Path, Path]:
    """The two writes also run at 1 and 2 intra-op threads: a writer that calibrates its output
    with a forward pass must not let the thread count round its weights."""
    folders = (tmp_path / "first", tmp_path / "second")
    threads = torch.get_num_threads()
    try:
        for state, folder in enumerate(folders, start=1):
            torch.manual_seed(state)
            np.random.seed(state)
            random.seed(state)
            torch.set_num_threads(state)
            assert main(["tiny-checkpoint", str(folder), "--engine", engine, *options, "--seed", "3"]) == 0
    finally:
        torch.set_num_threads(threads)
    return folders


def tensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint file, by flattened key (to name the ones that differ)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, obj: object) -> None:
        if isinstance(obj, torch.Tensor):
            flat[prefix] = obj
        elif isinstance(obj, dict):
            for key, value in obj.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)

    walk("", torch.load(path, map_location="cpu", weights_only=True))
    return flat


def differences(first: Path, second: Path) -> list[str]:
    """Each file that differs between the two folders (or is in one only); for a checkpoint file,
    the tensors that differ in it."""
    names = sorted({str(p.relative_to(f)) for f in (first, second) for p in f.rglob("*") if p.is_file()})
    out = []
    for name in names:
        a, b = first / name, second / name
        if not (a.is_file() and b.is_file()):
            out.append(f"{name}: written once only")
        elif a.read_bytes() != b.read_bytes():
            keys = ""
            if a.suffix in (*TENSOR_FILES, ".safetensors"):
                ta, tb = tensors(a), tensors(b)
                keys = ": " + ", ".join(k for k in sorted(ta.keys() | tb.keys())
                                        if k not in ta or k not in tb or not torch.equal(ta[k], tb[k]))
            out.append(f"{name}{keys}")
    return out


@pytest.mark.parametrize("engine, options", cases(), ids=lambda v: "-".join(v) if isinstance(v, tuple) else v)
def test_same_seed_same_bytes(engine: str, options: tuple[str, ...], tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    require_engine(engine)
    first, second = write_twice(tmp_path, engine, options)
    assert any(first.rglob("*")), f"{engine} wrote nothing"
    assert differences(first, second) == []

