"""`bench/full_size.py` (issue 35): its weight files are what the engines' loaders read, written
one tensor at a time; on the tiny checkpoint (``--dry-run``) every measurement runs."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from conftest import require_engine, require_qwen_tts

BENCH = Path(__file__).resolve().parents[2] / "bench" / "full_size.py"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("full_size_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "full_size_bench", module)
    spec.loader.exec_module(module)
    return module


def test_a_streamed_safetensors_file_reads_back_tensor_for_tensor(bench: ModuleType, tmp_path: Path) -> None:
    """The header first, then each tensor as it is made: the file is a safetensors file whose
    every tensor is the one made for it (names, shapes, dtypes, values), each made once."""
    from safetensors.torch import load_file

    shapes = {"a.weight": torch.empty(3, 5, dtype=torch.bfloat16, device="meta"),
              "b.bias": torch.empty(7, device="meta"), "c.count": torch.empty(2, 2, dtype=torch.int64, device="meta")}
    made: dict[str, torch.Tensor] = {}

    def make(name: str, like: torch.Tensor) -> torch.Tensor:
        assert name not in made
        made[name] = torch.arange(like.numel()).reshape(like.shape).to(like.dtype) + len(made)
        return made[name]

    path = tmp_path / "w.safetensors"
    size = bench.write_safetensors(path, shapes, make)
    back = load_file(path)
    assert size == path.stat().st_size and back.keys() == shapes.keys()
    for name, value in made.items():
        assert back[name].dtype == value.dtype and torch.equal(back[name], value)
    with pytest.raises(ValueError, match="a.weight made as torch.float32"):
        bench.write_safetensors(tmp_path / "bad.safetensors", shapes, lambda n, like: torch.zeros(like.shape))


def test_a_written_checkpoint_is_what_the_loader_reads(bench: ModuleType, tmp_path: Path) -> None:
    """Qwen3-TTS's writer on the tiny configs (the published ones take 4 GB): every weight file
    has exactly the tensors the engine's loader asks for, and the engine speaks from it."""
    require_qwen_tts()
    from mizuoto_runtime import Runtime
    from mizuoto_runtime.engines import Sampling
    from mizuoto_runtime.engines.published import find
    from mizuoto_runtime.engines.qwen3tts import tiny

    _, _, _, special = tiny.text_tokenizer()
    small = dataclasses.replace(find("Qwen3-TTS-12Hz-0.6B-CustomVoice"), dtype=torch.float32, files={
        **find("Qwen3-TTS-12Hz-0.6B-CustomVoice").files,
        "config.json": tiny.main_config("custom_voice", special, "float32"),
        "speech_tokenizer/config.json": tiny.speech_tokenizer_config()})
    folder = tmp_path / "written"
    written = bench.write_checkpoint(small, folder)
    assert written == sum(p.stat().st_size for p in folder.rglob("*.safetensors"))
    rt = Runtime()
    engine = rt.engine("qwen3tts", folder)
    audio, _ = rt.say(engine, "Hello there.", speaker="alice", sampling=Sampling(seed=1, max_new_tokens=3))
    assert audio.waveform.numel() > 0 and torch.isfinite(audio.waveform).all()


