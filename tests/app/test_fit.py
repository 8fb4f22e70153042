"""Issue 35: what fits on a card. `mizuoto doctor --fit` predicts each phase's placement with the
manager's and the handles' own rules (`app.fit`); these tests hold the prediction to the
placement the manager then makes on a simulated device: for every engine's tiny checkpoint and
for two published models built at full size on the meta device. The README's table is checked
against what `tools/fit_table.py` writes now.
"""
from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from mizuoto_runtime import DeviceService, ModelManager, VramPolicy
from mizuoto_runtime.app import cli, fit
from mizuoto_runtime.engines import ENGINES, Engine, engine_class
from mizuoto_runtime.engines.base import PhaseEstimate
from mizuoto_runtime.errors import MizuotoError
from mizuoto_runtime.memory.policy import GB, MB

from conftest import REPO, missing_requirement, require_engine, require_qwen_tts

CARD = 1 << 40  # the simulated device: free memory is set by what else it holds ("beside")
FIXTURES = ("qwen3tts", "f5tts", "omnivoice", "voxcpm2")  # engines whose tiny folders conftest shares
PUBLISHED = [e for e in sorted(ENGINES) if engine_class(e).PUBLISHED is not None]
# Every engine that describes a typical request (all but the demo and dummy, which need none).
TYPICAL = [e for e in sorted(ENGINES) if engine_class(e).typical_phases is not Engine.typical_phases]


def place(manager: ModelManager, phase: PhaseEstimate, free: int) -> tuple[fit.PhaseFit, list[tuple[str, int, int]]]:
    """`phase` with `free` bytes left on the device for it: the prediction, and what
    `ModelManager.load` placed (component, resident bytes, streamed bytes per forward)."""
    device = phase.handles[0].device
    manager.devices.allocate(device, CARD - free)  # what shares the card
    try:
        predicted = fit.place_phase(manager, phase.name, phase.handles, phase.memory, free)
        manager.load(phase.handles, phase.memory, phase=phase.name)
        return predicted, [(h.name, h.loaded_bytes, sum(u.nbytes for u in h.streamed_units)) for h in phase.handles]
    finally:
        for h in phase.handles:
            h.offload()
        manager.devices.release(device, CARD - free)


def check_predictions(manager: ModelManager, engine: Engine) -> int:
    """Every typical phase with room for half its streamable weights, and for all of them: the
    prediction is the placement. Returns how many placements were partial (the test must
    really stream)."""
    reserve = manager.reserve_bytes(engine.device)
    partial = 0
    for phase in engine.typical_phases(20.0):
        least = sum(h.min_working_set for h in phase.handles)
        size = sum(h.size_bytes for h in phase.handles)
        # A component of no more units than streamer copies has a minimum a few bytes over its size.
        for free in (least + phase.memory + reserve + max(0, size - least) // 2,
                     max(size, least) + phase.memory + reserve):
            predicted, got = place(manager, phase, free)
            want = [(h.name, h.resident_bytes, h.streamed_bytes) for h in predicted.handles]
            assert got == want, f"{phase.name} with {free / MB:.1f} MB free"
            assert not predicted.refused
            partial += any(streamed for _, _, streamed in got)
    return partial


@pytest.fixture
def tiny(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], Path]:
    def folder(engine_id: str) -> Path:
        if engine_id == "qwen3tts":
            require_qwen_tts()
            return Path(request.getfixturevalue("qwen3tts_checkpoint")("base"))
        if engine_id in FIXTURES:
            return Path(request.getfixturevalue(f"{engine_id}_checkpoint")())
        require_engine(engine_id)
        return engine_class(engine_id).tiny_writer()(tmp_path / engine_id)

    return folder


def test_every_engine_with_weights_describes_a_typical_request() -> None:
    assert set(TYPICAL) == set(ENGINES) - {"demo", "dummy"}
    assert set(PUBLISHED) <= set(TYPICAL)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("engine_id", TYPICAL)
