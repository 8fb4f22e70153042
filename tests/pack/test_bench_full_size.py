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
