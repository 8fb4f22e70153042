"""tools/engine_env.py: engines install without moving what an environment has (issue 14 item 1).

The whole path (a ComfyUI environment, every engine, the check) runs in tools/install.sh, which
.ci/run runs; these tests pin down the rules it applies.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from conftest import missing_requirement

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("engine_env", REPO / "tools" / "engine_env.py")
assert spec is not None and spec.loader is not None
engine_env = importlib.util.module_from_spec(spec)
spec.loader.exec_module(engine_env)


def test_constraints_keep_what_is_installed_and_pin_what_is_missing(tmp_path: Path) -> None:
    pins = tmp_path / "pins.txt"
    pins.write_text("# tested\ntransformers==5.24.0\nlibrosa==0.11.0  # comment\nTyping_Extensions==4.16.0\n")
    have = {"transformers": "5.30.1", "typing-extensions": "4.12.0", "numpy": "2.4.6"}
    lines = engine_env.constraints(pins, have)
    assert "transformers==5.30.1" in lines and "transformers==5.24.0" not in lines  # the user's version wins
    assert "typing-extensions==4.12.0" in lines and not any(line.startswith("Typing") for line in lines)
    assert "librosa==0.11.0" in lines and "numpy==2.4.6" in lines
    pins.write_text("librosa>=0.10\n")
    with pytest.raises(SystemExit, match="not an exact pin"):
        engine_env.constraints(pins, have)


def test_a_pin_for_an_older_python_travels_with_its_marker(tmp_path: Path) -> None:
    pins = tmp_path / "pins.txt"
    pins.write_text('budoux==0.10.1; python_version >= "3.11"\nBudoux==0.9.0 ; python_version < "3.11"  # why\n')
    assert engine_env.constraints(pins, {}) == ['budoux==0.10.1; python_version >= "3.11"',
                                                'budoux==0.9.0; python_version < "3.11"']
    assert engine_env.constraints(pins, {"budoux": "0.8.0"}) == ["budoux==0.8.0"]  # the user's version wins


def test_changes_are_removals_and_other_versions_not_additions() -> None:
    before = {"transformers": "5.24.0", "tokenizers": "0.23.3", "numpy": "2.4.6"}
    after = {"transformers": "4.57.3", "numpy": "2.4.6", "librosa": "0.11.0"}
    assert engine_env.changes(before, after) == ["removed tokenizers==0.23.3", "changed transformers 5.24.0 -> 4.57.3"]
    assert engine_env.changes(before, {**before, "librosa": "0.11.0"}) == []


def test_pip_check_lines_must_be_accepted_by_a_requirements_file(tmp_path: Path) -> None:
    req = tmp_path / "engine.txt"
    req.write_text("#! pip-check-accepts: f5-tts requires wandb\n#! pip-check-accepts: qwen-tts has requirement "
                   "transformers==4.57.3\nf5-tts==1.1.22\n")
    accepts = engine_env.accepted([req])
    check = ("f5-tts 1.1.22 requires wandb, which is not installed.\n"
             "qwen-tts 0.1.1 has requirement transformers==4.57.3, but you have transformers 5.24.0.\n"
             "librosa 0.11.0 requires scikit-learn, which is not installed.\n")
    assert engine_env.unaccepted(check, accepts) == ["librosa 0.11.0 requires scikit-learn, which is not installed."]
    assert engine_env.unaccepted("No broken requirements found.\n", accepts) == []


def test_snapshot_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "before.txt"
    path.write_text("numpy==2.4.6\ntyping_extensions==4.16.0\n#pip-check torch 2.14.1 has requirement setuptools>=77\n")
    packages, checks = engine_env.read_snapshot(path)
    assert packages == {"numpy": "2.4.6", "typing-extensions": "4.16.0"}
    assert checks == ["torch 2.14.1 has requirement setuptools>=77"]
    assert engine_env.main(["snapshot"]) == 0  # this environment: runs and prints


# Where the pack may be installed: every environment marker of the engine files is checked on each.
PLATFORMS = [{"sys_platform": system, "platform_system": name, "platform_machine": machine,
              "python_version": python, "python_full_version": f"{python}.0"}
             for system, name, machines in (("linux", "Linux", ("x86_64", "aarch64")),
                                            ("win32", "Windows", ("AMD64",)), ("darwin", "Darwin", ("arm64", "x86_64")))
             for machine in machines for python in ("3.10", "3.11", "3.12", "3.13", "3.14")]


def requirement_lines(path: Path) -> list[tuple[str, str]]:
    """(normalized name, environment marker or "") of each requirement of a requirements file."""
    lines = (raw.split("#", 1)[0].strip() for raw in path.read_text().splitlines())
    return [(engine_env.normalize(re.split(r"[=<>!~\[ ;]", line, maxsplit=1)[0]), line.partition(";")[2].strip())
            for line in lines if line]


def applies(marker: str, platform: dict[str, str]) -> bool:
    from packaging.markers import Marker  # pytest's own dependency

    return not marker or Marker(marker).evaluate(platform)


def test_every_requirement_has_a_tested_pin() -> None:
    """A package an engine file names but constraints-engines.txt does not pin would be installed
    at whatever version pip finds newest on a machine that lacks it: wherever a requirement's
    marker holds (``pynini==2.1.6; sys_platform == "linux" ...``), a pin of it holds too."""
    pins = {name: [line.partition(";")[2].strip() for line in lines]
            for name, lines in engine_env.read_pins(REPO / "constraints-engines.txt").items()}
    for path in sorted((REPO / "requirements").glob("*.txt")):
        if path.name == "comfyui-env.txt":
            continue
        for name, marker in requirement_lines(path):
            assert name in pins, f"{path.name}: {name} has no tested version in constraints-engines.txt"
            for platform in PLATFORMS:
                if applies(marker, platform):
                    assert any(applies(pin, platform) for pin in pins[name]), \
                        f"{path.name}: {name} has no tested version for {platform}"


def test_requirement_lines_read_markers(tmp_path: Path) -> None:
    path = tmp_path / "engine.txt"
    path.write_text('# why\nWeTextProcessing==1.0.4.1; sys_platform == "linux"  # upstream\'s lock\nnumpy>=1.25\n'
                    'pkg[extra] ; python_version < "3.11"\n')
    assert requirement_lines(path) == [("wetextprocessing", 'sys_platform == "linux"'), ("numpy", ""),
                                       ("pkg", 'python_version < "3.11"')]
    linux = {"sys_platform": "linux", "python_version": "3.11"}
    assert applies("", linux) and applies('sys_platform == "linux"', linux)
    assert not applies('sys_platform == "linux"', {**linux, "sys_platform": "win32"})


def test_indextts2_runs_upstreams_linux_normaliser_where_it_installs() -> None:
    """Issue 25: WeTextProcessing (upstream's Linux normaliser) with pynini wherever pynini 2.1.6
    has a wheel, and wetext, the fallback, everywhere."""
    named = dict(requirement_lines(REPO / "requirements" / "indextts2.txt"))
    wheel = [p for p in PLATFORMS if p["sys_platform"] == "linux" and p["platform_machine"] == "x86_64"
             and p["python_version"] in ("3.10", "3.11", "3.12")]
    for package in ("wetextprocessing", "pynini", "importlib-resources"):
        assert [p for p in PLATFORMS if applies(named[package], p)] == wheel, package
    assert named["wetext"] == ""


def engine_requirements() -> dict[str, set[str]]:
    """The distributions each engine file installs."""
    return {path.name: {name for name, _ in requirement_lines(path)}
            for path in sorted((REPO / "requirements").glob("*.txt")) if path.name != "comfyui-env.txt"}


def test_voxcpm2_installs_neither_funasr_nor_modelscope() -> None:
    """Issue 12: the VoxCPM 2 closure leaves out what only the package's optional paths import
    (funasr, modelscope: the denoiser; gradio: the demo), and no engine file brings them in."""
    named = engine_requirements()
    assert "voxcpm" in named["voxcpm2.txt"]
    for unwanted in ("funasr", "modelscope", "gradio", "datasets"):
        assert all(unwanted not in names for names in named.values()), unwanted


def test_no_engine_file_names_torch() -> None:
    """torch and torchvision are the user's (ComfyUI's): no engine file may name them, so no
    install can swap the build the user has."""
    assert all(not {"torch", "torchvision"} & names for names in engine_requirements().values())


def test_this_environment_has_no_unaccepted_pip_check_line() -> None:
    """Where engines are installed (tools/install.sh; all of them, or one), what pip check
    reports is only what the requirement files accept, or what the environment had before (its own)."""
    if all(missing_requirement(Path(name).stem) is not None for name in engine_requirements()):
        pytest.skip("no engine installed here")
    before = Path(sys.prefix) / "comfyui-env-before.txt"
    checked = engine_env.read_snapshot(before)[1] if before.is_file() else []
    new = "\n".join(line for line in engine_env.pip_check() if line not in checked)
    files = [p for p in (REPO / "requirements").glob("*.txt") if p.name != "comfyui-env.txt"]
    assert engine_env.unaccepted(new, engine_env.accepted(files)) == []



def test_no_folder_beside_the_checkout_shadows_an_installed_package() -> None:
    """pytest imports the repository root (a package: the pack's `__init__.py`) with the folder
    above the checkout first on `sys.path`; conftest takes it out again, or a sibling folder such
    as another `voxcpm/` checkout would be imported instead of the engine's package."""
    assert str(REPO.parent) not in sys.path
