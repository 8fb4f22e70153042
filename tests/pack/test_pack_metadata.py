"""What ComfyUI-Manager and the registry read of the pack: the root requirements.txt (safe to
install into ComfyUI's environment), pyproject's `[tool.comfy]` and the files it names; and
the rule that nothing a user reads cites a requirement ID."""
from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]
REQUIREMENT_ID = re.compile(r"\bM\d{1,2}\b")
#: Packages a pack must never install into ComfyUI's environment: the user's are the ones to use.
NEVER = {"torch", "torchvision", "torchaudio", "transformers", "tokenizers", "huggingface-hub", "accelerate"}
#: ComfyUI's own lower bounds (its requirements.txt, v0.3.64 and v0.8.0): ours must not exceed them.
COMFYUI_HAS = {"numpy": (1, 25), "safetensors": (0, 4, 2), "psutil": (0,)}


def requirements() -> list[str]:
    lines = (REPO / "requirements.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def test_requirements_txt_installs_nothing_comfyui_lacks_and_pins_nothing() -> None:
    found = {}
    for line in requirements():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:>=([0-9.]+))?", line)
        assert match, f"requirements.txt: {line!r} is not 'name' or 'name>=version' (no pins, no upper bounds, no URLs)"
        name = match.group(1).lower().replace("_", "-")
        assert name not in NEVER, f"requirements.txt must not install {name}"
        found[name] = tuple(int(x) for x in (match.group(2) or "0").split("."))
    assert set(found) == set(COMFYUI_HAS), found
    for name, lower in found.items():
        assert lower <= COMFYUI_HAS[name], f"{name}>={lower} asks more than ComfyUI's own {COMFYUI_HAS[name]}"


def test_pyproject_is_complete_for_the_registry() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["name"] == "comfyui-mizuoto"
    comfy = project["tool"]["comfy"]
    assert comfy["PublisherId"] and comfy["DisplayName"] == "Mizuoto TTS"
    assert set(comfy["includes"]) == {"web", "example_workflows"}
    assert all((REPO / folder).is_dir() for folder in comfy["includes"])
    assert "web" not in comfy, "a [tool.comfy] web key makes ComfyUI serve the extension a second time"
    icon = REPO / comfy["Icon"]
    data = icon.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width == height <= 400, (width, height)  # the registry's rule: square, at most 400 px


def test_every_template_has_its_thumbnail() -> None:
    templates = sorted((REPO / "example_workflows").glob("*.json"))
    assert len(templates) >= 5
    for workflow in templates:
        thumbnail = workflow.with_suffix(".jpg")  # the name ComfyUI's template browser asks for
        assert thumbnail.is_file() and thumbnail.read_bytes()[:3] == b"\xff\xd8\xff", thumbnail.name


def test_the_readme_points_only_at_files_a_clone_has() -> None:
    readme = (REPO / "README.md").read_text()
    assert "../shared" not in readme
    for target in re.findall(r"\]\((?!https?://|#)([^)]+)\)", readme):
        assert (REPO / target).exists(), f"README links to {target}, which a clone does not have"
    for path in re.findall(r"`((?:requirements|tools|tests|web|example_workflows|mizuoto_runtime|nodes)"
                           r"/[^`* ]+)`", readme):
        assert (REPO / path).exists() or "<" in path, f"README names {path}, which a clone does not have"


LOG_CALLS = {"debug", "info", "warning", "error", "exception", "critical"}
#: Calls whose every string a user reads: a node's shown text and progress text.
SHOWN = {"PreviewText", "send_progress_text"}
USER_KEYWORDS = {"tooltip", "description", "display_name", "help"}


def _strings(node: ast.AST, constants: dict[str, str]) -> list[str]:
    found = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    found += [constants[n.id] for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in constants]
    return found


def user_strings(path: Path) -> list[tuple[int, str]]:
    """Strings a user reads: log messages, error messages, `--help`, and node tooltips,
    descriptions and display names (module-level string constants they use included)."""
    tree = ast.parse(path.read_text())
    constants = {t.id: "".join(_strings(n.value, {})) for n in tree.body if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        parts: list[ast.AST] = [k.value for k in node.keywords if k.arg in USER_KEYWORDS]
        if name in LOG_CALLS or name in SHOWN or name.endswith(("Error", "Failed")) or name == "add_argument":
            parts += [*node.args, *(k.value for k in node.keywords)]
        found += [(node.lineno, text) for part in parts for text in _strings(part, constants)]
    return found


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO)) for folder in ("mizuoto_runtime", "nodes")
                                        for p in (REPO / folder).rglob("*.py")) + ["__init__.py"])
def test_nothing_a_user_reads_cites_a_requirement_id(path: str) -> None:
    leaks = [(line, text) for line, text in user_strings(REPO / path) if REQUIREMENT_ID.search(text)]
    assert not leaks, f"{path}: requirement IDs in what users read: {leaks}"


def test_the_id_check_can_fail(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('TIP = "retry (M40)"\nlog.info("placed (M35)")\nInput("x", tooltip=TIP)\n'
                      'raise MizuotoError(f"bad {x} (M7)")\n# a comment may cite M1\n"""So may M2 a docstring."""\n'
                      'raise TrainingFailed("ended (M60)")\nui.PreviewText("peak (M63)")\n')
    assert [line for line, text in user_strings(sample) if REQUIREMENT_ID.search(text)] == [2, 3, 4, 7, 8]


def _helps(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    """`--help` of `parser` and of every subcommand under it, by command line."""
    yield parser.prog, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _helps(sub)


def test_no_help_text_cites_a_requirement_id() -> None:
    """What `mizuoto --help` and every subcommand's `--help` print (`train` included), as argparse
    renders it: the AST check above sees literal strings only."""
    from mizuoto_runtime.app.cli import _parser

    helps = dict(_helps(_parser()))
    assert {"mizuoto say", "mizuoto train", "mizuoto runtime", "mizuoto doctor"} <= set(helps)
    assert "training.memory" in helps["mizuoto train"]
    leaks = {prog: REQUIREMENT_ID.findall(text) for prog, text in helps.items() if REQUIREMENT_ID.search(text)}
    assert not leaks, leaks


def test_the_templates_are_the_ones_tools_templates_builds() -> None:
    """Every example workflow is one of tools/templates.py's graphs (so it is rebuilt when the
    nodes change), named by the readable title the template browser shows."""
    spec = importlib.util.spec_from_file_location("templates_tool", REPO / "tools" / "templates.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert sorted(p.stem for p in (REPO / "example_workflows").glob("*.json")) == sorted(tool.GRAPHS)
    for title in tool.GRAPHS:
        assert re.fullmatch(r"[A-Z][\w ,.()-]+ - [\w ,.()-]+", title) and "_" not in title, title
