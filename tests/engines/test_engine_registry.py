"""The one engine registry (issue 32 item 1): every package under `engines/` is an engine named
after it, and its class declares the rest (requirements, versions, tiny-checkpoint writer,
reference stages, LoRA adapter). A new package registers itself with no other file changed;
the engine ids saved workflows name keep loading."""
from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mizuoto_runtime.engines import ENGINES, engine_class

REPO = Path(__file__).resolve().parents[2]
ENGINES_DIR = REPO / "mizuoto_runtime" / "engines"
# The engine ids of the previous release (fd27ba2): workflows saved with it name these.
PREVIOUS_RELEASE = {"demo", "dummy", "qwen3tts", "voxcpm2", "f5tts", "omnivoice", "fishspeech", "cosyvoice",
                    "gptsovits", "indextts2"}


def test_the_registry_is_the_engine_packages() -> None:
    packages = {p.parent.name for p in ENGINES_DIR.glob("*/__init__.py")}
    assert set(ENGINES) == packages
    for engine_id in ENGINES:
        cls = engine_class(engine_id)
        assert cls.id == engine_id and cls.__module__ == f"mizuoto_runtime.engines.{engine_id}.engine"


@pytest.mark.parametrize("engine_id", sorted(ENGINES))
def test_each_engine_declares_what_its_package_has(engine_id: str) -> None:
    cls = engine_class(engine_id)
    package = ENGINES_DIR / engine_id
    assert (cls.TINY is not None) == (package / "tiny.py").is_file()
    assert (cls.REFERENCE is not None) == (package / "reference.py").is_file()
    assert all(isinstance(v, str) for v in cls.VERSIONS)
    if cls.REQUIREMENTS is not None:
        assert (REPO / "requirements" / f"{cls.REQUIREMENTS}.txt").is_file()
    if cls.TINY is not None:  # one name, one signature; read without importing the writer's upstream package
        tree = ast.parse((package / f"{cls.TINY}.py").read_text(encoding="utf-8"))
        write = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "write")
        assert [a.arg for a in write.args.args] == ["directory"]
        assert [a.arg for a in write.args.kwonlyargs][:3] == ["version", "seed", "dtype"]


def test_the_writers_signature() -> None:
    from mizuoto_runtime.engines.demo import tiny

    params = inspect.signature(tiny.write).parameters
    assert list(params) == ["directory", "version", "seed", "dtype"]
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in ("version", "seed", "dtype"))
    assert engine_class("demo").tiny_writer() is tiny.write


def test_saved_workflows_name_registered_engines() -> None:
    """The engine dropdown offers every id the previous release saved, and every template's."""
    assert PREVIOUS_RELEASE <= set(ENGINES)
    named = set()
    for template in (REPO / "example_workflows").glob("*.json"):
        for node in json.loads(template.read_text(encoding="utf-8"))["nodes"]:
            if node["type"] == "MizuotoEngineLoader":
                named.add(node["widgets_values"][0])
    assert named and named <= set(ENGINES)


def test_only_lora_engines_take_a_lora() -> None:
    assert [e for e in ENGINES if engine_class(e).LORA is not None] == ["qwen3tts"]


TOY_ENGINE = '''
"""A throwaway engine: the demo's model under another id, with two checkpoint versions."""
from ..demo.engine import DemoEngine


class ToyEngine(DemoEngine):
    id = "toy"
    title = "Toy"
    VERSIONS = ("a", "b")
    REFERENCE = "reference"
'''
TOY_TINY = '''
from pathlib import Path

import torch

from ..demo import tiny
from ..tiny import version_of
from .engine import ToyEngine


def write(directory: str | Path, *, version: str | None = None, seed: int = 0,
          dtype: torch.dtype | None = None) -> Path:
    folder = tiny.write(directory, seed=seed, dtype=dtype)
    (folder / "version.txt").write_text(version_of(version, ToyEngine.VERSIONS))
    return folder
'''
TOY_REFERENCE = '''
import torch

from ..reference import Check, Stage


def stages(ref):
    return [Stage("double", lambda: [Check("double.out.y", ref.tensor("double.in.x") * 2)])]
'''
RUN = '''
import json, sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from mizuoto_runtime.app.cli import main
from mizuoto_runtime.engines import ENGINES, engine_class

root = Path(sys.argv[1])
assert main(["tiny-checkpoint", "--engine", "toy", "--version", "b", str(root / "toy")]) == 0
assert main(["say", "Hello", "--engine", "toy", "--model", str(root / "toy"), "-o", str(root / "toy.wav")]) == 0
(root / "ref" / "ckpt").mkdir(parents=True)
save_file({"double.in.x": torch.ones(3), "double.out.y": torch.full((3,), 2.0)},
          str(root / "ref" / "reference.safetensors"))
(root / "ref" / "reference.json").write_text("{}")
checked = main(["check-reference", "--engine", "toy", str(root / "ref")])
print(json.dumps({"engines": list(ENGINES), "title": engine_class("toy").title, "checked": checked,
                  "version": (root / "toy" / "version.txt").read_text()}), file=sys.stderr)
'''


def test_a_new_engine_package_registers_itself(tmp_path: Path) -> None:
    """A copy of the package with one more engine folder and no other file changed: the CLI
    writes its tiny checkpoint, speaks with it and checks its reference stages."""
    copy = tmp_path / "src"
    shutil.copytree(REPO / "mizuoto_runtime", copy / "mizuoto_runtime", ignore=shutil.ignore_patterns("__pycache__"))
    toy = copy / "mizuoto_runtime" / "engines" / "toy"
    toy.mkdir()
    (toy / "__init__.py").write_text("")
    for name, code in {"engine": TOY_ENGINE, "tiny": TOY_TINY, "reference": TOY_REFERENCE}.items():
        (toy / f"{name}.py").write_text(textwrap.dedent(code))
    done = subprocess.run([sys.executable, "-c", RUN, str(tmp_path)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stderr.strip().splitlines()[-1])
    assert "toy" in seen["engines"] and "toy" not in ENGINES
    assert seen == {**seen, "title": "Toy", "checked": 0, "version": "b"}
    assert (tmp_path / "toy.wav").stat().st_size > 44
    assert importlib.util.find_spec("mizuoto_runtime.engines.toy") is None  # the repository is unchanged


def test_a_package_without_its_engine_class_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine package whose `engine` module defines no class of its id is one clear error."""
    from mizuoto_runtime import engines
    from mizuoto_runtime.errors import MizuotoError

    package = tmp_path / "mizuoto_runtime" / "engines" / "broken"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "engine.py").write_text("from ..demo.engine import DemoEngine\n\n\nclass Other(DemoEngine):\n"
                                       "    id = 'other'\n")
    monkeypatch.setattr(engines, "__path__", [*engines.__path__, str(package.parent)])
    monkeypatch.setattr(engines, "ENGINES", engines.discover())
    assert "broken" in engines.ENGINES
    try:
        with pytest.raises(MizuotoError, match="must define one Engine subclass with id = 'broken'"):
            engines.engine_class("broken")
    finally:
        for name in ("mizuoto_runtime.engines.broken.engine", "mizuoto_runtime.engines.broken"):
            sys.modules.pop(name, None)



def test_the_build_finds_every_package() -> None:
    """pyproject finds the packages (no list to extend): the wheel has every engine package."""
    setuptools = pytest.importorskip("setuptools")
    import tomllib

    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = set(setuptools.find_packages(str(REPO), include=find["include"]))
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "mizuoto_runtime").rglob("__init__.py")}
    assert found == on_disk and {f"mizuoto_runtime.engines.{e}" for e in ENGINES} <= found
