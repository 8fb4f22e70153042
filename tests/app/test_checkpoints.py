"""Checkpoint folders: the listing, what each engine says of a folder (`describe_checkpoint`,
configs only), and the catalog the nodes' dropdowns and queue-time checks come from."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from mizuoto_runtime import MizuotoError, Runtime
from mizuoto_runtime.app.checkpoints import NONE, checkpoint_folders, choice_value, is_checkpoint_root, scan
from mizuoto_runtime.engines import ENGINES, CheckpointInfo
from mizuoto_runtime.engines.demo.engine import DemoEngine
from mizuoto_runtime.engines.demo.tiny import write as save_checkpoint
from mizuoto_runtime.engines.dummy.engine import DummyEngine
from mizuoto_runtime.engines.qwen3tts.checkpoint import REQUIRED_FILES
from mizuoto_runtime.engines.qwen3tts.engine import Qwen3TTSEngine

from support.layouts import qwen_layout, touch


def test_checkpoint_choices_are_checkpoint_roots_not_their_subfolders(tmp_path: Path) -> None:
    """Folders with a config.json or safetensors at their top level, two levels deep, and never
    a listed checkpoint's own subfolders (Qwen's speech_tokenizer/)."""
    for qwen in (tmp_path / "Qwen3-TTS-12Hz-0.6B-Base", tmp_path / "qwen3tts" / "tiny-base"):
        for name in ("config.json", "model.safetensors", "speech_tokenizer/config.json",
                     "speech_tokenizer/model.safetensors"):
            touch(qwen / name)
    touch(tmp_path / "demo-small" / "talker.safetensors")  # the demo engine: bare safetensors
    touch(tmp_path / "notes" / "readme.txt")  # files, but not a checkpoint
    touch(tmp_path / ".cache" / "hub" / "config.json")  # hidden
    touch(tmp_path / "deep" / "a" / "b" / "config.json")  # three levels down
    touch(tmp_path / "loose.safetensors")
    assert checkpoint_folders(tmp_path) == ["Qwen3-TTS-12Hz-0.6B-Base", "demo-small", "qwen3tts/tiny-base"]
    # speech_tokenizer/ would pass as a checkpoint on its own: it is left out because it is nested.
    assert is_checkpoint_root(tmp_path / "Qwen3-TTS-12Hz-0.6B-Base" / "speech_tokenizer")
    assert "deep/a/b" in checkpoint_folders(tmp_path, max_depth=3)
    assert checkpoint_folders(tmp_path / "missing") == []


@pytest.mark.parametrize(("model_type", "label", "speakers"), [
    ("base", "Base", []),
    ("custom_voice", "CustomVoice", ["alice", "bob", "dylan"]),
    ("voice_design", "VoiceDesign", []),
])
def test_qwen3tts_describes_its_folders_from_config_json(tmp_path: Path, model_type: str, label: str,
                                                         speakers: list[str]) -> None:
    info = Qwen3TTSEngine.describe_checkpoint(qwen_layout(tmp_path / model_type, model_type))
    # Dialects are no language of their own (the package lists them neither); auto comes first.
    assert info == CheckpointInfo(label, speakers, ["auto", "chinese", "english", "german"])


def test_engines_refuse_folders_they_cannot_load(tmp_path: Path) -> None:
    demo = save_checkpoint(tmp_path / "demo")
    qwen = qwen_layout(tmp_path / "qwen", "base")
    broken = qwen_layout(tmp_path / "broken", "base")
    (broken / "speech_tokenizer" / "model.safetensors").unlink()  # half copied
    other = tmp_path / "other"
    touch(other / "config.json", json.dumps({"model_type": "llama"}))
    unreadable = tmp_path / "unreadable"
    touch(unreadable / "config.json", "{not json")
    for name in REQUIRED_FILES[1:]:
        touch(unreadable / name)
    assert DemoEngine.describe_checkpoint(demo) == CheckpointInfo("Demo")
    assert [DemoEngine.describe_checkpoint(f) for f in (qwen, other)] == [None, None]
    assert [Qwen3TTSEngine.describe_checkpoint(f) for f in (demo, broken, other, unreadable)] == [None] * 4
    assert DummyEngine.describe_checkpoint(demo) is None and DummyEngine.BUILTIN is not None
    assert Qwen3TTSEngine.BUILTIN is None  # it needs a folder


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    save_checkpoint(root / "demo-small")
    qwen_layout(root / "qwen3tts" / "tiny-cv", "custom_voice")
    qwen_layout(root / "qwen3tts" / "design", "voice_design")
    qwen_layout(root / "Qwen3-TTS-12Hz-0.6B-Base", "base")
    touch(root / "junk" / "config.json", json.dumps({"model_type": "bert"}))
    return root


def test_the_catalog_lists_per_engine_what_it_can_load_and_names_the_type(models: Path) -> None:
    catalog = scan([models])
    assert [c.value for c in catalog.of("demo")] == [NONE, "demo-small"]
    assert [c.value for c in catalog.of("dummy")] == [NONE]
    # The type in parentheses unless the folder name says it already.
    assert [c.value for c in catalog.of("qwen3tts")] == [
        "Qwen3-TTS-12Hz-0.6B-Base", "qwen3tts/design (VoiceDesign)", "qwen3tts/tiny-cv (CustomVoice)"]
    assert catalog.values() == [NONE, "demo-small", "Qwen3-TTS-12Hz-0.6B-Base", "qwen3tts/design (VoiceDesign)",
                                "qwen3tts/tiny-cv (CustomVoice)"]
    assert "junk" not in json.dumps(catalog.as_dict())
    assert catalog.speakers() == ["alice", "bob", "dylan"]
    assert catalog.languages() == ["auto", "chinese", "english", "german"]
    cv = catalog.find("qwen3tts", "qwen3tts/tiny-cv (CustomVoice)")
    assert cv is catalog.find("qwen3tts", "qwen3tts/tiny-cv")  # the bare path of an older workflow
    assert cv.folder == models / "qwen3tts" / "tiny-cv" and cv.info.label == "CustomVoice"
    assert catalog.find("demo", NONE).folder is None


def test_the_route_data_has_every_engine_and_no_absolute_path(models: Path) -> None:
    data = scan([models]).as_dict()
    assert set(data["engines"]) == set(ENGINES)
    qwen = data["engines"]["qwen3tts"]
    assert qwen["title"] == "Qwen3-TTS"
    assert qwen["choices"][2] == {"value": "qwen3tts/tiny-cv (CustomVoice)", "path": "qwen3tts/tiny-cv",
                                  "label": "CustomVoice", "speakers": ["alice", "bob", "dylan"],
                                  "languages": ["auto", "chinese", "english", "german"]}
    assert str(models) not in json.dumps(data)


@pytest.mark.parametrize(("engine", "value", "says"), [
    ("qwen3tts", "demo-small", "is for Demo, not Qwen3-TTS; Qwen3-TTS can load: "),
    ("demo", "qwen3tts/tiny-cv (CustomVoice)", "is for Qwen3-TTS, not Demo"),
    ("qwen3tts", NONE, "Qwen3-TTS needs a checkpoint folder; Qwen3-TTS can load: Qwen3-TTS-12Hz-0.6B-Base"),
    ("qwen3tts", "gone", "checkpoint 'gone': no folder Qwen3-TTS can load by that name under "),
])
def test_a_wrong_choice_is_one_error_naming_what_the_engine_can_load(models: Path, engine: str, value: str,
                                                                     says: str) -> None:
    with pytest.raises(MizuotoError) as caught:
        scan([models]).find(engine, value)
    assert says in str(caught.value)


def test_an_engine_without_checkpoints_says_where_to_put_one(tmp_path: Path) -> None:
    with pytest.raises(MizuotoError) as caught:
        scan([tmp_path]).find("qwen3tts", "anything")
    assert f"no Qwen3-TTS checkpoint was found under {tmp_path}" in str(caught.value)


def test_the_first_root_holding_a_folder_wins(tmp_path: Path) -> None:
    first, second = save_checkpoint(tmp_path / "a" / "voice"), tmp_path / "b" / "voice"
    qwen_layout(second, "base")
    catalog = scan([tmp_path / "a", tmp_path / "b", tmp_path / "missing"])
    assert catalog.find("demo", "voice").folder == first
    assert catalog.of("qwen3tts") == []  # b/voice is hidden by a/voice, as resolving would pick a/voice


def test_choice_values() -> None:
    assert choice_value("Qwen3-TTS-12Hz-1.7B-CustomVoice", "CustomVoice") == "Qwen3-TTS-12Hz-1.7B-CustomVoice"
    assert choice_value("mine/v2", "VoiceDesign") == "mine/v2 (VoiceDesign)"


def test_describe_agrees_with_the_loaded_model(qwen3tts_checkpoint: Callable[[str], Path],
                                               one_torch_thread: None) -> None:
    """What the dropdowns offer is what the package accepts once the weights are loaded."""
    folder = qwen3tts_checkpoint("custom_voice")
    info = Qwen3TTSEngine.describe_checkpoint(folder)
    engine = Runtime().engine("qwen3tts", folder)
    assert info is not None and info.label == "CustomVoice"
    assert info.speakers == engine.speakers and info.languages == ["auto", *sorted(set(engine.languages) - {"auto"})]
