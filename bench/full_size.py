"""Engines at their published size (issue 35, item 3): random weights written in the published
layout, then the runtime measured on them.

For each published model (`engines.published`: its config files as data) whose checkpoint fits
in this machine's memory:

1. **write** — the published config files, the files a run needs beside them (a tokenizer: the
   engine's tiny one, its special ids put in the config, which changes no shape), and random
   weights in the published file layout and precision, each weight file streamed tensor by
   tensor (`write_safetensors`: the header first, then one tensor at a time; nothing is held
   twice). One checkpoint at a time under ``--root``; deleted after measuring (``--keep``: not).
2. **measure**, in a fresh process (`measure`, so the load and the first audio start cold):
   - ``cold_to_audio_s``: process start → the first request's audio (imports, load, voice
     prompt, a few tokens, decode);
   - ``import_s`` and ``import_rss_gb``: importing what the loader imports (`import_loader`);
   - ``load_s`` and ``load_rss_ratio``: the engine's load after those imports, and the
     process's peak RSS during it above its RSS before it, over the checkpoint's bytes (goal ≤ 1.1);
   - every phase of one request: its working-memory estimate over its measured peak (the CPU:
     tensor storage it creates, `engines.PeakTracker`; CUDA: ``max_memory_allocated`` above
     the phase's start; goal 1.0-1.3);
   - ms per token of the token-loop phase (``talker``): plain, and on a device the size of the
     fit table's smallest card that holds the model's minimum working set, as the runtime places
     it there and with every unit streamed (``compute.vram_mode = none``); the streamed MB per
     token beside it, and the link-bound lower limit at PCIe 4.0 / 5.0 from the fit table.
     On the CPU that device is simulated (``compute.simulate_vram_mb``); with ``--device cuda``
     it is the GPU, capped at the card's size.

A new engine joins with a `Writer` in `WRITERS` (its weight files and run files) and a
`Request`; ``--model NAME`` then runs any of its published models by name (VibeVoice-7B when
its engine lands: ``--model VibeVoice-7B --tokens 8``).

    python bench/full_size.py                                  # every published model that fits, one at a time
    python bench/full_size.py --model Qwen3-TTS-12Hz-1.7B-Base
    python bench/full_size.py --engine qwen3tts --device cuda  # on a lent GPU
    python bench/full_size.py --dry-run                        # the same code path on tiny checkpoints
    python bench/full_size.py --g2pw                           # GPT-SoVITS's load beside a published-size g2pW

Output: a table, and JSON in ``--out`` (default ``bench/out/full_size.json``; rows are merged by
model, so runs of one model at a time build one table).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import logging
import os
import platform
import resource
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mizuoto_runtime.engines.published import PublishedModel, find, published_models  # noqa: E402

log = logging.getLogger("full_size")

MB, GB = 1 << 20, 1 << 30
ROOT = Path(os.environ.get("MIZUOTO_FULL_SIZE_ROOT", "/work/fullsize"))
OUT = Path(__file__).resolve().parent / "out" / "full_size.json"
HOST_HEADROOM = 4 * GB  # a model is built only where its checkpoint leaves this much memory free
LOAD_OVERHEAD = 1.6  # host memory while loading and running, x the checkpoint's bytes (to decide it fits)
# Where the safetensors library starts a file's data: a multiple of 8 bytes (its header padded so).
# The loader keeps a tensor as the file's pages only where a fresh allocation would be aligned
# the same (`memory.mapped.ALIGNMENT`, 64): ``--align 64`` writes files it can.
PUBLISHED_ALIGN = 8
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".onnx")  # what counts as checkpoint bytes
_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
              torch.int32: "I32", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL", torch.float64: "F64"}


# ---- writing ----------------------------------------------------------------------------------
SHARD_BYTES = 4 * GB  # a sharded checkpoint's files: at most this much each (one tensor may be more)


@dataclasses.dataclass(frozen=True)
class WeightFile:
    """One weight file of a checkpoint: `module`'s tensors (meta or real) under `key(name)`;
    several modules where one file holds them all (a name two of them have, once: the first's).
    With `shard_bytes`: the layout ``save_pretrained`` writes instead (a transformers model's
    ``-hf`` folder): each tied tensor once, under its first name, in files of at most
    `shard_bytes` named ``<stem>-0000i-of-0000N.safetensors`` after `path`, and
    ``<path>.index.json`` mapping each key to its file. A torch file's `stored(key, made)`:
    the entries a tensor is saved as (a weight-normed conv's g/v pair; a tied head under its
    own name too)."""

    path: str  # relative to the checkpoint folder
    module: nn.Module | tuple[nn.Module, ...]
    key: Callable[[str], str] = str
    shard_bytes: int | None = None
    # A torch file's object around its tensors (``{"generator": tensors}``, a dict with the
    # file's config beside them); None: the dict of tensors itself.
    wrap: Callable[[dict[str, torch.Tensor]], Any] | None = None
    drop: tuple[str, ...] = ()  # the module's tensors the published file leaves out (computed at load)
    stored: Callable[[str, torch.Tensor], dict[str, torch.Tensor]] | None = None

    def torch_object(self, tensors: dict[str, torch.Tensor]) -> Any:
        """What the torch file holds: each tensor as the file stores it (`stored`), inside the
        file's object (`wrap`)."""
        stored = self.stored or (lambda key, made: {key: made})
        entries = {k: v for key, t in tensors.items() for k, v in stored(key, t).items()}
        return entries if self.wrap is None else self.wrap(entries)


def random_tensor(name: str, like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random values for a weight of `like`'s shape and dtype: matrices N(0, 1/fan_in) (the
    activations stay in range through many layers), norm weights one, biases zero; a real
    tensor (a buffer the model's code built) is kept as built."""
    if not like.is_meta:
        return like.detach()
    if like.dim() >= 2:
        fan_in = like[0].numel()
        out = torch.randn(like.shape, generator=gen).mul_(fan_in ** -0.5)  # in place: one float32 copy
    elif name.endswith("bias"):
        out = torch.zeros(like.shape)
    else:
        out = torch.ones(like.shape)
    return out.to(like.dtype) if like.dtype.is_floating_point else out.to(like.dtype).zero_()


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor],
                      make: Callable[[str, torch.Tensor], torch.Tensor], align: int = PUBLISHED_ALIGN) -> int:
    """A safetensors file of `tensors`' names, shapes and dtypes (meta is enough), each value
    made by `make(name, like)` when its turn comes and written at once: the header first, then
    one tensor at a time, so at most one is in memory. The header is padded with spaces so the
    data starts at a multiple of `align` bytes. Returns the file's bytes."""
    header: dict[str, Any] = {}
    offset = 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % align)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, like in tensors.items():
            value = make(name, like).contiguous()
            if tuple(value.shape) != tuple(like.shape) or value.dtype != like.dtype:
                raise ValueError(f"{path.name}: {name} made as {value.dtype} {tuple(value.shape)}, "
                                 f"expected {like.dtype} {tuple(like.shape)}")
            f.write(value.reshape(-1).view(torch.uint8).numpy().data)
    return path.stat().st_size


@dataclasses.dataclass(frozen=True)
class Request:
    """The measured request: text, a reference voice of `reference_s` seconds (0: none) and its
    transcript, and at most `tokens` new tokens or frames."""

    text: str = "Hello there, this is a full size model speaking."
    reference_s: float = 3.0
    transcript: str = "Hello there."
    speaker: str | None = None
    instruct: str | None = None
    steps: int | None = None  # ODE / diffusion steps, where the engine has them (fewer: a shorter run)
    # Frames the loop makes before the first audio frame (a delay pattern's), added to the
    # tokens asked for so that the decoder has frames to decode.
    lead_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class Writer:
    """How an engine's published checkpoint is written: `run_files(model, folder)` writes what a
    run needs besides configs and weights (and may edit the configs' token ids); `weights(folder)`
    gives its weight files, built on meta from the configs in `folder`."""

    run_files: Callable[[PublishedModel, Path], None]
    weights: Callable[[PublishedModel, Path], list[WeightFile]]
    request: Callable[[PublishedModel], Request]
    token_phase: str = "talker"
    # What the written values need besides `random_tensor` (an LM that speaks rather than stops
    # at once): given the folder's configs, a function (checkpoint key, made tensor) -> the
    # tensor written.
    values: Callable[[Path], Callable[[str, torch.Tensor], torch.Tensor]] | None = None


QWEN3TTS_SPEAKER = "full_size"  # CustomVoice's one speaker (`_qwen3tts_run_files`)


