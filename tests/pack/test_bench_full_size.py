"""`bench/full_size.py` (issue 35): its weight files are what the engines' loaders read, written
one tensor at a time; on the tiny checkpoint (``--dry-run``) every measurement runs."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import load_file

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


def test_aligned_files_load_as_the_files_pages(bench: ModuleType, tmp_path: Path) -> None:
    """``--align 64``: the data starts where a fresh allocation would, so the loader keeps the
    weights as the file's pages; at the library's 8 bytes (most published files) it copies them
    unless the header happens to end aligned."""
    import struct

    from mizuoto_runtime.memory.mapped import file_backed
    from mizuoto_runtime.nn.loading import load_safetensors

    shapes = {"weight": torch.empty(8, 16, device="meta"), "bias": torch.empty(8, device="meta")}
    for align in (8, 64):
        path = tmp_path / f"a{align}.safetensors"
        bench.write_safetensors(path, shapes, lambda n, like: torch.ones(like.shape), align=align)
        start = 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]
        assert start % align == 0
        model = load_safetensors(torch.nn.Linear(16, 8), path)
        assert file_backed(model.weight) == (start % 64 == 0) and torch.equal(model.weight, torch.ones(8, 16))
    assert file_backed(model.weight)


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


def _clones(engine_id: str, folder: Path, rate: int, tokens: int) -> torch.Tensor:
    """The waveform the engine loaded from `folder` says for a one-second tone voice and its
    transcript, with at most `tokens` new tokens; it is finite."""
    from mizuoto_runtime import Runtime
    from mizuoto_runtime.audio import Audio
    from mizuoto_runtime.engines import Sampling

    rt = Runtime()
    engine = rt.engine(engine_id, folder)
    voice = Audio(0.3 * torch.sin(torch.arange(rate) / 6.0).unsqueeze(0), rate)
    audio, _ = rt.say(engine, "Hello there.", reference=voice, transcript="Hello.",
                      sampling=Sampling(seed=1, max_new_tokens=tokens))
    assert audio.waveform.numel() > 0 and torch.isfinite(audio.waveform).all()
    return audio.waveform


def test_dias_writer_gives_the_published_files_the_loader_reads(bench: ModuleType, tmp_path: Path) -> None:
    """Dia's writer on the tiny configs: one safetensors file each for Dia and its DAC codec (as
    published), exactly the tensors the loader's meta build has, and the engine speaks from them."""
    require_engine("dia")
    from transformers import DiaConfig

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
    _clones("dia", folder, 24000, tokens=24)


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
    codec = HiggsAudioV2TokenizerConfig(acoustic_model_config=dict(tiny.ACOUSTIC),
                                        semantic_model_config=dict(tiny.SEMANTIC),
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



def _copied(source: Path) -> Callable[[Path], None]:
    return lambda path: shutil.copyfile(source, path)


def test_indextts2s_writer_gives_the_published_files_the_loader_reads(bench: ModuleType, tmp_path: Path) -> None:
    """IndexTTS-2's writer on the tiny checkpoint's configs and stand-ins (its published files
    where the published model has content, empty where it has none): every torch and
    safetensors file holds exactly the tensors the loaders' meta builds have, at their places
    (s2mel's ``net`` parts, BigVGAN's ``generator``), w2v-BERT whole, and the engine speaks
    from it."""
    require_engine("indextts2")
    from mizuoto_runtime import Runtime
    from mizuoto_runtime.audio import Audio
    from mizuoto_runtime.engines import Sampling
    from mizuoto_runtime.engines.indextts2 import tiny
    from mizuoto_runtime.engines.published import find

    reference = tiny.write(tmp_path / "tiny")
    published = find("IndexTTS-2")
    small = dataclasses.replace(published, dtype=torch.float32, files={
        name: None if content is None else _copied(reference / name) for name, content in published.files.items()})
    folder = tmp_path / "written"
    written = bench.write_checkpoint(small, folder)
    assert written == sum(p.stat().st_size for p in folder.rglob("*") if p.suffix in (".pth", ".pt", ".bin",
                                                                                   ".safetensors")
                          and p.name not in ("feat1.pt", "feat2.pt", "wav2vec2bert_stats.pt"))
    assert bench.check_written(small, folder) > 0
    w2v = json.loads((folder / "hf_cache" / "w2v-bert-2.0" / "config.json").read_text())["num_hidden_layers"]
    assert f"encoder.layers.{w2v - 1}.ffn1.intermediate_dense.weight" in load_file(
        folder / "hf_cache" / "w2v-bert-2.0" / "model.safetensors")
    rt = Runtime()
    engine = rt.engine("indextts2", folder)
    voice = Audio(0.3 * torch.sin(torch.arange(24000) / 6.0).unsqueeze(0), 24000)
    audio, _ = rt.say(engine, "Hello there.", reference=voice, sampling=Sampling(seed=1, max_new_tokens=6))
    assert audio.waveform.numel() > 0 and torch.isfinite(audio.waveform).all()


def test_gptsovits_writer_gives_the_published_files_the_loader_reads(bench: ModuleType, tmp_path: Path) -> None:
    """GPT-SoVITS's writer on the tiny voice's configs (its GPT and SoVITS files as stand-ins,
    its HuBERT and BERT configs): the pair's ``weight`` dicts, HuBERT's and BERT's
    ``pytorch_model.bin`` hold exactly the tensors the loader's meta builds have, the pair in
    float16 with the configs beside them, and the engine loads all four and speaks from them."""
    require_engine("gptsovits")
    from mizuoto_runtime import Runtime
    from mizuoto_runtime.audio import Audio
    from mizuoto_runtime.engines import Sampling
    from mizuoto_runtime.engines.gptsovits import published as gsv
    from mizuoto_runtime.engines.gptsovits import tiny
    from mizuoto_runtime.engines.gptsovits.bert import BERT_FOLDER
    from mizuoto_runtime.engines.gptsovits.checkpoint import HUBERT_FOLDER
    from mizuoto_runtime.engines.published import find

    reference = tiny.write(tmp_path / "tiny")
    small = dataclasses.replace(find("GPT-SoVITS v2 (pretrained)"), files={
        gsv.GPT_FILE: _copied(reference / "tiny-e15.ckpt"), gsv.SOVITS_FILE: _copied(reference / "tiny_e8_s16.pth"),
        f"{HUBERT_FOLDER}/config.json": _copied(reference / HUBERT_FOLDER / "config.json"),
        f"{BERT_FOLDER}/config.json": _copied(reference / BERT_FOLDER / "config.json")})
    folder = tmp_path / "written"
    written = bench.write_checkpoint(small, folder)
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.suffix in (".ckpt", ".pth", ".bin")
                  ) == sorted([gsv.GPT_FILE, gsv.SOVITS_FILE, f"{HUBERT_FOLDER}/pytorch_model.bin",
                               f"{BERT_FOLDER}/pytorch_model.bin"])
    assert written == sum(p.stat().st_size for p in folder.rglob("*") if p.suffix in (".ckpt", ".pth", ".bin"))
    assert bench.check_written(small, folder) > 0
    gpt = torch.load(folder / gsv.GPT_FILE, weights_only=True)
    assert gpt["config"]["model"] == tiny.T2S_MODEL and all(v.dtype == torch.float16 for v in gpt["weight"].values())
    rt = Runtime()
    engine = rt.engine("gptsovits", folder)
    assert {h.name for h in engine.handles()} == {"t2s", "vits", "hubert", "bert"}
    voice = Audio(0.3 * torch.sin(torch.arange(32000) / 6.0).unsqueeze(0), 32000)
    audio, _ = rt.say(engine, "Hello there.", reference=voice, transcript="Hello.",
                      sampling=Sampling(seed=1, max_new_tokens=6))
