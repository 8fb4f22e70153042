"""The generic reference checker (issue 22): one line per check, tolerances by kind,
unchecked recorded outputs and stages that raise fail the run, the CLI's exit status."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mizuoto_runtime.app import cli, reference_check
from mizuoto_runtime.engines.reference import Check, Reference, Stage
from mizuoto_runtime.errors import MizuotoError


def _folder(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    (tmp_path / "ckpt").mkdir()
    save_file(tensors, str(tmp_path / "reference.safetensors"))
    (tmp_path / "reference.json").write_text(json.dumps({"tokens": [1, 2, 3]}))
    return tmp_path


def _stages(ref: Reference) -> list[Stage]:
    x = ref.tensor("a.in.x")
    return [
        Stage("a", lambda: [Check("a.out.y", x * 2 + 5e-5, "module")]),  # 5e-5 / max(1, 4) passes 1e-4
        Stage("b", lambda: [Check("b.out.z", ref.tensor("b.out.z") + 0.5, "chain")]),
        Stage("c", lambda: [Check("c.tokens", [1, 2, 4], "exact", want=ref.meta["tokens"])]),
        Stage("d", lambda: (_ for _ in ()).throw(RuntimeError("no weights"))),
    ]


def _engines(monkeypatch: pytest.MonkeyPatch, providers: dict[str, reference_check.Provider]) -> None:
    """Fake engines' stages, where the checker looks an engine's up."""
    monkeypatch.setattr(reference_check, "provider_for", providers.__getitem__)


def test_lines_and_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder(tmp_path, {"a.in.x": torch.tensor([1.0, 2.0]), "a.out.y": torch.tensor([2.0, 4.0]),
                                "b.out.z": torch.zeros(3), "e.out.never": torch.ones(1)})
    _engines(monkeypatch, {"fake": _stages})
    out = io.StringIO()
    lines = {line.name: line for line in reference_check.check_reference("fake", folder, out=out)}
    assert lines["a.out.y"].passed and lines["a.out.y"].max_abs == pytest.approx(5e-5, rel=1e-2)
    assert not lines["b.out.z"].passed and lines["b.out.z"].rel == pytest.approx(0.5)
    assert not lines["c.tokens"].passed and "first difference at 2: 4 vs 3" in lines["c.tokens"].note
    assert not lines["d"].passed and "no weights" in lines["d"].note
    assert not lines["e.out.never"].passed and "no stage checks it" in lines["e.out.never"].note
    assert len(out.getvalue().splitlines()) == 5
    assert out.getvalue().startswith("PASS  a.out.y")


def test_cli_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder(tmp_path, {"a.in.x": torch.tensor([1.0]), "a.out.y": torch.tensor([2.0])})
    _engines(monkeypatch, {
        "good": lambda ref: [Stage("a", lambda: [Check("a.out.y", ref.tensor("a.in.x") * 2)])],
        "bad": lambda ref: [Stage("a", lambda: [Check("a.out.y", torch.zeros(2))])]})
    assert cli.main(["check-reference", "--engine", "good", str(folder)]) == 0
    assert "1 passed, 0 failed" in capsys.readouterr().out
    assert cli.main(["check-reference", "--engine", "bad", str(folder)]) == 1
    assert "shape (2,) vs (1,)" in capsys.readouterr().out


def test_unknown_engine_and_bad_folder(tmp_path: Path) -> None:
    with pytest.raises(MizuotoError, match="has no reference checker"):
        reference_check.provider_for("nosuchengine")
    with pytest.raises(MizuotoError, match="engine 'demo' has no reference checker"):
        reference_check.provider_for("demo")  # an engine whose class names no reference module
    with pytest.raises(MizuotoError, match="lacks ckpt, reference.safetensors, reference.json"):
        Reference(tmp_path)


def test_mkl_kernels_and_path_agree() -> None:
    """MKL's kernel family (issue 31): its generic path exactly where it reports a non-Intel CPU
    (an LD_PRELOAD shim that forces the Intel path changes both)."""
    kernels, intel = reference_check.mkl_kernels(), reference_check.mkl_intel_path()
    if kernels is None:
        pytest.skip("torch's library exposes no Intel MKL here")
    assert kernels in reference_check._MKL_BRANCHES.values()
    assert (kernels == "compatible") == (intel is False)