def _qwen3tts_run_files(model: PublishedModel, folder: Path) -> None:
    """The tiny writer's tokenizer and preprocessor files; the config's text token ids set to
    that tokenizer's (the embedding keeps its published rows)."""
    from mizuoto_runtime.engines.qwen3tts import tiny
    from mizuoto_runtime.engines.tiny import write_json

    vocab, merges, tokenizer_config, special = tiny.text_tokenizer()
    write_json(folder / "vocab.json", vocab)
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges), encoding="utf-8")
    write_json(folder / "tokenizer_config.json", tokenizer_config)
    write_json(folder / "preprocessor_config.json", tiny.PREPROCESSOR)
    write_json(folder / "speech_tokenizer" / "preprocessor_config.json", tiny.SPEECH_PREPROCESSOR)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.update(im_start_token_id=special["<|im_start|>"], im_end_token_id=special["<|im_end|>"],
                  tts_pad_token_id=special["<tts_pad>"], tts_bos_token_id=special["<tts_text_bos>"],
                  tts_eos_token_id=special["<tts_text_eod>"])
    talker = config["talker_config"]
    if model.version == "custom_voice" and not talker.get("spk_id"):
        # the published speakers' ids are not data here: one named voice, a free control id
        talker.update(spk_id={QWEN3TTS_SPEAKER: 3000}, spk_is_dialect={QWEN3TTS_SPEAKER: False})
    write_json(folder / "config.json", config)


def _qwen3tts_weights(model: PublishedModel, folder: Path) -> list[WeightFile]:
    from mizuoto_runtime.engines.checkpoint_files import config_from
    from mizuoto_runtime.engines.qwen3tts import compat
    from mizuoto_runtime.engines.qwen3tts.checkpoint import import_upstream
    from mizuoto_runtime.nn.loading import build_on_meta

    import_upstream()
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    main = build_on_meta(lambda: Qwen3TTSForConditionalGeneration(config_from(Qwen3TTSConfig, folder)), model.dtype)
    codec_config = config_from(Qwen3TTSTokenizerV2Config, folder / "speech_tokenizer")
    codec = build_on_meta(lambda: Qwen3TTSTokenizerV2Model(codec_config), torch.float32)  # published in float32
    return [WeightFile("model.safetensors", main),
            WeightFile("speech_tokenizer/model.safetensors", codec, compat.codec_key)]


def _qwen3tts_request(model: PublishedModel) -> Request:
    if model.version == "custom_voice":
        return Request(reference_s=0, transcript="", speaker=QWEN3TTS_SPEAKER)
    if model.version == "voice_design":
        return Request(reference_s=0, transcript="", instruct="A calm voice.")
    return Request()