def test_higgs_audios_writer_gives_the_published_files_the_loader_reads(bench: ModuleType, tmp_path: Path) -> None:
    """Higgs Audio v2's writer on the tiny configs, in shards small enough to make several: the
    LLM's shards and index and the audio tokenizer's one float32 file hold exactly the tensors
    the loader's meta build has, the configs take the tokenizer's ids, and the engine speaks."""
    require_engine("higgsaudio")
    from transformers import HiggsAudioV2Config

    from mizuoto_runtime import Runtime
    from mizuoto_runtime.audio import Audio
    from mizuoto_runtime.engines import Sampling
    from mizuoto_runtime.engines.higgsaudio import tiny
    from mizuoto_runtime.engines.higgsaudio.checkpoint import AUDIO_TOKENIZER_FOLDER
    from mizuoto_runtime.engines.published import find

    published = find("Higgs Audio v2 generation 3B base")
    small = dataclasses.replace(published, dtype=torch.float32, files={
        **published.files, "config.json": HiggsAudioV2Config(**tiny.LLM, dtype="float32").to_dict(),
        f"{AUDIO_TOKENIZER_FOLDER}/config.json": tiny.codec_config().to_dict()})
    folder = tmp_path / "written"
    written = bench.write_checkpoint(small, folder, shard_bytes=2 << 20)
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    codec = folder / AUDIO_TOKENIZER_FOLDER / "model.safetensors"
    assert len(shards) > 2 and written == sum(p.stat().st_size for p in (*shards, codec))
    assert bench.check_written(small, folder) > 0
    ids = tiny.token_ids(tiny.text_tokenizer())
    config = json.loads((folder / "config.json").read_text())
    assert {k: config[k] for k in ids} == ids and config["vocab_size"] == tiny.LLM["vocab_size"]
    rt = Runtime()
    engine = rt.engine("higgsaudio", folder)
    voice = Audio(0.3 * torch.sin(torch.arange(24000) / 6.0).unsqueeze(0), 24000)
    audio, _ = rt.say(engine, "Hello there.", reference=voice, transcript="Hello.",
                      sampling=Sampling(seed=1, max_new_tokens=12))
    frames = 12 - config["num_codebooks"]  # after the delay pattern's frames, every one spoken (no EOS)
    assert audio.waveform.numel() == frames * engine.codec.config.hop_length and torch.isfinite(audio.waveform).all()


