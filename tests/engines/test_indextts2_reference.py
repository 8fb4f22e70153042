"""IndexTTS-2 equals upstream on its reference data (issue 25): every stage recorded in
../shared/fixtures/indextts2/ passes `mizuoto check-reference --engine indextts2`, the decoded
codes (beam-sample, sampling, greedy) identical under the recorded seeds."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from conftest import require_engine

require_engine("indextts2")

import torch  # noqa: E402

from mizuoto_runtime.app import cli, reference_check  # noqa: E402
from mizuoto_runtime.engines.reference import Reference  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "indextts2"
needs_fixture = pytest.mark.skipif(not (FIXTURE / "reference.json").is_file(),
                                   reason=f"IndexTTS-2 reference data not present at {FIXTURE}")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # the reference was computed on one CPU thread


@needs_fixture
def test_every_recorded_stage_passes() -> None:
    out = io.StringIO()
    lines = reference_check.check_reference("indextts2", FIXTURE, out=out)
    failed = [line.text() for line in lines if not line.passed]
    assert not failed, "\n".join(failed)
    names = {line.name for line in lines}
    # the sampled and beam-searched codes are among the checks, compared exactly
    for name in ("gpt.out.codes_beam_sample", "gpt.out.codes_sample_beam1", "gpt.out.codes_greedy_rep10",
                 "e2e.out.codes", "e2e.out.wav"):
        assert name in names
    assert all(line.kind == "exact" for line in lines if ".codes" in line.name)


@needs_fixture
def test_cli_runs_one_stage(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-reference", "--engine", "indextts2", "--stage", "codec", str(FIXTURE)]) == 0
    out = capsys.readouterr().out
    assert "PASS  codec.out.codes" in out and "0 failed" in out


@needs_fixture
def test_a_changed_seed_changes_the_beam_codes() -> None:
    """The decode check can fail: another seed gives other sampled codes (same model, same prompt)."""
    from mizuoto_runtime.engines.indextts2 import pipeline, reference

    ref = Reference(FIXTURE)
    meta = ref.meta["stages"]["gpt"]
    latent, emovec = reference._prefix(ref)
    torch.manual_seed(int(meta["seed"]) + 7)
    with torch.inference_mode():
        codes = pipeline.decode_codes(reference._gpt(ref), latent, ref.tensor("gpt.in.text_tokens"), emovec,
                                      reference.settings_of(meta["default_settings"]), int(meta["max_generate_length"]))
    assert not torch.equal(codes, ref.tensor("gpt.out.codes_beam_sample"))