def test_the_predicted_placement_is_the_managers_for_every_tiny_checkpoint(
        engine_id: str, tiny: Callable[[str], Path]) -> None:
    manager = ModelManager(DeviceService(simulate={"cpu": CARD}), VramPolicy({"compute.vram_reserve_mb": 1}))
    engine = engine_class(engine_id)(manager, tiny(engine_id))
    assert check_predictions(manager, engine) > 0


@pytest.mark.usefixtures("one_torch_thread")
def test_the_loader_nodes_memory_output_is_the_first_runs_placement(tiny: Callable[[str], Path]) -> None:
    """`engine_plan` (the Load TTS Engine node's memory output) before any run: per phase, what
    will be resident and what will stream with the memory free now; then each phase placed by
    the manager on that device is exactly that."""
    folder = tiny("qwen3tts")
    probe = engine_class("qwen3tts")(ModelManager(DeviceService(simulate={"cpu": CARD})), folder)
    (talking,) = [p for p in probe.typical_phases(20.0) if p.name == "talker"]
    talker = probe.talker
    size = talker.min_working_set + talking.memory + (talker.size_bytes - talker.min_working_set) // 2
    manager = ModelManager(DeviceService(simulate={"cpu": size}), VramPolicy({"compute.vram_reserve_mb": 0}))
    engine = engine_class("qwen3tts")(manager, folder)
    plan = fit.engine_plan(engine)
    assert len(plan["lines"]) == len(plan["phases"]) == 4
    assert any("streams per token or step" in line for line in plan["lines"]), plan["lines"]
    assert all(line.endswith("all resident") for line in fit.engine_plan(probe)["lines"])  # a roomy device
    for phase, planned in zip(engine.typical_phases(20.0), plan["phases"]):
        if planned["refused"]:  # working memory of 20 s of speech: more than this device has
            continue
        manager.load(phase.handles, phase.memory, phase=phase.name)
        got = [(h.name, h.loaded_bytes, sum(u.nbytes for u in h.streamed_units)) for h in phase.handles]
        assert got == [(c["name"], c["resident_bytes"], c["streamed_bytes"]) for c in planned["components"]]
        for h in phase.handles:
            h.offload()


def test_an_engine_on_the_plain_cpu_plans_no_placement() -> None:
    engine = engine_class("demo")(ModelManager(DeviceService()))
    plan = fit.engine_plan(engine)
    assert plan["phases"] == [] and "nothing streams" in plan["lines"][0]


# (published model, card GB, GB beside it): VibeVoice 7B (18.7 GB in bfloat16) needs 12 GB beside SDXL.
FULL_SIZE = (("Qwen3-TTS-12Hz-1.7B-Base", 8, 5), ("CosyVoice2-0.5B", 8, 5), ("VibeVoice-7B", 12, 5))


def require_model(name: str) -> fit.PublishedModel:
    model = fit.find(name)
    require_engine(model.engine)
    if model.engine == "qwen3tts":
        require_qwen_tts()
    return model


@pytest.mark.parametrize(("name", "card_gb", "beside_gb"), FULL_SIZE)
def test_doctor_fit_predicts_the_managers_placement_of_a_full_size_meta_build(
        name: str, card_gb: int, beside_gb: int, capsys: pytest.CaptureFixture[str]) -> None:
    """`mizuoto doctor --fit --card 8GB --beside 5GB --model NAME` prints each phase's placement;
    the model built on meta and loaded on a simulated device of that size holding that much of
    another model is placed exactly so, partially for the larger phases."""
    model = require_model(name)
    assert cli.main(["doctor", "--fit", "--card", f"{card_gb}GB", "--beside", f"{beside_gb}GB", "--model", name]) == 0
    report = json.loads(capsys.readouterr().out)
    (row,) = report["fits"]
    assert (row["model"], row["card_mb"], row["beside_mb"]) == (name, card_gb * 1024, beside_gb * 1024)
    printed = [[(c["name"], c["resident_bytes"], c["streamed_bytes"]) for c in p["components"]] for p in row["phases"]]

    card, beside = card_gb * GB, beside_gb * GB
    manager = fit.fit_manager(card)
    engine = fit.build(model, manager)
    got = []
    for phase in engine.typical_phases(fit.TABLE_SECONDS):
        manager.devices.allocate(engine.device, beside)
        manager.load(phase.handles, phase.memory, phase=phase.name)
        got.append([(h.name, h.loaded_bytes, sum(u.nbytes for u in h.streamed_units)) for h in phase.handles])
        for h in phase.handles:
            h.offload()
        manager.devices.release(engine.device, beside)
    assert got == printed
    assert row["status"] in ("whole", "partial")