def test_csms_writer_gives_the_published_file_the_loader_reads(bench: ModuleType, tmp_path: Path) -> None:
    """CSM's writer on the tiny config: one safetensors file, as published, with the backbone,
    depth decoder and the Mimi codec under ``codec_model.`` (the loader takes it out), exactly
    the loader's meta build; the config takes the tokenizer's ids; the engine speaks from it."""
    require_engine("csm")
    from transformers import CsmConfig

    from mizuoto_runtime import Runtime
    from mizuoto_runtime.audio import Audio
    from mizuoto_runtime.engines import Sampling
    from mizuoto_runtime.engines.csm import tiny
    from mizuoto_runtime.engines.csm.config import FRAME_SAMPLES
    from mizuoto_runtime.engines.published import find
    from mizuoto_runtime.nn.loading import SafetensorsFile

    published = find("CSM-1B")
    config = CsmConfig(**{**tiny.BACKBONE, "audio_token_id": 128002}, depth_decoder_config=dict(tiny.DEPTH),
                       codec_config=dict(tiny.MIMI)).to_dict()
    small = dataclasses.replace(published, files={**published.files, "config.json": config})
    folder = tmp_path / "written"
    written = bench.write_checkpoint(small, folder)
    assert [p.name for p in folder.rglob("*.safetensors")] == ["model.safetensors"]
    assert written == (folder / "model.safetensors").stat().st_size
    with SafetensorsFile(folder / "model.safetensors") as f:
        assert any(k.startswith("codec_model.") for k in f.entries)
    assert bench.check_written(small, folder) > 0
    assert json.loads((folder / "config.json").read_text())["audio_token_id"] == tiny.AUDIO
    rt = Runtime()
    engine = rt.engine("csm", folder)
    voice = Audio(0.3 * torch.sin(torch.arange(24000) / 6.0).unsqueeze(0), 24000)
    audio, _ = rt.say(engine, "Hello there.", reference=voice, transcript="Hello.",
                      sampling=Sampling(seed=1, max_new_tokens=3))
    assert audio.waveform.numel() == 3 * FRAME_SAMPLES and torch.isfinite(audio.waveform).all()  # every frame