def _f5tts_run_files(model: PublishedModel, folder: Path) -> None:
    """The tiny writer's characters first in ``vocab.txt`` (so text maps to tokens), the
    published count of lines kept (the text embedding's rows)."""
    from mizuoto_runtime.engines.f5tts import published, tiny

    lines = list(tiny.VOCAB) + [f"t{i}" for i in range(published.VOCAB_SIZE - len(tiny.VOCAB))]
    (folder / "vocab.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _f5tts_weights(model: PublishedModel, folder: Path) -> list[WeightFile]:
    from mizuoto_runtime.engines.f5tts.checkpoint import (
        EMA_PREFIX,
        VOCODER_FOLDER,
        find_weights,
        load_flow,
        load_vocoder,
    )
    from mizuoto_runtime.nn.loading import shapes_only

    with shapes_only():  # the loader's own modules, on meta
        cfm, _ = load_flow(folder, model.dtype)
        vocos = load_vocoder(folder / VOCODER_FOLDER)
    return [WeightFile(find_weights(folder).name, cfm, lambda k: EMA_PREFIX + k),
            WeightFile(f"{VOCODER_FOLDER}/pytorch_model.bin", vocos)]


def _vibevoice_run_files(model: PublishedModel, folder: Path) -> None:
    """The tiny writer's processor files (generation config, feature extractor, a byte-level
    tokenizer with the published config's special ids, the chat template)."""
    from mizuoto_runtime.engines.vibevoice import checkpoint, tiny

    tiny.write_processor(folder, checkpoint.model_config(folder))


def _vibevoice_weights(model: PublishedModel, folder: Path) -> list[WeightFile]:
    """transformers' `VibeVoiceForConditionalGeneration` on meta, as the engine's loader builds
    it; its state-dict keys are the ``-hf`` checkpoint's."""
    from mizuoto_runtime.engines.vibevoice import checkpoint
    from mizuoto_runtime.nn.loading import shapes_only

    with shapes_only():
        built = checkpoint.load_model(folder, model.dtype)
    return [WeightFile(checkpoint.INDEX.removesuffix(".index.json"), built, shard_bytes=SHARD_BYTES)]


VIBEVOICE_STRENGTH = 1000.0  # the audio direction's size in the last layer's output (the residual stream's is ~10-100)


def _vibevoice_speaks(folder: Path) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """The LM favours the audio token, so a request speaks all its frames (`vibevoice.tiny`'s
    `favour_audio_token`, without the model in memory): the last layer's value bias is a fixed
    vector, which attention passes through whole; its output projection gains a rank-one term
    that turns that vector into `VIBEVOICE_STRENGTH` along a unit direction u; the audio
    token's head row (the embedding's where the head is tied) is 4 u."""
    from mizuoto_runtime.engines.vibevoice import tiny

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    text = config["text_config"]
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    gen = torch.Generator().manual_seed(1)
    u = torch.randn(text["hidden_size"], generator=gen)
    u /= u.norm()
    bias = torch.randn(text["num_key_value_heads"] * head_dim, generator=gen)
    bias *= tiny.AUDIO_TOKEN_BIAS / bias.norm()
    groups = text["num_attention_heads"] // text["num_key_value_heads"]
    per_head = bias.view(-1, head_dim).repeat_interleave(groups, dim=0).flatten()
    last = f"model.language_model.layers.{text['num_hidden_layers'] - 1}.self_attn."
    tied = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    head = "model.language_model.embed_tokens.weight" if tied else "lm_head.weight"

    def values(key: str, made: torch.Tensor) -> torch.Tensor:
        if key == last + "v_proj.bias":
            return bias.to(made.dtype)
        if key == last + "o_proj.weight":
            rank_one = torch.outer(u, per_head) * (VIBEVOICE_STRENGTH / per_head.dot(per_head))
            return (made.float() + rank_one).to(made.dtype)
        if key == head:
            made[config["audio_token_id"]] = (4.0 * u).to(made.dtype)
        return made

    return values


def _dia_run_files(model: PublishedModel, folder: Path) -> None:
    """Dia's tokenizer (bytes) and feature extractor, as the tiny writer saves them."""
    from transformers import DiaFeatureExtractor, DiaTokenizer

    from mizuoto_runtime.engines.dia.config import HOP, SAMPLE_RATE

    DiaTokenizer().save_pretrained(str(folder))
    DiaFeatureExtractor(sampling_rate=SAMPLE_RATE, hop_length=HOP).save_pretrained(str(folder))


def _dia_weights(model: PublishedModel, folder: Path) -> list[WeightFile]:
    """transformers' Dia and DAC on meta, as the engine's loader builds them (one file each, as
    published)."""
    from mizuoto_runtime.engines.dia import checkpoint
    from mizuoto_runtime.nn.loading import shapes_only

    with shapes_only():
        parts = checkpoint.load_model(folder, model.dtype)
    return [WeightFile("model.safetensors", parts.model),
            WeightFile(f"{checkpoint.DAC_FOLDER}/model.safetensors", parts.dac)]


INDEXTTS2_TOKENIZER_VOCAB = 100  # the tiny writer's bpe.model (its ids are under the published 12000 text tokens)


def _indextts2_run_files(model: PublishedModel, folder: Path) -> None:
    """The tiny writer's ``bpe.model`` and w2v-BERT's feature extractor; the speaker and emotion
    tables (``feat1.pt``, ``feat2.pt``) and w2v-BERT's statistics as random values of the
    published stand-ins' shapes (the stand-ins hold shapes, and the engine reads these values)."""
    from transformers import SeamlessM4TFeatureExtractor

    from mizuoto_runtime.engines.indextts2 import tiny
    from mizuoto_runtime.engines.indextts2.checkpoint import Layout, load_torch

    layout = Layout.open(folder)
    tiny.write_tokenizer(folder, INDEXTTS2_TOKENIZER_VOCAB)
    SeamlessM4TFeatureExtractor().save_pretrained(str(layout.aux("w2v_bert")))
    gen = torch.Generator().manual_seed(2)
    for key, default in (("spk_matrix", "feat1.pt"), ("emo_matrix", "feat2.pt")):
        path = layout.file(key, default)
        torch.save(torch.randn(load_torch(path).shape, generator=gen), path)
    stats = layout.file("w2v_stat", "wav2vec2bert_stats.pt")
    width = load_torch(stats)["mean"].shape
    torch.save({"mean": torch.randn(width, generator=gen) * 0.1, "var": torch.rand(width, generator=gen) + 0.5}, stats)


def _s2mel_net(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """``s2mel.pth``'s object: ``{"net": {part: its tensors}}`` for cfm, length_regulator, gpt_layer."""
    net: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        part, _, rest = key.partition(".")
        net.setdefault(part, {})[rest] = tensor
    return {"net": net}


def _indextts2_weights(model: PublishedModel, folder: Path) -> list[WeightFile]:
    """The engine's loaders on meta (`checkpoint`: GPT, s2mel, semantic codec, CAM++, BigVGAN),
    and w2v-BERT 2.0 whole as published (24 layers; the engine keeps 17). Weights are float32,
    as published (the engine halves the GPT when it runs in float16). The torch files are
    written whole (`write_checkpoint`): the largest, ``gpt.pth``, is ~2 GB."""
    from transformers import Wav2Vec2BertConfig, Wav2Vec2BertModel

    from mizuoto_runtime.engines.indextts2 import checkpoint
    from mizuoto_runtime.engines.indextts2.checkpoint import AUX, AUX_FILES
    from mizuoto_runtime.nn.loading import build_on_meta, shapes_only

    layout = checkpoint.Layout.open(folder)
    with shapes_only():
        gpt, s2mel = checkpoint.load_gpt(layout), checkpoint.load_s2mel(layout)
        codec, campplus = checkpoint.load_codec(layout), checkpoint.load_campplus(layout)
        bigvgan = checkpoint.load_bigvgan(layout)
    w2v_config = Wav2Vec2BertConfig.from_pretrained(str(layout.aux("w2v_bert")))
    w2v = build_on_meta(lambda: Wav2Vec2BertModel(w2v_config), torch.float32)
    return [WeightFile(layout.file("gpt_checkpoint", "gpt.pth").name, gpt),
            WeightFile(layout.file("s2mel_checkpoint", "s2mel.pth").name, s2mel, wrap=_s2mel_net),
            WeightFile(f"{AUX}/{AUX_FILES['codec']}", codec),
            WeightFile(f"{AUX}/{AUX_FILES['campplus']}", campplus),
            WeightFile(f"{AUX}/{AUX_FILES['bigvgan']}/bigvgan_generator.pt", bigvgan,
                       wrap=lambda tensors: {"generator": tensors}),
            WeightFile(f"{AUX}/{AUX_FILES['w2v_bert']}/model.safetensors", w2v)]


INDEXTTS2_NEVER = -30.0  # the mel head's bias for codes a trained model never predicts here


def _indextts2_speaks(folder: Path) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """The GPT neither starts again nor stops (a request speaks all its tokens), as the tiny
    writer's; BigVGAN's resampling filters are its low-pass, as built."""
    from mizuoto_runtime.engines.indextts2 import tiny
    from mizuoto_runtime.engines.indextts2.checkpoint import Layout

    gpt = Layout.open(folder).config["gpt"]

    def values(key: str, made: torch.Tensor) -> torch.Tensor:
        if key == "mel_head.bias":
            made[[gpt["start_mel_token"], gpt["stop_mel_token"]]] = INDEXTTS2_NEVER
        elif key.endswith("filter"):
            return tiny.lowpass().to(made.dtype).expand(made.shape).contiguous()
        return made

    return values


def _omnivoice_run_files(model: PublishedModel, folder: Path) -> None:
    """The tiny writer's byte-level text tokenizer (OmniVoice's control tokens as added tokens;
    its ids are inside the published vocabulary) and the codec's feature extractor."""
    from transformers import DacFeatureExtractor

    from mizuoto_runtime.engines.omnivoice import tiny

    tiny.text_tokenizer().save_pretrained(str(folder))
    codec = json.loads((folder / "audio_tokenizer" / "config.json").read_text(encoding="utf-8"))
    hop = 1
    for ratio in codec["acoustic_model_config"]["downsampling_ratios"]:
        hop *= ratio
    DacFeatureExtractor(sampling_rate=codec["sample_rate"], hop_length=hop).save_pretrained(
        str(folder / "audio_tokenizer"))


def _omnivoice_weights(model: PublishedModel, folder: Path) -> list[WeightFile]:
    """`omnivoice.OmniVoice` and transformers' Higgs Audio v2 tokenizer on meta, as the engine's
    loader builds them (one safetensors file each, as published)."""
    from mizuoto_runtime.engines.omnivoice import checkpoint
    from mizuoto_runtime.nn.loading import shapes_only

    with shapes_only():
        llm, codec = checkpoint.load_model(folder, model.dtype)
    return [WeightFile("model.safetensors", llm), WeightFile("audio_tokenizer/model.safetensors", codec)]


def _omnivoice_speaks(folder: Path) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """The codec decodes to sound (`tiny.randomize`'s values for the Higgs tokenizer): its
    codebooks are buffers, built as zeros (decoding to silence, which upstream's post-processing
    trims to nothing), so they are drawn at unit scale with positive cluster sizes; Snake alphas
    near 1."""
    gen = torch.Generator().manual_seed(1)

    def values(key: str, made: torch.Tensor) -> torch.Tensor:
        if key.endswith(("codebook.embed", "codebook.embed_avg")):
            return torch.randn(made.shape, generator=gen).to(made.dtype)
        if key.endswith("cluster_size"):
            return (1.0 + torch.rand(made.shape, generator=gen)).to(made.dtype)
        if key.endswith(".alpha"):
            return (1.0 + 0.1 * torch.rand(made.shape, generator=gen)).to(made.dtype)
        return made

    return values


# The S3 speech tokenizer's sizes other than s3tokenizer's published defaults (tests: a narrow one).
S3_TOKENIZER_SIZES: dict[str, int] = {}
# s3tokenizer's names for the v2 file's convolution and projection initializers (`onnx2torch`).
_S3_V2_NAMES = {"encoder.conv1.weight": "onnx::Conv_2216", "encoder.conv1.bias": "onnx::Conv_2217",
                "encoder.conv2.weight": "onnx::Conv_2218", "encoder.conv2.bias": "onnx::Conv_2219",
                "quantizer._codebook.project_down.weight": "onnx::MatMul_2536",
                "quantizer._codebook.project_down.bias": "quantizer.project_in.bias"}


def _s3_node(version: int, key: str) -> tuple[str, str]:
    """The ONNX node (name, op) that s3tokenizer's mapping for the published `version` file
    (`onnx2torch`, `onnx2torch_v3`) reads the torch tensor `key` from; ("", "") where it reads
    the initializer by its name alone."""
    if key.startswith("quantizer."):
        return ("/quantizer/project_in/MatMul", "MatMul") if key.endswith("weight") else ("", "")
    if key.startswith("encoder.conv"):
        return (f"/{key.split('.')[1]}/Conv", "Conv") if version == 3 else ("", "")
    parts = key.split(".")  # encoder, blocks, i, module path..., weight|bias
    block, path, leaf = f"blocks.{parts[2]}", parts[3:-1], parts[-1]
    if path[0].endswith("_ln"):
        if version == 2:
            return f"/{block}/{path[0]}/LayerNormalization", "LayerNormalization"
        return (f"/{block}/{path[0]}/Mul", "Mul") if leaf == "weight" else (f"/{block}/{path[0]}/Add", "Add")
    if path[-1] == "fsmn_block":
        return (f"/{block}/attn/fsmn_block/Conv", "Conv") if version == 2 else ("", "")
    where = f"mlp/mlp.{path[1]}" if path[0] == "mlp" else "/".join(path)  # attn/query, mlp/mlp.0
    return (f"/{block}/{where}/MatMul", "MatMul") if leaf == "weight" else (f"/{block}/{where}/Add", "Add")


def write_s3_tokenizer(path: Path, version: int, gen: torch.Generator) -> None:
    """A speech tokenizer ONNX file with the published one's weights (random values) where
    s3tokenizer's mapping for the published files finds them: a node per weight (its name and
    op, an initializer among its inputs), so the loader builds s3tokenizer's model from it as it
    does from the published file. Not a runnable graph; float32, held in memory twice while
    saved (about 2 GB for v3)."""
    import onnx
    import s3tokenizer
    from onnx import helper, numpy_helper
    from s3tokenizer.model_v2 import ModelConfig
    from s3tokenizer.model_v3 import ModelConfigV3

    from mizuoto_runtime.nn.loading import build_on_meta

    cls, config = (s3tokenizer.S3TokenizerV2, ModelConfig) if version == 2 else (s3tokenizer.S3TokenizerV3,
                                                                                  ModelConfigV3)
    model = build_on_meta(lambda: cls(path.stem, config(**S3_TOKENIZER_SIZES)))
    nodes: dict[str, tuple[str, list[str]]] = {}  # node name -> (op, inputs)
    inits = []
    for key, like in model.state_dict().items():
        value = random_tensor(key, like, gen)
        name, op = _s3_node(version, key)
        init = _S3_V2_NAMES.get(key, key) if version == 2 else key.removeprefix("encoder.").replace(
            "quantizer._codebook.project_down.bias", "quantizer.project_in.bias")
        if op == "MatMul":
            value = value.t()  # stored [in, out]; the mapping transposes it back
        inits.append(numpy_helper.from_array(value.contiguous().numpy(), init))
        carrier = name or f"/uses/{init}"  # v2's convs and the projection bias: read off any node's inputs
        nodes.setdefault(carrier, (op or "Identity", ["x"]))[1].append(init)
    graph = helper.make_graph([helper.make_node(op, inputs, [f"{name}_out"], name=name)
                               for name, (op, inputs) in nodes.items()], path.stem, [], [], inits)
    onnx.save(helper.make_model(graph), str(path))


def _cosyvoice_run_files(model: PublishedModel, folder: Path) -> None:
    """The tiny writer's BlankEN tokenizer (one token per byte; the published config keeps its
    151936 rows) and CAM++ graph (small, the published file's input and output: its shapes are
    an ONNX graph's own, not known here), and the speech tokenizer at its published size
    (`write_s3_tokenizer`)."""
    from mizuoto_runtime.engines.cosyvoice import tiny
    from mizuoto_runtime.engines.cosyvoice.checkpoint import BLANK_EN
    from mizuoto_runtime.engines.cosyvoice.engine import VOICE_FILES

    version = int(model.version or 2)
    gen = torch.Generator().manual_seed(0)
    tiny.write_text_tokenizer(folder / BLANK_EN)
    tiny.write_voice_models(folder, version, gen)
    write_s3_tokenizer(folder / VOICE_FILES[version][1], version, gen)


def _cosyvoice_weights(model: PublishedModel, folder: Path) -> list[WeightFile]:
    """``llm.pt``, ``flow.pt`` and ``hift.pt`` as upstream saves them: float32 state dicts,
    torch files of 2 GB or less, each held whole while it is written; the LM's tied head saved
    under its own name too, HiFT's convs weight-normed. BlankEN's ``model.safetensors`` is not
    written: the loader reads the backbone from ``llm.pt``, as upstream does."""
    from mizuoto_runtime.engines.cosyvoice import checkpoint, tiny
    from mizuoto_runtime.nn.loading import shapes_only

    with shapes_only():
        built = checkpoint.load_model(folder)
    built.hift.f0_predictor.to(torch.float32)  # the loader runs it in float64 once filled; the file holds float32

    def tied(key: str, made: torch.Tensor) -> dict[str, torch.Tensor]:
        return {key: made, tiny.LM_HEAD: made} if key == tiny.EMBED_TOKENS else {key: made}

    return [WeightFile("llm.pt", built.lm, stored=tied), WeightFile("flow.pt", built.flow),
            WeightFile("hift.pt", built.hift, stored=tiny.hift_stored)]


def _cosyvoice_speaks(folder: Path) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """The LM's stop rows of its decoder zeroed (as the tiny writer does), so a stop id's score
    is 0 and never among RAS's top 25 of thousands of speech scores: a request speaks every token
    it asks for (CosyVoice 3 has 200 stop ids, which random rows would draw about one time in 34)."""
    from mizuoto_runtime.engines.cosyvoice import checkpoint
    from mizuoto_runtime.engines.cosyvoice.config import ModelConfig

    version = checkpoint.detect_version(folder)
    blank_en = folder / checkpoint.BLANK_EN
    cfg = ModelConfig.read(folder / checkpoint.YAMLS[version], {"qwen_pretrain_path": str(blank_en)})
    speech = checkpoint.lm_spec(cfg, blank_en).speech_token_size

    def values(key: str, made: torch.Tensor) -> torch.Tensor:
        if key == "llm_decoder.weight":
            made[speech:] = 0
        return made

    return values


def _voxcpm2_run_files(model: PublishedModel, folder: Path) -> None:
    """The tiny writer's Llama-style text tokenizer (its ids are inside the published vocabulary)."""
    from mizuoto_runtime.engines.tiny import write_json
    from mizuoto_runtime.engines.voxcpm2 import tiny

    vocab, merges = tiny._vocabulary()
    write_json(folder / "tokenizer.json", tiny._tokenizer_json(vocab, merges))
    write_json(folder / "tokenizer_config.json", tiny._tokenizer_config())
    write_json(folder / "special_tokens_map.json", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})


def _voxcpm2_weights(model: PublishedModel, folder: Path) -> list[WeightFile]:
    """`voxcpm`'s `VoxCPM2Model` on meta, as the engine's loader builds it: everything but the
    audio VAE in ``model.safetensors`` (the run dtype), the VAE in ``audiovae.pth`` (float32, a
    torch file of a plain dict of tensors, as published: held in memory while it is written,
    0.35 GB)."""
    from torch import nn as torch_nn

    from mizuoto_runtime.engines.voxcpm2 import checkpoint
    from mizuoto_runtime.nn.loading import shapes_only

    with shapes_only():
        built = checkpoint.load_model(folder, model.dtype, torch.device("cpu"))
    main = torch_nn.ModuleDict({name: child for name, child in built.named_children() if name != "audio_vae"})
    return [WeightFile("model.safetensors", main), WeightFile(checkpoint.VAE_FILES[1], built.audio_vae)]


def _voxcpm2_speaks(folder: Path) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """The stop head never stops (`voxcpm2.tiny.randomize`'s): it sees SiLU(1) everywhere and
    always prefers "go on", so a request makes every patch it asks for."""

    def values(key: str, made: torch.Tensor) -> torch.Tensor:
        if key == "stop_proj.weight":
            return made.zero_()
        if key == "stop_proj.bias":
            return made.fill_(1.0)
        if key == "stop_head.weight":
            made[0], made[1] = 1.0, -1.0
        return made

    return values


def _gptsovits_run_files(model: PublishedModel, folder: Path) -> None:
    """The Chinese BERT folder: its config (the published one, `gptsovits.published.BERT`, where
    the model's files give none) and the tiny writer's tokenizer."""
    from mizuoto_runtime.engines.gptsovits import published, tiny
    from mizuoto_runtime.engines.gptsovits.bert import BERT_FOLDER
    from mizuoto_runtime.engines.tiny import write_json

    bert = folder / BERT_FOLDER
    tiny.write_bert_tokenizer(bert)
    if not (bert / "config.json").is_file():
        write_json(bert / "config.json", published.BERT)


def _gptsovits_weights(model: PublishedModel, folder: Path) -> list[WeightFile]:
    """The voice pair as the engine's loader builds it on meta (its configs read from the
    stand-ins), in half precision as published: the GPT ``.ckpt`` (``{"weight": {"model.<name>"},
    "config", "info"}``) and the SoVITS ``.pth`` (``{"weight", "config": {"model", "data"},
    "info"}``, the config as plain dicts); HuBERT (float32) and the Chinese BERT (a
    ``BertForMaskedLM``, float16) as ``pytorch_model.bin``, as lj1995/GPT-SoVITS ships them.
    Each torch file is written whole (`write_checkpoint`): the largest, BERT's, is ~0.7 GB."""
    from transformers import BertConfig, BertForMaskedLM, HubertConfig, HubertModel

    from mizuoto_runtime.engines.gptsovits import checkpoint
    from mizuoto_runtime.engines.gptsovits.bert import BERT_FOLDER
    from mizuoto_runtime.nn.loading import build_on_meta, shapes_only

    if model.choice is not None:  # v2Pro's files: the SoVITS file's version tag and the speaker model
        raise SystemExit(f"{model.name}: the full-size writer writes GPT-SoVITS v2 voices only")
    pair = checkpoint.require_pair(folder)
    gpt, sovits = checkpoint.read_gpt(pair.gpt), checkpoint.read_sovits(pair.sovits)
    with shapes_only():
        t2s, vits = checkpoint.build_t2s(gpt, model.dtype), checkpoint.build_vits(sovits, model.dtype)
    hubert_config = HubertConfig.from_pretrained(str(folder / checkpoint.HUBERT_FOLDER))
    bert_config = BertConfig.from_pretrained(str(folder / BERT_FOLDER))
    return [WeightFile(pair.gpt.name, t2s, lambda k: "model." + k,
                       wrap=lambda tensors: {"weight": tensors, "config": gpt.config, "info": gpt.info}),
            WeightFile(pair.sovits.name, vits,
                       wrap=lambda tensors: {"weight": tensors, "config": {"model": sovits.model, "data": sovits.data},
                                             "info": sovits.info}),
            WeightFile(f"{checkpoint.HUBERT_FOLDER}/pytorch_model.bin",
                       build_on_meta(lambda: HubertModel(hubert_config), torch.float32)),
            WeightFile(f"{BERT_FOLDER}/pytorch_model.bin",
                       build_on_meta(lambda: BertForMaskedLM(bert_config), torch.float16))]
def _higgsaudio_run_files(model: PublishedModel, folder: Path) -> None:
    """The tiny writer's byte-level tokenizer (its chat and audio tokens' ids put in the
    configs; the embedding keeps its published rows), chat template and feature extractor."""
    from mizuoto_runtime.engines.higgsaudio import tiny
    from mizuoto_runtime.engines.tiny import write_json

    tokenizer = tiny.text_tokenizer()
    tokenizer.save_pretrained(str(folder))
    (folder / "chat_template.jinja").write_text(tiny.CHAT_TEMPLATE, encoding="utf-8")
    write_json(folder / "processor_config.json",
               {"feature_extractor": {"feature_extractor_type": "DacFeatureExtractor", **tiny.FEATURES},
                "processor_class": "HiggsAudioV2Processor"})
    ids = tiny.token_ids(tokenizer)
    for name in ("config.json", "generation_config.json"):
        config = json.loads((folder / name).read_text(encoding="utf-8"))
        config.update({k: v for k, v in ids.items() if name == "config.json" or k in config})
        write_json(folder / name, config)


def _higgsaudio_weights(model: PublishedModel, folder: Path) -> list[WeightFile]:
    """transformers' Higgs Audio v2 LLM (sharded, as published) and its audio tokenizer (one
    float32 file in ``audio_tokenizer/``) on meta, as the engine's loader builds them."""
    from mizuoto_runtime.engines.higgsaudio import checkpoint
    from mizuoto_runtime.nn.loading import shapes_only

    with shapes_only():
        loaded = checkpoint.load_models(folder, model.dtype)
    return [WeightFile(checkpoint.INDEX.removesuffix(".index.json"), loaded.model, shard_bytes=SHARD_BYTES),
            WeightFile(f"{checkpoint.AUDIO_TOKENIZER_FOLDER}/model.safetensors", loaded.codec)]


def _higgsaudio_request(model: PublishedModel) -> Request:
    """A clone; the delay pattern's frames (one per codebook) come before the first audio frame."""
    return Request(lead_tokens=model.files["config.json"]["num_codebooks"])


def _codes_only(rows: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Path], Callable[[str, torch.Tensor],
                                                                                        torch.Tensor]]:
    """A `Writer.values` that zeroes the audio heads' rows of the ids a random head would
    sample but the codec cannot decode (a stream's BOS or EOS, ids past the codebook):
    `rows(config)` maps a head's key to its index of those rows. Their logits are then 0, and
    top-k sampling (the default k = 50) takes the 50 highest of the other ~1000-2000 random
    logits, which lie ~2 standard deviations above 0: the loop speaks every frame asked for, in
    codes the codec decodes."""

    def make(folder: Path) -> Callable[[str, torch.Tensor], torch.Tensor]:
        index = rows(json.loads((folder / "config.json").read_text(encoding="utf-8")))

        def values(key: str, made: torch.Tensor) -> torch.Tensor:
            if key in index:
                made[index[key]] = 0
            return made

        return values

    return make


