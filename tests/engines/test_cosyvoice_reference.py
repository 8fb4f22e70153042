"""CosyVoice 2 / 3 against upstream's reference data (issue 22): ``mizuoto check-reference``
on ``../shared/fixtures/cosyvoice/{cosyvoice2,cosyvoice3}``.

Every stage must pass the fixture README's tolerance, with one documented exception: outputs
that are ill-conditioned in float32 — the log-mel at near-floor bins (a one-ulp change of the
input waveform moves them by ~5e-3) and CosyVoice 2's NSF source and waveform (the source phase
is a running sum of F0 over every sample) — differ from upstream by about as much as a one-ulp
change of their own recorded input moves them. That happens where Intel MKL runs other kernels
than those the data is matched with: its non-Intel code path (another CPU vendor: upstream's own
code gives our bits there) or its Intel path's AVX2 kernels. There the test asserts that bound
(at most 3x the one-ulp spread, and within the chain tolerance), so a real error still fails;
with MKL's AVX-512 Intel kernels every check must pass as it stands. The allowance is named in
one place, `mkl_paths`.
Skipped, saying why, where ``../shared`` is absent (a user's clone).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mizuoto_runtime.app import cli
from mizuoto_runtime.app.reference_check import check_reference

from conftest import require_engine
from support.mkl_paths import may_differ_by_mkl_kernels

pytest.importorskip("transformers")
FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "cosyvoice"


def _folder(model: str) -> Path:
    require_engine("cosyvoice")
    folder = FIXTURES / model
    if not (folder / "reference.json").is_file():
        pytest.skip(f"no CosyVoice reference data at {folder} (../shared/fixtures is not in this checkout)")
    return folder


@pytest.mark.parametrize("model", ["cosyvoice2", "cosyvoice3"])
def test_every_stage_equals_upstream(model: str) -> None:
    folder = _folder(model)
    torch.set_num_threads(1)
    lines = check_reference("cosyvoice", folder)
    names = {line.name for line in lines}
    for must in ("llm.out.tokens", "llm.out.step1_logits", "llm.out.tf_logits", "flow.out.est_t05",
                 "flow.out.cfm_full", "vocoder.out.wav", "e2e.out.wav", "e2e.out.tokens"):
        assert must in names, f"{model}: no check of {must}"
    for line in lines:
        if line.passed:
            continue
        assert may_differ_by_mkl_kernels(line.name), f"{model}: {line.text()}"
        spread = float(line.note.split("by ")[1].rstrip(")"))
        assert line.rel <= 1e-3 and line.max_abs <= 3 * spread, f"{model}: beyond its conditioning: {line.text()}"


def test_cli_prints_one_line_per_check(capsys: pytest.CaptureFixture[str]) -> None:
    folder = _folder("cosyvoice3")
    code = cli.main(["check-reference", "--engine", "cosyvoice", str(folder), "--stage", "llm"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and out[-1].startswith("2") and "0 failed" in out[-1]
    assert all(line.startswith("PASS  llm") for line in out[:-1])


def test_a_wrong_stage_fails(tmp_path: Path) -> None:
    """The checker is not blind: a checkpoint whose flow weights are perturbed fails the flow stages."""
    folder = _folder("cosyvoice3")
    copy = tmp_path / "cosyvoice3"
    (copy / "ckpt").mkdir(parents=True)
    for item in (folder / "ckpt").iterdir():
        (copy / "ckpt" / item.name).symlink_to(item)
    for name in ("reference.json", "reference.safetensors"):
        (copy / name).symlink_to(folder / name)
    state = torch.load(folder / "ckpt" / "flow.pt", weights_only=True)
    state["decoder.estimator.proj_out.bias"] = state["decoder.estimator.proj_out.bias"] + 1e-2
    (copy / "ckpt" / "flow.pt").unlink()
    torch.save(state, copy / "ckpt" / "flow.pt")
    lines = {line.name: line for line in check_reference("cosyvoice", copy, only="flow")}
    assert not lines["flow.out.est_t05"].passed and not lines["flow.out.cfm_full"].passed
    assert lines["flow.out.mu"].passed
