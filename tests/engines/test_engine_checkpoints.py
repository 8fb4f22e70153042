"""Each engine lists its own checkpoint folders and no other engine's (`describe_checkpoint`,
configs only), so the loader's list and ComfyUI's dropdowns offer F5-TTS, OmniVoice and VoxCPM 2
checkpoints under their engines, as they do Qwen3-TTS's (tests/app/test_checkpoints.py). Each case
runs on the engine's tiny checkpoint in its published layout, and skips where a package of the
engine's requirements file is not installed (conftest.require_engine).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from mizuoto_runtime import Runtime
from mizuoto_runtime.app.checkpoints import scan
from mizuoto_runtime.engines import ENGINES, CheckpointInfo, engine_class

from conftest import link_checkpoint
from support.layouts import qwen_layout

FIXTURES = {"f5tts": "f5tts_checkpoint", "omnivoice": "omnivoice_checkpoint", "voxcpm2": "voxcpm2_checkpoint",
            "higgsaudio": "higgsaudio_checkpoint", "dia": "dia_checkpoint", "csm": "csm_checkpoint"}
# What a folder's type is called in the list, and the one file whose absence makes it half copied.
LABELS = {"f5tts": "F5TTS_tiny", "omnivoice": "OmniVoice", "voxcpm2": "VoxCPM2", "higgsaudio": "Higgs Audio v2",
          "dia": "Dia", "csm": "CSM"}
VALUES = {"f5tts": "f5tts/tiny (F5TTS_tiny)", "omnivoice": "omnivoice/tiny", "voxcpm2": "voxcpm2/tiny",
          "higgsaudio": "higgsaudio/tiny (Higgs Audio v2)", "dia": "dia/tiny", "csm": "csm/tiny"}
REQUIRED = {"f5tts": "vocab.txt", "omnivoice": "audio_tokenizer/model.safetensors", "voxcpm2": "tokenizer.json",
            "higgsaudio": "model.safetensors.index.json", "dia": "model-00002-of-00002.safetensors",
            "csm": "model-00001-of-00002.safetensors"}


def tiny(request: pytest.FixtureRequest, engine: str) -> Path:
    return request.getfixturevalue(FIXTURES[engine])()


@pytest.mark.parametrize("engine", sorted(FIXTURES))
def test_an_engine_describes_its_own_folder_and_no_other_engine_does(request: pytest.FixtureRequest,
                                                                     tmp_path: Path, engine: str) -> None:
    folder = tiny(request, engine)
    described = {other: engine_class(other).describe_checkpoint(folder) for other in ENGINES}
    assert {other for other, info in described.items() if info is not None} == {engine}
    info = described[engine]
    assert info is not None and info.label == LABELS[engine] and info.speakers == [] and info.languages[0] == "auto"
    half_copied = link_checkpoint(folder, tmp_path / "half", skip=(REQUIRED[engine],))
    assert engine_class(engine).describe_checkpoint(half_copied) is None
    assert engine_class(engine).describe_checkpoint(qwen_layout(tmp_path / "qwen", "base")) is None


@pytest.mark.parametrize("engine", sorted(FIXTURES))
def test_the_catalog_offers_the_folder_under_its_engine_and_loads_it(request: pytest.FixtureRequest,
                                                                     tmp_path: Path, engine: str) -> None:
    """The value a dropdown shows names the type unless the folder's path does (`omnivoice/tiny`
    does); the bare path of a workflow saved before finds the same folder."""
    root = tmp_path / "models"
    link_checkpoint(tiny(request, engine), root / engine / "tiny")
    qwen_layout(root / "qwen3tts" / "tiny-base", "base")
    catalog = scan([root])
    assert [c.value for c in catalog.of(engine)] == [VALUES[engine]]
    assert [c.engine for c in catalog.choices if c.path == f"{engine}/tiny"] == [engine]
    choice = catalog.find(engine, f"{engine}/tiny")
    assert choice.folder == root / engine / "tiny"
    assert catalog.as_dict()["engines"][engine]["title"] == engine_class(engine).title != ""


def test_omnivoice_offers_the_languages_the_loaded_model_takes(omnivoice_checkpoint: Callable[..., Path],
                                                              one_torch_thread: None) -> None:
    folder = omnivoice_checkpoint()
    info = engine_class("omnivoice").describe_checkpoint(folder)
    engine = Runtime().engine("omnivoice", folder)
    assert info == CheckpointInfo("OmniVoice", [], ["auto", *engine.languages])
    assert "english" in info.languages and "chinese" in info.languages