def test_the_dry_run_measures_every_column(bench: ModuleType, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``--dry-run``: the tiny checkpoint through the whole measurement (fresh process, phases,
    plain and all-streamed token timing), the row merged into the JSON and the folder removed."""
    require_qwen_tts()
    out = tmp_path / "full_size.json"
    monkeypatch.setattr(sys, "argv", ["full_size.py", "--dry-run", "--model", "Qwen3-TTS-12Hz-0.6B-Base",
                                      "--tokens", "3", "--root", str(tmp_path / "root"), "--out", str(out)])
    bench.main()
    row = json.loads(out.read_text())["rows"]["Qwen3-TTS-12Hz-0.6B-Base (tiny)"]
    assert "error" not in row, row.get("error")
    assert row["load_s"] > 0 and row["cold_to_audio_s"] > row["load_s"] and row["card_gb"] == 6
    # the load's RSS is the checkpoint's, the imports measured apart (with them: ~10x the tiny checkpoint)
    assert row["import_s"] > 0 and 0.5 < row["load_rss_ratio"] < 3
    assert {p["phase"] for p in row["phases"]} == {"voice prompt (codec_encoder)", "voice prompt (speaker_encoder)",
                                                   "talker (talker)", "codec decoder (codec_decoder)"}
    assert row["plain"]["tokens"] >= 1 and row["all_streamed"]["streamed_mb_per_token"] > 0
    assert not (tmp_path / "root" / "Qwen3-TTS-12Hz-0.6B-Base").exists()


def test_a_sharded_transformers_checkpoint_is_what_the_loader_reads(bench: ModuleType, tmp_path: Path) -> None:
    """The transformers-format writer (VibeVoice's ``-hf`` layout) on the tiny config, in shards
    small enough to make several: the index names exactly the keys the engine's own tiny
    ``save_pretrained``-layout writer stores (the tied LM head once, as the embedding), every
    shard holds what the index says, and the engine loads and speaks from it."""
    require_engine("vibevoice")
    from safetensors import safe_open

    from mizuoto_runtime import Runtime
    from mizuoto_runtime.audio import Audio
    from mizuoto_runtime.engines import Sampling
    from mizuoto_runtime.engines.published import find
    from mizuoto_runtime.engines.vibevoice import tiny

    published = find("VibeVoice-1.5B")
    small = dataclasses.replace(published, dtype=torch.float32, files={
        **published.files, "config.json": tiny.model_config("1.5b", torch.float32).to_dict()})
    folder = tmp_path / "written"
    written = bench.write_checkpoint(small, folder, shard_bytes=8 << 20)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and written == sum(p.stat().st_size for p in shards)
    reference = tiny.write(tmp_path / "tiny", version="1.5b")
    expected = json.loads((reference / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["weight_map"].keys() == expected.keys() and "lm_head.weight" not in index["weight_map"]
    for shard in shards:
        with safe_open(str(shard), "pt") as f:
            assert set(f.keys()) == {k for k, v in index["weight_map"].items() if v == shard.name}
            assert all(f.get_slice(k).get_dtype() == "F32" for k in f.keys())
    assert bench.check_written(small, folder) == len(expected)
    rt = Runtime()
    engine = rt.engine("vibevoice", folder)
    voice = Audio(0.3 * torch.sin(torch.arange(24000) / 6.0).unsqueeze(0), 24000)
    audio, _ = rt.say(engine, "Hello there.", reference=voice, sampling=Sampling(seed=1, max_new_tokens=2))
    moved = {**index, "weight_map": {**index["weight_map"], "lm_head.weight": shards[0].name}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(moved))
    with pytest.raises(ValueError, match="lm_head.weight"):  # a key the index names but no shard holds
        bench.check_written(small, folder)
    assert audio.waveform.numel() == 2 * engine.hop and torch.isfinite(audio.waveform).all()  # it spoke every frame


def test_dias_writer_gives_the_published_files_the_loader_reads(bench: ModuleType, tmp_path: Path) -> None:
    """Dia's writer on the tiny configs: one safetensors file each for Dia and its DAC codec (as
    published), exactly the tensors the loader's meta build has, and the engine speaks from them."""
    require_engine("dia")
    from transformers import DiaConfig

    from mizuoto_runtime import Runtime
    from mizuoto_runtime.audio import Audio
    from mizuoto_runtime.engines import Sampling
    from mizuoto_runtime.engines.dia import tiny
    from mizuoto_runtime.engines.dia.checkpoint import DAC_FOLDER
    from mizuoto_runtime.engines.published import find

    published = find("Dia-1.6B")
    config = DiaConfig(encoder_config=dict(tiny.ENCODER), decoder_config=dict(tiny.DECODER),
                       delay_pattern=list(tiny.DELAY_PATTERN)).to_dict()
    small = dataclasses.replace(published, files={**published.files, "config.json": config,
                                                  f"{DAC_FOLDER}/config.json": {"model_type": "dac", **tiny.DAC}})
    folder = tmp_path / "written"
    written = bench.write_checkpoint(small, folder)
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.safetensors")) == [
        f"{DAC_FOLDER}/model.safetensors", "model.safetensors"]
    assert written == sum(p.stat().st_size for p in folder.rglob("*.safetensors"))
    assert bench.check_written(small, folder) > 0
    rt = Runtime()
    engine = rt.engine("dia", folder)
    voice = Audio(0.3 * torch.sin(torch.arange(24000) / 6.0).unsqueeze(0), 24000)
    audio, _ = rt.say(engine, "Hello there.", reference=voice, transcript="Hello.",
                      sampling=Sampling(seed=1, max_new_tokens=24))
    assert audio.waveform.numel() > 0 and torch.isfinite(audio.waveform).all()