def _higgsaudio_heads(config: dict[str, Any]) -> dict[str, Any]:
    """The audio head's rows (codebook-major) of each codebook's stream BOS and EOS (the
    generation's delay pattern forces BOS where it belongs)."""
    size = config["codebook_size"]
    ids = (config["audio_stream_bos_id"], config["audio_stream_eos_id"])
    return {"audio_lm_head.weight": [k * size + i for k in range(config["num_codebooks"]) for i in ids]}


def _csm_heads(config: dict[str, Any]) -> dict[str, Any]:
    """The backbone's (codebook 0) and the depth decoder's (the others) rows of the ids past
    Mimi's codebook (2048..2050: padding and control ids)."""
    size = config["codec_config"]["codebook_size"]
    return {"lm_head.weight": slice(size, None), "depth_decoder.codebooks_head.weight": (Ellipsis, slice(size, None))}


def _csm_run_files(model: PublishedModel, folder: Path) -> None:
    """The tiny writer's processor (byte-level tokenizer, chat template, feature extractor) and
    generation config; the config's token ids set to that tokenizer's."""
    from transformers import GenerationConfig

    from mizuoto_runtime.engines.csm import tiny
    from mizuoto_runtime.engines.tiny import write_json

    tiny.processor().save_pretrained(str(folder))
    GenerationConfig(**tiny.GENERATION).save_pretrained(str(folder))
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.update({k: tiny.BACKBONE[k] for k in ("pad_token_id", "bos_token_id", "audio_token_id",
                                                  "audio_eos_token_id")})
    write_json(folder / "config.json", config)