@pytest.mark.skipif(fit.own_device() is not None, reason="this machine has a GPU: --fit shows it")
def test_doctor_fit_without_a_gpu_shows_the_standard_cards(capsys: pytest.CaptureFixture[str]) -> None:
    require_qwen_tts()
    assert cli.main(["doctor", "--fit", "--model", "Qwen3-TTS-12Hz-0.6B-CustomVoice"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["device"] is None and "no GPU" in report["note"]
    assert {(f["card_mb"], f["beside_mb"]) for f in report["fits"]} == {
        (c * 1024, b // MB) for c in fit.CARDS_GB for _, b in fit.BESIDE}
    assert report["table"][0] == "Alone on the card:"
    assert "| 6 GB | 8 GB | 12 GB | 16 GB | 24 GB |" in report["table"][2]


@pytest.mark.parametrize("name", ["Qwen3-TTS-12Hz-1.7B-Base", "VibeVoice-7B"])
def test_a_full_size_meta_build_streams_as_predicted_at_every_share(name: str) -> None:
    """Qwen3-TTS 1.7B and VibeVoice 7B at full size on meta: partial and whole placements of
    every phase."""
    model = require_model(name)
    manager = ModelManager(DeviceService(simulate={"cpu": CARD}), VramPolicy({"compute.vram_reserve_mb": 400}))
    engine = fit.build(model, manager)
    assert check_predictions(manager, engine) > 0


def test_a_card_below_the_minimum_working_set_is_refused() -> None:
    require_qwen_tts()
    engine = fit.build(fit.find("Qwen3-TTS-12Hz-0.6B-CustomVoice"), fit.fit_manager())
    talker = engine.handles()[0]
    small = fit.engine_fit(engine, "m", talker.min_working_set, 0)
    assert small.status == "refused" and small.cell() == "refused"
    roomy = fit.engine_fit(engine, "m", 24 * GB, 0)
    assert roomy.status == "whole" and roomy.streaming_phase is None
    between = fit.engine_fit(engine, "m", 24 * GB, 24 * GB - talker.size_bytes)
    assert between.status == "partial"
    phase = between.streaming_phase
    assert phase is not None and phase.name == "talker" and 0 < phase.resident_bytes < phase.size_bytes
    assert between.cell().startswith("partial ") and "/step" in between.cell()


@pytest.mark.parametrize(("text", "nbytes"), [("12GB", 12 * GB), ("12 gb", 12 * GB), ("6", 6 * GB),
                                              ("512MB", 512 * MB), ("1.5G", int(1.5 * GB))])
def test_sizes_are_read_as_gb_or_mb(text: str, nbytes: int) -> None:
    assert fit.parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["twelve", "12TB", "-1GB", ""])
def test_a_bad_size_is_one_clear_error(text: str) -> None:
    with pytest.raises(MizuotoError, match="size"):
        fit.parse_size(text)


def test_card_and_beside_need_fit(caplog: pytest.LogCaptureFixture) -> None:
    assert cli.main(["doctor", "--card", "12GB"]) == 2
    assert "go with --fit" in caplog.text


def test_the_readmes_fit_table_is_current() -> None:
    """tools/fit_table.py --check: the table the README carries is what the runtime computes
    now from every engine's published shapes."""
    missing = {e: m for e in PUBLISHED if (m := missing_requirement(e)) is not None}
    if missing:
        pytest.skip(f"not every engine is installed here: {missing}")
    require_qwen_tts()
    spec = importlib.util.spec_from_file_location("fit_table", REPO / "tools" / "fit_table.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert tool.replaced(text, tool.section()) == text, "the README's fit table is stale: run python tools/fit_table.py"