def test_omnivoices_writer_gives_the_published_files_the_loader_reads(bench: ModuleType, tmp_path: Path) -> None:
    """OmniVoice's writer on the tiny configs: the LLM and the Higgs Audio v2 codec in one
    safetensors file each (as published), exactly the tensors the loader's meta build has, the
    text tokenizer and feature extractor beside them, and the engine speaks from them."""
    require_engine("omnivoice")
    from omnivoice import OmniVoiceConfig
    from transformers import HiggsAudioV2TokenizerConfig, Qwen3Config

    from mizuoto_runtime import Runtime
    from mizuoto_runtime.engines import Sampling
    from mizuoto_runtime.engines.omnivoice import tiny
    from mizuoto_runtime.engines.published import find

    published = find("OmniVoice")
    config = OmniVoiceConfig(audio_vocab_size=tiny.CODEBOOK + 1, audio_mask_id=tiny.CODEBOOK, num_audio_codebook=8,
                             llm_config=Qwen3Config(**tiny.LLM).to_dict()).to_dict()
    codec = HiggsAudioV2TokenizerConfig(acoustic_model_config=dict(tiny.ACOUSTIC), semantic_model_config=dict(tiny.SEMANTIC),
                                        codebook_size=tiny.CODEBOOK, codebook_dim=64,
                                        target_bandwidths=tiny.TARGET_BANDWIDTHS).to_dict()
    small = dataclasses.replace(published, files={**published.files, "config.json": config,
                                                  "audio_tokenizer/config.json": codec})
    folder = tmp_path / "written"
    written = bench.write_checkpoint(small, folder)
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.safetensors")) == [
        "audio_tokenizer/model.safetensors", "model.safetensors"]
    assert written == sum(p.stat().st_size for p in folder.rglob("*.safetensors"))
    assert bench.check_written(small, folder) > 0
    rt = Runtime()
    engine = rt.engine("omnivoice", folder)
    engine.steps = 2
    audio, _ = rt.say(engine, "Hello there.", sampling=Sampling(seed=1))
    assert audio.waveform.numel() > 0 and torch.isfinite(audio.waveform).all()


def test_voxcpm2s_writer_gives_the_published_files_the_loader_reads(bench: ModuleType, tmp_path: Path) -> None:
    """VoxCPM 2's writer on the tiny config: ``model.safetensors`` (all but the audio VAE) and
    ``audiovae.pth`` (the VAE, a plain dict of tensors) as published, exactly the tensors the
    loader's meta build has; its stop head never stops, so the engine speaks every patch asked."""
    require_engine("voxcpm2")
    from mizuoto_runtime import Runtime
    from mizuoto_runtime.engines import Sampling
    from mizuoto_runtime.engines.published import find
    from mizuoto_runtime.engines.voxcpm2 import tiny

    published = find("VoxCPM2")
    small = dataclasses.replace(published, dtype=torch.float32, files={
        **published.files, "config.json": tiny.model_config(len(tiny._vocabulary()[0]), "float32")})
    folder = tmp_path / "written"
    written = bench.write_checkpoint(small, folder)
    assert written == (folder / "model.safetensors").stat().st_size + (folder / "audiovae.pth").stat().st_size
    assert bench.check_written(small, folder) > 0
    rt = Runtime()
    engine = rt.engine("voxcpm2", folder)
    audio, _ = rt.say(engine, "Hello from the tiny model.", sampling=Sampling(seed=1, max_new_tokens=5))
    assert audio.waveform.numel() == 5 * tiny.PATCH_SIZE * 1920 and torch.isfinite(audio.waveform).all()