def _csm_weights(model: PublishedModel, folder: Path) -> list[WeightFile]:
    """transformers' CSM on meta as the engine's loader builds it, its Mimi codec put back
    under ``codec_model.`` (the loader takes it out after loading): one file, as published."""
    from mizuoto_runtime.engines.csm import checkpoint
    from mizuoto_runtime.nn.loading import shapes_only

    with shapes_only():
        parts = checkpoint.load_model(folder, model.dtype)
    parts.model._modules["codec_model"] = parts.codec
    return [WeightFile("model.safetensors", parts.model)]


def _chatterbox_run_files(model: PublishedModel, folder: Path) -> None:
    """The tiny writer's text tokenizers (one token per character; the multilingual one with
    its language tokens) and its built-in voice (``conds.pt``, the conditionals of a synthetic
    reference: their shapes are the published ones, as the tiny checkpoint keeps the voice
    encoder, CAM++ and the mel sizes published)."""
    import tempfile

    from mizuoto_runtime.engines.chatterbox import checkpoint, tiny

    with tempfile.TemporaryDirectory() as tmp:
        tiny.write(tmp, version="english")
        for name in (checkpoint.TOKENIZER_FILE, checkpoint.CONDS_FILE):
            shutil.copyfile(Path(tmp) / name, folder / name)
    if model.version == "multilingual":
        tiny.text_tokenizer(tiny.LANGUAGES).save(str(folder / checkpoint.MULTILINGUAL_TOKENIZER))


def _chatterbox_weights(model: PublishedModel, folder: Path) -> list[WeightFile]:
    """Upstream's voice encoder, T3 and S3Gen on meta, as the engine's loader builds them, in
    the files that loader reads: English ``ve`` / ``t3_cfg`` / ``s3gen.safetensors`` (S3Gen
    without the S3 tokenizer's computed mel filters and window); Multilingual its T3's
    safetensors and ``ve.pt`` / ``s3gen.pt`` (torch pickles, every key: ~1 GB held while
    written); the other model's files stay empty stand-ins."""
    from mizuoto_runtime.engines.chatterbox import checkpoint, tiny
    from mizuoto_runtime.nn.loading import shapes_only

    multilingual = model.version == "multilingual"
    with shapes_only():
        models = checkpoint.load(folder, model.dtype, multilingual)
    if multilingual:
        return [WeightFile(checkpoint.VE_PICKLE, models.ve), WeightFile(checkpoint.MULTILINGUAL_T3, models.t3),
                WeightFile(checkpoint.S3GEN_PICKLE, models.s3gen)]
    return [WeightFile(checkpoint.VE_FILE, models.ve), WeightFile(checkpoint.T3_FILE, models.t3),
            WeightFile(checkpoint.S3GEN_FILE, models.s3gen, drop=tiny.S3GEN_COMPUTED)]
def _fishspeech_run_files(model: PublishedModel, folder: Path) -> None:
    """The tiny writer's ``tokenizer.json`` (byte-level BPE, the chat and Fish tokens) with a
    ``<|semantic:i|>`` for every code of the published codebook."""
    from mizuoto_runtime.engines.fishspeech import tiny
    from mizuoto_runtime.engines.fishspeech.config import read_config

    tiny.write_s2_tokenizer(folder, read_config(folder).codebook_size)


def _fishspeech_weights(model: PublishedModel, folder: Path) -> list[WeightFile]:
    """S2-Pro's shards (the slow and fast transformers under ``text_model.model.*`` and
    ``audio_decoder.*``, in bfloat16) and ``codec.pth`` (encoder and decoder, their shared
    quantizer once, float32 and weight-normed as released: a torch file of about 1.9 GB, held
    whole while written). The codec's shapes come from the published stand-in `published`
    writes, which this file then replaces."""
    from mizuoto_runtime.engines.fishspeech import checkpoint, tiny
    from mizuoto_runtime.nn.loading import shapes_only

    with shapes_only():
        dual = checkpoint.load_dual_ar(folder, model.dtype)
        encoder, decoder = checkpoint.load_codec(folder, torch.float32)
    return [WeightFile("model.safetensors", (dual.slow, dual.fast), tiny.s2_key, shard_bytes=SHARD_BYTES),
            WeightFile(checkpoint.CODEC_FILE, (encoder, decoder), stored=tiny.codec_stored)]


WRITERS: dict[str, Writer] = {
    "qwen3tts": Writer(_qwen3tts_run_files, _qwen3tts_weights, _qwen3tts_request),
    "f5tts": Writer(_f5tts_run_files, _f5tts_weights, lambda model: Request(steps=4), token_phase="flow"),
    "dia": Writer(_dia_run_files, _dia_weights, lambda model: Request()),
    "vibevoice": Writer(_vibevoice_run_files, _vibevoice_weights, lambda model: Request(), values=_vibevoice_speaks),
    "indextts2": Writer(_indextts2_run_files, _indextts2_weights, lambda model: Request(), values=_indextts2_speaks),
    "gptsovits": Writer(_gptsovits_run_files, _gptsovits_weights, lambda model: Request()),
    "higgsaudio": Writer(_higgsaudio_run_files, _higgsaudio_weights, _higgsaudio_request,
                         values=_codes_only(_higgsaudio_heads)),
    "csm": Writer(_csm_run_files, _csm_weights, lambda model: Request(), values=_codes_only(_csm_heads)),
    "chatterbox": Writer(_chatterbox_run_files, _chatterbox_weights, lambda model: Request()),
    "cosyvoice": Writer(_cosyvoice_run_files, _cosyvoice_weights, lambda model: Request(), values=_cosyvoice_speaks),
    "fishspeech": Writer(_fishspeech_run_files, _fishspeech_weights, lambda model: Request()),
    "omnivoice": Writer(_omnivoice_run_files, _omnivoice_weights, lambda model: Request(steps=4), token_phase="llm",
                        values=_omnivoice_speaks),
    "voxcpm2": Writer(_voxcpm2_run_files, _voxcpm2_weights, lambda model: Request(), token_phase="generate",
                      values=_voxcpm2_speaks),
}