def test_chatterboxs_writer_gives_the_published_files_the_loader_reads(bench: ModuleType, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Chatterbox Multilingual's writer at the tiny sizes (the folder has no config: the meta
    build is held to them): the files its loader reads in their published formats (T3's
    safetensors, ``ve.pt`` / ``s3gen.pt`` pickles of tensors), exactly the meta build's tensors,
    the English files left empty; the engine, at the sizes it reads back from them, speaks."""
    require_engine("chatterbox")
    from mizuoto_runtime import Runtime
    from mizuoto_runtime.audio import Audio
    from mizuoto_runtime.engines import Sampling
    from mizuoto_runtime.engines.chatterbox import checkpoint, tiny
    from mizuoto_runtime.engines.published import find

    real_t3, real_s3gen = checkpoint.build_t3, checkpoint.build_s3gen
    monkeypatch.setattr(checkpoint, "build_t3", lambda sizes, multilingual=False:
                        real_t3(tiny.TINY_MULTILINGUAL, multilingual))
    monkeypatch.setattr(checkpoint, "build_s3gen", lambda sizes: real_s3gen(tiny.TINY))
    model = find("Chatterbox Multilingual")
    folder = tmp_path / "written"
    written = bench.write_checkpoint(model, folder)
    read = [folder / n for n in (checkpoint.MULTILINGUAL_T3, checkpoint.VE_PICKLE, checkpoint.S3GEN_PICKLE)]
    assert written == sum(p.stat().st_size for p in read) and all(p.stat().st_size > 0 for p in read)
    assert bench.check_written(model, folder) > 0
    empty = (checkpoint.T3_FILE, checkpoint.VE_FILE, checkpoint.S3GEN_FILE)
    assert all((folder / n).stat().st_size == 0 for n in empty)
    monkeypatch.undo()
    rt = Runtime()
    engine = rt.engine("chatterbox", folder / model.choice)
    assert engine.models.sizes == tiny.TINY_MULTILINGUAL
    voice = Audio(0.3 * torch.sin(torch.arange(24000) / 6.0).unsqueeze(0), 24000)
    audio, _ = rt.say(engine, "Hello there.", reference=voice, sampling=Sampling(seed=1, max_new_tokens=4))
    assert audio.waveform.numel() > 0 and torch.isfinite(audio.waveform).all()


def test_cosyvoices_writer_gives_the_published_files_the_loader_reads(bench: ModuleType, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """CosyVoice 3's writer (CosyVoice 2's differs only in the yaml it reads) on the tiny yaml
    and BlankEN config: ``llm.pt``, ``flow.pt`` and ``hift.pt`` hold exactly the keys the tiny
    writer's (upstream's layout) do, in float32 (the tied head saved, HiFT weight-normed), the
    LM's stop rows zeroed, and the engine clones a voice from them, speaking every token it is
    asked for (200 stop ids: random rows stop at once). Its speech tokenizer file (the
    published 1 GB one here replaced by the tiny graph) gives, through s3tokenizer's own
    mapping, exactly the tensors of s3tokenizer's model, for v2 and v3, at a narrow width."""
    require_engine("cosyvoice")
    import s3tokenizer
    from s3tokenizer.model_v2 import ModelConfig
    from s3tokenizer.model_v3 import ModelConfigV3

    from mizuoto_runtime.engines.cosyvoice import tiny
    from mizuoto_runtime.engines.cosyvoice.checkpoint import BLANK_EN, YAMLS
    from mizuoto_runtime.engines.published import find

    narrow = dict(n_audio_state=128, n_audio_head=2, n_audio_layer=2)
    monkeypatch.setattr(bench, "S3_TOKENIZER_SIZES", narrow)
    for version, cls, config, convert in ((2, s3tokenizer.S3TokenizerV2, ModelConfig, s3tokenizer.onnx2torch),
                                          (3, s3tokenizer.S3TokenizerV3, ModelConfigV3, s3tokenizer.onnx2torch_v3)):
        path = tmp_path / f"speech_tokenizer_v{version}.onnx"
        bench.write_s3_tokenizer(path, version, torch.Generator().manual_seed(0))
        mapped = {k: tuple(v.shape) for k, v in convert(str(path), None, False).items()}
        model = cls(path.stem, config(**narrow))
        assert mapped == {k: tuple(v.shape) for k, v in model.state_dict().items()}, version

    monkeypatch.setattr(bench, "write_s3_tokenizer", lambda path, version, gen: None)
    version = 3
    published = find("Fun-CosyVoice3-0.5B-2512")
    small = dataclasses.replace(published, files={**published.files, YAMLS[version]: tiny.model_yaml(version),
                                                  f"{BLANK_EN}/config.json": tiny.blank_en_config(version)})
    folder = tmp_path / "written"
    written = bench.write_checkpoint(small, folder)
    reference = tiny.write(tmp_path / "tiny", version=str(version))
    assert written == sum((folder / name).stat().st_size for name in ("llm.pt", "flow.pt", "hift.pt"))
    for name in ("llm.pt", "flow.pt", "hift.pt"):
        mine = torch.load(folder / name, weights_only=True)
        theirs = torch.load(reference / name, weights_only=True)
        assert {k: v.shape for k, v in mine.items()} == {k: v.shape for k, v in theirs.items()}, name
        assert all(v.dtype == torch.float32 for v in mine.values()), name
    llm = torch.load(folder / "llm.pt", weights_only=True)
    assert not llm["llm_decoder.weight"][tiny.SPEECH_TOKENS:].any()
    # four 25 Hz speech tokens at 24 kHz, none a stop
    assert _clones("cosyvoice", folder, 24000, tokens=4).shape[-1] == 4 * 24000 // 25