def writer(model: PublishedModel) -> Writer:
    found = WRITERS.get(model.engine)
    if found is None:
        raise SystemExit(f"{model.name}: no full-size writer for engine {model.engine!r} yet; add one to "
                         f"WRITERS in {Path(__file__).name} (known: {', '.join(sorted(WRITERS))})")
    return found


def checkpoint_tensors(weight_file: WeightFile) -> dict[str, torch.Tensor]:
    """The weight file's tensors under their checkpoint keys; a sharded (``save_pretrained``)
    layout keeps a tied tensor once, under the name the state dict gives it first (a tied LM
    head is stored as the embedding)."""
    named: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    modules = weight_file.module if isinstance(weight_file.module, tuple) else (weight_file.module,)
    for module in modules:
        for name, tensor in module.state_dict(keep_vars=True).items():
            if name in weight_file.drop:
                continue
            if weight_file.shard_bytes is not None:
                if id(tensor) in seen:
                    continue
                seen.add(id(tensor))
            named.setdefault(weight_file.key(name), tensor)
    return named


def shard(tensors: dict[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    """`tensors` in order, cut into groups of at most `limit` bytes (a larger tensor alone)."""
    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if groups[-1] and size + nbytes > limit:
            groups.append({})
            size = 0
        groups[-1][name] = t
        size += nbytes
    return groups


def write_shards(path: Path, tensors: dict[str, torch.Tensor], limit: int,
                 make: Callable[[str, torch.Tensor], torch.Tensor], align: int = PUBLISHED_ALIGN) -> int:
    """`tensors` as ``save_pretrained`` shards them (`WeightFile`), each file streamed by
    `write_safetensors`, and the index beside them. Returns the shards' bytes."""
    groups = shard(tensors, limit)
    weight_map: dict[str, str] = {}
    total = 0
    for i, group in enumerate(groups, 1):
        name = f"{path.stem}-{i:05d}-of-{len(groups):05d}{path.suffix}"
        total += write_safetensors(path.with_name(name), group, make, align)
        weight_map.update(dict.fromkeys(group, name))
        log.info("wrote %s (%.2f GB)", name, path.with_name(name).stat().st_size / GB)
    data_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": data_bytes}, "weight_map": dict(sorted(weight_map.items()))}
    path.with_name(path.name + ".index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
    return total


def write_checkpoint(model: PublishedModel, folder: Path, seed: int = 0, shard_bytes: int | None = None,
                     align: int = PUBLISHED_ALIGN) -> int:
    """`model` in `folder`: its configs, its run files, random weights file by file (a sharded
    one in shards of `shard_bytes`, default its writer's; safetensors data aligned to `align`
    bytes). Returns the weight files' bytes."""
    w = writer(model)
    if folder.exists():
        shutil.rmtree(folder)
    model.write(folder)
    w.run_files(model, folder)
    gen = torch.Generator().manual_seed(seed)
    values = w.values(folder) if w.values is not None else (lambda key, made: made)

    def make(key: str, like: torch.Tensor) -> torch.Tensor:
        return values(key, random_tensor(key, like, gen))

    total = 0

    for weight_file in w.weights(model, folder):
        named = checkpoint_tensors(weight_file)
        path = folder / weight_file.path
        if weight_file.shard_bytes is not None:
            total += write_shards(path, named, shard_bytes or weight_file.shard_bytes, make, align)
            del named
            continue
        if path.suffix == ".safetensors":
            total += write_safetensors(path, named, make, align)
        else:  # a torch file (.pt / .pth / .ckpt / .bin, under 4 GB each): written whole, its tensors held once
            torch.save(weight_file.torch_object({k: make(k, v).contiguous() for k, v in named.items()}), path)
            total += path.stat().st_size
        log.info("wrote %s (%.2f GB)", weight_file.path, (folder / weight_file.path).stat().st_size / GB)
        del named
        gc.collect()
    return total


def tensors_in(obj: Any, prefix: str = "") -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """The dtype and shape of every tensor in a torch file's object, by its path through the
    nested dicts (``generator.conv_pre.weight``); what is not a tensor (a config) left out."""
    if isinstance(obj, torch.Tensor):
        return {prefix: (obj.dtype, tuple(obj.shape))}
    if not isinstance(obj, dict):
        return {}
    return {k: v for name, value in obj.items()
            for k, v in tensors_in(value, f"{prefix}.{name}" if prefix else str(name)).items()}


def check_written(model: PublishedModel, folder: Path) -> int:
    """Every weight file in `folder` holds exactly the tensors (names, dtypes, shapes) the
    writer's meta build of `model` has, as the loader's strict check asks; a sharded one, those
    its index names, in the files it names; a torch file, at their places in its object.
    Returns the number of tensors; raises ValueError naming the first difference."""
    from mizuoto_runtime.nn.checkpoint import load_weights_only

    count = 0
    for weight_file in writer(model).weights(model, folder):
        path = folder / weight_file.path
        if path.suffix != ".safetensors" and weight_file.shard_bytes is None:
            want = tensors_in(weight_file.torch_object(checkpoint_tensors(weight_file)))
            found = tensors_in(load_weights_only(path, mmap=True))
        else:
            want = {k: (t.dtype, tuple(t.shape)) for k, t in checkpoint_tensors(weight_file).items()}
            found = _safetensors_written(weight_file, path)
        if found != want:
            diff = sorted(set(found.items()) ^ set(want.items()))[:3]
            raise ValueError(f"{weight_file.path}: written tensors differ from the meta build: {diff}")
        count += len(found)
    return count


def _safetensors_written(weight_file: WeightFile, path: Path) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """The tensors of a safetensors weight file, or of the shards its index names (each where
    the index says)."""
    from mizuoto_runtime.nn.loading import SafetensorsFile

    if weight_file.shard_bytes is not None:
        index = json.loads(path.with_name(path.name + ".index.json").read_text(encoding="utf-8"))["weight_map"]
        files = sorted(set(index.values()))
    else:
        index, files = None, [weight_file.path]
    found: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    for name in files:
        f = SafetensorsFile(path.with_name(Path(name).name))
        try:
            for key, (dtype, shape, _, _) in f.entries.items():
                if index is not None and index.get(key) != name:
                    raise ValueError(f"{name}: {key} is not where the index says ({index.get(key)})")
                found[key] = (dtype, tuple(shape))
        finally:
            f.close()
    if index is not None and index.keys() != found.keys():
        raise ValueError(f"{weight_file.path}: the index names tensors no shard holds: "
                         f"{sorted(index.keys() - found.keys())[:3]}")
    return found


# ---- what fits ---------------------------------------------------------------------------------
def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def smallest_card(model: PublishedModel) -> dict[str, Any]:
    """The fit table's smallest card (beside nothing) that holds `model`'s minimum working set,
    its fit there (`app.fit`), and the model's size at its run precision."""
    from mizuoto_runtime.app.fit import CARDS_GB, engine_fit, fit_manager
    from mizuoto_runtime.engines.published import build

    engine = build(model, fit_manager())
    size = sum(h.size_bytes for h in engine.handles())
    for card in CARDS_GB:
        fit = engine_fit(engine, model.name, card * GB, 0)
        if fit.status != "refused":
            return {"card_gb": card, "fit": fit.as_dict(), "size_bytes": size}
    return {"card_gb": None, "fit": None, "size_bytes": size}


# ---- measuring (in a fresh process) -----------------------------------------------------------
def rss_bytes(field: str = "VmRSS") -> int:
    """This process's resident memory (``VmRSS``), or another ``/proc/self/status`` field of it
    (``RssAnon``: its own memory; ``RssFile``: mapped file pages, which the kernel can reclaim)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes() -> int:
    """The process's peak RSS since it started or since `reset_peak_rss` (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> None:
    """Start the peak RSS over from the current RSS (Linux: ``clear_refs`` 5), so a peak read
    later is the load's alone, not the imports' before it; where that is refused the peak stays
    the process's (never lower than the load's)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


class CudaPeak:
    """A phase's peak CUDA memory above its start (``max_memory_allocated``)."""

    def __enter__(self) -> CudaPeak:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.start = torch.cuda.memory_allocated()
        self.peak = 0
        return self

    def __exit__(self, *exc: object) -> None:
        torch.cuda.synchronize()
        self.peak = torch.cuda.max_memory_allocated() - self.start


class NoPeak:
    """Times a phase without measuring memory (the timed runs: a tracker costs time per op)."""

    peak = 0

    def __enter__(self) -> NoPeak:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _say(rt: Any, engine: Any, req: Request, tokens: int, seed: int = 1) -> tuple[Any, dict[str, Any], list[float]]:
    """One request; returns its audio, its meta and when each progress tick came
    (`time.perf_counter`: a token-loop phase ticks once per token or frame)."""
    from mizuoto_runtime.audio import Audio
    from mizuoto_runtime.engines import Sampling

    reference = None
    if req.reference_s:
        n = int(req.reference_s * 24000)
        reference = Audio(0.3 * torch.sin(torch.arange(n) / 6.0).unsqueeze(0), 24000)
    ticks: list[float] = []
    audio, meta = rt.say(engine, req.text, reference=reference, transcript=req.transcript or None,
                         speaker=req.speaker, instruct=req.instruct,
                         on_progress=lambda done, total: ticks.append(time.perf_counter()),
                         sampling=Sampling(seed=seed, max_new_tokens=tokens + req.lead_tokens))
    return audio, meta, ticks


def _token_phase_ms(rt: Any, engine: Any, req: Request, tokens: int, phase: str, tracker: Any) -> dict[str, Any]:
    """ms per token of the token-loop phase (its wall time over the ticks it gave), and the
    request's MB streamed per token."""
    import engines as bench_engines

    with bench_engines.metered_phases(engine.id, "timed", tracker) as rows:
        audio, meta, ticks = _say(rt, engine, req, tokens)
    loop = [r for r in rows if r.phase.startswith(phase)]
    seconds = sum(r.seconds for r in loop)
    made = max(1, sum(1 for t in ticks for r in loop if r.started <= t <= r.started + r.seconds))
    streamed = meta["memory"].get("streamed_mb", 0.0)
    components = meta["memory"].get("request", {}).get("components", [])
    return {"ms_per_token": round(seconds / made * 1e3, 1), "tokens": made,
            "streamed_mb_per_token": round(streamed / made, 1), "audio_s": round(audio.seconds, 2),
            "streamed_mb": streamed,
            "resident_mb": round(sum(c.get("on_device_mb", 0.0) for c in components), 1),
            "from_ram_mb": round(sum(c.get("from_ram_mb", 0.0) for c in components), 1)}


def steps(engine: Any, req: Request) -> None:
    """The request's ODE / diffusion steps, on an engine that has them (as bench/engines.py sets them)."""
    if req.steps is not None and hasattr(engine, "steps"):
        engine.steps = req.steps


def report(row: dict[str, Any]) -> None:
    """Print what is measured so far (one JSON line: the driver keeps the last one it got, so a
    run stopped part-way still reports its first stages)."""
    print(json.dumps(row), flush=True)


def import_loader(model: PublishedModel) -> None:
    """Import what the engine's loader imports (its upstream package, transformers, ...) by
    building `model` on meta (`engines.published.build`: no weight read), so the load measured
    after it is the checkpoint's own cost rather than the packages'. The tokenizers and feature
    extractors a shapes-only build skips still import during the load. What the build allocated
    (its real buffers) is freed and handed back to the system (glibc's ``malloc_trim``), so the
    load cannot reuse it unseen."""
    import ctypes

    from mizuoto_runtime.app.fit import fit_manager
    from mizuoto_runtime.engines.published import build

    build(model, fit_manager())
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The measurements of one written checkpoint (this process started for it)."""
    import engines as bench_engines

    model = find(args.model) if not args.dry_run else _dry_model(args.model)
    w = writer(model)
    req = w.request(model)
    device = None if args.device == "cpu" else args.device
    tracker = CudaPeak if args.device.startswith("cuda") else bench_engines.PeakTracker
    folder = Path(args.folder)
    ckpt = sum(p.stat().st_size for p in folder.rglob("*") if p.suffix in WEIGHT_SUFFIXES)
    out: dict[str, Any] = {"model": model.name, "device": args.device, "checkpoint_gb": round(ckpt / GB, 2)}

    target = folder / model.choice if model.choice else folder  # what a user picks (a file in the folder)
    if not args.card_only:
        plain_runs(args, model, w, req, target, ckpt, out, device, tracker)
    card_runs(args, model, w, req, target, out, device)
    out["peak_rss_gb"] = round(peak_rss_bytes() / GB, 2)
    return out


def plain_runs(args: argparse.Namespace, model: PublishedModel, w: Writer, req: Request, target: Path, ckpt: int,
               out: dict[str, Any], device: str | None, tracker: Any) -> None:
    """The load, the cold request, each phase's estimate / peak and ms per token, all on the
    plain device."""
    import engines as bench_engines

    from mizuoto_runtime import Runtime

    rss0, start = rss_bytes(), time.perf_counter()
    import_loader(model)
    out["import_s"] = round(time.perf_counter() - start, 2)
    out["import_rss_gb"] = round((rss_bytes() - rss0) / GB, 2)
    reset_peak_rss()
    rss0 = rss_bytes()
    start = time.perf_counter()
    rt = Runtime({})
    engine = rt.engine(model.engine, target, dtype=model.dtype, device=device)
    out["load_s"] = round(time.perf_counter() - start, 2)
    steps(engine, req)
    out["load_peak_rss_gb"] = round(peak_rss_bytes() / GB, 2)
    out["load_rss_ratio"] = round((peak_rss_bytes() - rss0) / ckpt, 3)
    _say(rt, engine, req, args.tokens)
    out["cold_to_audio_s"] = round(time.time() - args.t0, 2)
    report(out)

    engine.voices.clear()  # the voice-prompt phases run again, measured
    with bench_engines.metered_phases(model.name, "estimate", tracker) as rows:
        _say(rt, engine, req, args.tokens)
    out["phases"] = [{"phase": r.phase, "estimate_mb": round(r.estimate / MB, 1), "peak_mb": round(r.peak / MB, 1),
                      "ratio": round(r.ratio, 2)} for r in rows]
    report(out)
    out["plain"] = _token_phase_ms(rt, engine, req, args.tokens, w.token_phase, NoPeak)
    report(out)
    del engine, rt
    gc.collect()


def card_runs(args: argparse.Namespace, model: PublishedModel, w: Writer, req: Request, target: Path,
              out: dict[str, Any], device: str | None) -> None:
    """ms per token on a device of the card's size: all streamed, and (on CUDA, or `--placed`)
    as the runtime places the model there."""
    from mizuoto_runtime import Runtime

    card = args.card_gb
    out["card_gb"] = card
    if card:
        # On the CPU the simulated device's memory is host memory: a model placed whole there is
        # held twice, so only the all-streamed run (its minimum working set there) runs here,
        # unless asked (`--placed`: with `--align 64` the host copies are the file's pages).
        # All streamed first: it needs the least host memory, so its row is kept if the placed
        # run is stopped for want of memory.
        runs = [("all_streamed", {"compute.vram_mode": "none"})]
        if args.device != "cpu" or args.placed:
            runs.append(("placed", {}))
        for label, settings in runs:
            if args.device == "cpu":
                settings = {**settings, "compute.simulate_vram_mb": card * 1024}
            else:
                settings = {**settings, "compute.vram_limit_mb": card * 1024}
            rt = Runtime(settings)
            engine = rt.engine(model.engine, target, dtype=model.dtype, device=device)
            steps(engine, req)
            _say(rt, engine, req, 2)  # warm: the first request places the components
            out[label] = _token_phase_ms(rt, engine, req, args.tokens, w.token_phase, NoPeak)
            out[label]["rss_gb"] = {f: round(rss_bytes(f) / GB, 2) for f in ("RssAnon", "RssFile")}
            report(out)
            del engine, rt
            gc.collect()


# ---- g2pW (GPT-SoVITS's Chinese polyphones) ------------------------------------------------------
G2PW_LOAD = """
import sys, time
start = time.perf_counter()
from pathlib import Path
from mizuoto_runtime import Runtime
engine = Runtime({}).engine("gptsovits", Path(sys.argv[1]))
first = time.perf_counter() - start
assert engine.polyphone_source.startswith("g2pW"), engine.polyphone_source
start = time.perf_counter()
Runtime({}).engine("gptsovits", Path(sys.argv[1]))
print(first, time.perf_counter() - start)
"""


def g2pw_loads(root: Path) -> dict[str, Any]:
    """A GPT-SoVITS engine (a tiny v2 voice) beside a published-size g2pW (bert-base-chinese's
    encoder, random weights; `tests/support/g2pw_tiny`): its load in fresh processes with an
    empty cache (the ONNX graph converted and kept) and with the kept conversion, each followed
    by a second load in the same process (imports warm). Issue 35: under 2 s the second time."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from mizuoto_runtime.engines.gptsovits.tiny import write as write_voice

    from support import g2pw_tiny

    voice = root / "g2pw-voice"
    shutil.rmtree(voice, ignore_errors=True)
    write_voice(voice, version="v2")
    g2pw_tiny.write_folder(voice / "G2PWModel", seed=1, size=g2pw_tiny.PUBLISHED)
    env = {**os.environ, "XDG_CACHE_HOME": str(root / "g2pw-cache"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    shutil.rmtree(root / "g2pw-cache", ignore_errors=True)
    out: dict[str, Any] = {"onnx_mb": round((voice / "G2PWModel" / "g2pW.onnx").stat().st_size / MB)}
    try:
        for label in ("converted", "kept"):
            done = subprocess.run([sys.executable, "-c", G2PW_LOAD, str(voice)], env=env, capture_output=True,
                                  text=True, check=True)
            cold, warm = map(float, done.stdout.split()[-2:])
            out[label] = {"cold_process_load_s": round(cold, 2), "second_load_same_process_s": round(warm, 2)}
    finally:
        shutil.rmtree(voice, ignore_errors=True)
        shutil.rmtree(root / "g2pw-cache", ignore_errors=True)
    return out


# ---- the driver --------------------------------------------------------------------------------
def _dry_model(name: str) -> PublishedModel:
    """--dry-run: the engine's tiny checkpoint stands for the published one (the code path only)."""
    published = find(name)
    return dataclasses.replace(published, name=f"{published.name} (tiny)", dtype=torch.float32)


def _models(args: argparse.Namespace) -> list[PublishedModel]:
    if args.model:
        return [find(n) for n in args.model.split(",")]
    engines = args.engine.split(",") if args.engine else sorted(WRITERS)
    return [m for e in engines for m in published_models(e)]


def run_one(model: PublishedModel, args: argparse.Namespace) -> dict[str, Any]:
    """Write `model`, measure it in a fresh process, delete it (unless --keep)."""
    from mizuoto_runtime.engines import engine_class

    if args.write_only:
        return written_only(model, args)
    plan = smallest_card(model)
    need = plan["size_bytes"] * LOAD_OVERHEAD + HOST_HEADROOM
    if not args.dry_run and not args.force and need > available_bytes():
        return {"model": model.name, "skipped": f"needs ~{need / GB:.1f} GB of host memory, "
                                                f"{available_bytes() / GB:.1f} GB available"}
    folder = args.root / model.name.replace("/", "_")
    start = time.perf_counter()
    if args.dry_run:
        if folder.exists():
            shutil.rmtree(folder)
        engine_class(model.engine).tiny_writer()(folder, version=model.version)
    else:
        write_checkpoint(model, folder, align=args.align)
    written_s = time.perf_counter() - start
    cmd = [sys.executable, __file__, "--measure", "--model", model.name, "--folder", str(folder),
           "--device", args.device, "--tokens", str(args.tokens), "--card-gb", str(args.card or plan["card_gb"] or 0),
           "--t0", repr(time.time())] + [flag for flag, on in (("--dry-run", args.dry_run), ("--placed", args.placed),
                                                               ("--card-only", args.card_only)) if on]
    try:
        error, text = watched(cmd, args.timeout)
        lines = [line for line in text.splitlines() if line.startswith("{")]
        row = json.loads(lines[-1]) if lines else {"model": model.name}
        if error:
            row["error"] = error
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    row["write_s"] = round(written_s, 1)
    if plan["fit"] is not None:
        row["link_bound_ms"] = plan["fit"].get("link_bound_ms")
        row["fit_status"] = plan["fit"]["status"]
    return row


def written_only(model: PublishedModel, args: argparse.Namespace) -> dict[str, Any]:
    """``--write-only``: write `model` (one tensor in memory at a time, whatever its size), check
    its files against the loader's meta build (`check_written`), delete it (unless --keep)."""
    folder = args.root / model.name.replace("/", "_")
    start = time.perf_counter()
    written = write_checkpoint(model, folder)
    row: dict[str, Any] = {"model": model.name, "checkpoint_gb": round(written / GB, 2),
                           "write_s": round(time.perf_counter() - start, 1),
                           "write_peak_rss_gb": round(peak_rss_bytes() / GB, 2)}
    try:
        row["checked_tensors"] = check_written(model, folder)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    row["skipped"] = f"written and checked ({row['checked_tensors']} tensors), not measured"
    return row


def watched(cmd: list[str], timeout: float) -> tuple[str | None, str]:
    """Run the measuring process; stop it when this machine's available memory falls under
    `HOST_HEADROOM` (the machine is shared) or after `timeout` s. (why it failed or None,
    its stdout so far)."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        start, error = time.monotonic(), None
        while child.poll() is None:
            if available_bytes() < HOST_HEADROOM:
                error = f"stopped: available memory fell under {HOST_HEADROOM / GB:.0f} GB"
            elif time.monotonic() - start > timeout:
                error = f"stopped after {timeout:.0f} s"
            if error:
                child.kill()
                child.wait()
                break
            time.sleep(1.0)
        out.seek(0), err.seek(0)
        if error is None and child.returncode != 0:
            error = f"exit {child.returncode}: {err.read()[-2000:]}"
        return error, out.read()


def machine() -> dict[str, Any]:
    cpu = platform.processor()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu, "memory_gb": round(available_bytes() / GB, 1),
            "torch": torch.__version__}


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'model':34} {'ckpt GB':>7} {'load s':>7} {'RSS/ckpt':>8} {'cold→audio s':>12} {'card':>5} "
          f"{'ms/tok plain':>12} {'placed':>8} {'streamed':>9} {'MB/tok':>7} {'bound 4.0/5.0 ms':>16}  estimate/peak")
    for r in rows:
        if "skipped" in r or "load_s" not in r:
            print(f"{r['model']:34} {r.get('skipped') or 'error: ' + r.get('error', '?').splitlines()[-1]}")
            continue
        bound = r.get("link_bound_ms") or {}
        ratios = ", ".join(f"{p['phase'].split(' (')[0]} {p['ratio']:.2f}" for p in r.get("phases", []))
        placed, streamed, plain = r.get("placed", {}), r.get("all_streamed", {}), r.get("plain", {})
        ratios += f"  ({r['error']})" if "error" in r else ""
        print(f"{r['model']:34} {r['checkpoint_gb']:7.2f} {r['load_s']:7.1f} {r['load_rss_ratio']:8.2f} "
              f"{r['cold_to_audio_s']:12.1f} {r.get('card_gb') or '-':>5} {plain.get('ms_per_token', 0):12.0f} "
              f"{placed.get('ms_per_token', 0):8.0f} {streamed.get('ms_per_token', 0):9.0f} "
              f"{streamed.get('streamed_mb_per_token', 0):7.0f} {'/'.join(map(str, bound.values())):>16}  {ratios}")


@contextlib.contextmanager
def merged_output(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON file's content, rows merged by model, written back after the block."""
    data: dict[str, Any] = {"rows": {}}
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))
    yield data
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="published model names, comma-separated (default: every model of --engine)")
    parser.add_argument("--engine", help="engine ids, comma-separated (default: every engine with a writer)")
    parser.add_argument("--device", default="cpu", help="cpu (a simulated device) or cuda")
    parser.add_argument("--tokens", type=int, default=4, help="new tokens or frames per measured request")
    parser.add_argument("--root", type=Path, default=ROOT, help="where the checkpoint is written (one at a time)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--keep", action="store_true", help="keep the written checkpoint")
    parser.add_argument("--dry-run", action="store_true", help="tiny checkpoints: the code path, not the numbers")
    parser.add_argument("--card", type=int, default=0,
                        help="the device's size in GB for the streamed run (default: the fit table's smallest card "
                             "that holds the model's minimum working set)")
    parser.add_argument("--force", action="store_true",
                        help="measure a model whose estimated host memory exceeds what is available (the run "
                             "is still stopped when available memory falls under 4 GB)")
    parser.add_argument("--write-only", action="store_true",
                        help="write each checkpoint and check its files against the loader's shapes, "
                             "measure nothing (a model larger than this machine's memory)")
    parser.add_argument("--align", type=int, default=PUBLISHED_ALIGN, choices=(PUBLISHED_ALIGN, 64),
                        help="where written safetensors files start their data: 8 bytes as the safetensors library "
                             "writes them, or 64, where the loader keeps weights as the file's pages instead of "
                             "copying them")
    parser.add_argument("--placed", action="store_true",
                        help="on the CPU, also run the model as the runtime places it on the card (the simulated "
                             "device's copy is host memory too: with --align 64 the host copies are file pages)")
    parser.add_argument("--card-only", action="store_true",
                        help="only the runs on the card (merged into the model's earlier row): no plain load, "
                             "cold request, phases or plain timing")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds for one model's measurement")
    parser.add_argument("--g2pw", action="store_true",
                        help="instead: a GPT-SoVITS load beside a published-size g2pW, converted and kept")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--card-gb", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.measure:
        report(measure(args))
        return
    if args.g2pw:
        with merged_output(args.out) as data:
            data["g2pw"] = g2pw_loads(args.root)
        print(json.dumps(data["g2pw"]))
        return
    rows = []
    with merged_output(args.out) as data:
        data["machine"] = machine()
        for model in _models(args):
            log.info("%s: writing and measuring", model.name)
            row = run_one(model, args)
            key = row["model"] + (f" [{args.device}]" if args.device != "cpu" else "")
            # --card-only: the earlier run's stop, if any, is kept as that run's
            earlier = dict(data["rows"].get(key, {}))
            if "error" in earlier:
                earlier["earlier_error"] = earlier.pop("error")
            data["rows"][key] = {**earlier, **row} if args.card_only else row
            rows.append(data["rows"][key])
            log.info("%s: %s", model.name, json.dumps(row))
    print(json.dumps(data["machine"]))
    print_table(rows)


if __name__ == "__main__":
    main()