def test_fish_speechs_writer_gives_the_published_files_the_loader_reads(bench: ModuleType, tmp_path: Path) -> None:
    """Fish Speech's writer on the tiny S2-Pro config and codec shapes: the shards' index names
    exactly the keys of the tiny writer's (upstream's layout), ``codec.pth`` holds its keys
    (weight norm in both forms, the shared quantizer once), the tokenizer has a semantic token
    per code, and the engine clones a voice from them."""
    require_engine("fishspeech")
    from mizuoto_runtime.engines.fishspeech import published, tiny
    from mizuoto_runtime.engines.published import find

    reference = tiny.write(tmp_path / "tiny")
    s2 = find("Fish Audio S2-Pro")
    small = dataclasses.replace(s2, dtype=torch.float32, files={
        **s2.files, "config.json": json.loads((reference / "config.json").read_text()),
        "codec.pth": lambda path: published.write_codec(path, tiny.CODEC)})
    folder = tmp_path / "written"
    written = bench.write_checkpoint(small, folder, shard_bytes=1 << 20)
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and written == sum(p.stat().st_size for p in [*shards, folder / "codec.pth"])
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    expected = json.loads((reference / "model.safetensors.index.json").read_text())["weight_map"]
    assert index.keys() == expected.keys()
    codec = torch.load(folder / "codec.pth", weights_only=True)
    theirs = torch.load(reference / "codec.pth", weights_only=True)
    assert {k: v.shape for k, v in codec.items()} == {k: v.shape for k, v in theirs.items()}
    assert json.loads((folder / "tokenizer.json").read_text()) == json.loads((reference / "tokenizer.json").read_text())
    _clones("fishspeech", folder, 44100, tokens=3)
