"""Higgs Audio v2's checkpoint folder: the layout of ``bosonai/higgs-audio-v2-generation-3B-base``
in transformers' format with its audio tokenizer (``bosonai/higgs-audio-v2-tokenizer``) in the
``audio_tokenizer/`` subfolder (`check_layout`), and loading both through transformers' own
classes, built on meta and filled from the memory-mapped safetensors (`load_models`, M27).
Nothing in the folder is executed: configs and tokenizer files are read as data, the chat
template is rendered by transformers' sandboxed Jinja, and no ``from_pretrained`` reads weights.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import CheckpointError
from ...nn.loading import SafetensorsFile, build_on_meta, load_safetensors, reading_weights
from ..checkpoint_files import config_from, read_json
from ..higgs_codec import load_codec

log = logging.getLogger(__name__)

AUDIO_TOKENIZER_FOLDER = "audio_tokenizer"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
REQUIRED_FILES = (
    "config.json", "tokenizer.json", "tokenizer_config.json",
    f"{AUDIO_TOKENIZER_FOLDER}/config.json", f"{AUDIO_TOKENIZER_FOLDER}/model.safetensors",
)
MODEL_TYPES = (("config.json", "higgs_audio_v2"), (f"{AUDIO_TOKENIZER_FOLDER}/config.json", "higgs_audio_v2_tokenizer"))
LICENCE = ("Boson Higgs Audio 2 Community License Agreement (incorporating the Meta Llama 3 Community License; "
           "above 100,000 annual active users an expanded licence from Boson AI is needed)")
LAYOUT = ("the layout of bosonai/higgs-audio-v2-generation-3B-base (transformers format) with "
          "bosonai/higgs-audio-v2-tokenizer in its audio_tokenizer/ subfolder")


def check_layout(folder: Path) -> dict[str, Any]:
    """The folder's config.json, once its files and model types are what the engine loads."""
    if not folder.is_dir():
        raise CheckpointError(f"Higgs Audio v2 checkpoint folder not found: {folder}")
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if not (folder / INDEX).is_file() and not (folder / SINGLE).is_file():
        missing.append(f"{INDEX} (or {SINGLE})")
    if missing:
        raise CheckpointError(f"{folder}: not a Higgs Audio v2 checkpoint folder, missing {', '.join(missing)} "
                              f"(expected {LAYOUT})")
    configs = {name: read_json(folder / name) for name, _ in MODEL_TYPES}
    for name, model_type in MODEL_TYPES:
        found = configs[name].get("model_type")
        if found != model_type:
            raise CheckpointError(f"{folder / name}: model_type is {found!r}, expected {model_type!r}")
    return configs["config.json"]


def weight_files(folder: Path) -> list[Path]:
    """The LLM's safetensors: the shards the index names, or the one file."""
    index_path = folder / INDEX
    if not index_path.is_file():
        return [folder / SINGLE]
    try:
        shards = sorted(set(json.loads(index_path.read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{index_path}: not a safetensors index with a weight_map ({exc})") from exc
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        raise CheckpointError(f"{folder}: shards named in {INDEX} are missing: {', '.join(missing)}")
    return [folder / s for s in shards]


#: Tensors a published folder may hold that inference does not use: the optional text head
#: (loaded for training only) and the converter's copies of both heads under their original names.
UNUSED_PREFIXES = ("text_lm_head.", "audio_decoder_proj.")


@dataclasses.dataclass
class Loaded:
    """What the engine runs: the LLM, the audio tokenizer, and the processor over them."""

    model: nn.Module
    codec: nn.Module
    processor: Any  # None in a shapes-only build: it cannot run a request
    generation: Any  # the folder's GenerationConfig


def _check_names(model: nn.Module, files: list[Path]) -> None:
    """Every tensor of the shards is one the model has or one inference leaves out: a shard of
    another model is refused naming what it holds, not half loaded."""
    known = set(model.state_dict())
    foreign: list[str] = []
    for path in files:
        with SafetensorsFile(path) as f:
            foreign += [k for k in f.entries if k not in known and not k.startswith(UNUSED_PREFIXES)]
    if foreign:
        more = f" and {len(foreign) - 8} more" if len(foreign) > 8 else ""
        raise CheckpointError(f"{files[0].parent}: tensors Higgs Audio v2 does not have: "
                              f"{', '.join(sorted(foreign)[:8])}{more}")


def load_models(folder: Path, dtype: torch.dtype) -> Loaded:
    """Both models built on meta and filled from the folder (the LLM in `dtype`, the audio
    tokenizer float32 as published), and the processor made from the folder's tokenizer,
    feature extractor and chat template around our audio tokenizer."""
    check_layout(folder)
    from transformers import (
        AutoTokenizer,
        DacFeatureExtractor,
        GenerationConfig,
        HiggsAudioV2Config,
        HiggsAudioV2ForConditionalGeneration,
        HiggsAudioV2Processor,
    )

    config = config_from(HiggsAudioV2Config, folder)
    model = build_on_meta(lambda: HiggsAudioV2ForConditionalGeneration(config), dtype)
    reading = reading_weights()  # false: a shapes-only build (engines.published), configs alone
    if reading:
        files = weight_files(folder)
        _check_names(model, files)
        load_safetensors(model, files, strict=False)  # a tensor left out is still refused: none stays on meta
    codec = load_codec(folder / AUDIO_TOKENIZER_FOLDER)
    model.eval()
    try:
        generation = (GenerationConfig.from_pretrained(str(folder)) if (folder / "generation_config.json").is_file()
                      else GenerationConfig.from_model_config(config))
        if not reading:
            return Loaded(model, codec, None, generation)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        settings = read_json(folder / "processor_config.json") if (folder / "processor_config.json").is_file() else {}
        features = _feature_extractor(DacFeatureExtractor, folder, settings)
        processor = HiggsAudioV2Processor(
            features, tokenizer, codec, chat_template=_chat_template(folder, tokenizer),
            audio_stream_bos_id=settings.get("audio_stream_bos_id", config.audio_stream_bos_id),
            audio_stream_eos_id=settings.get("audio_stream_eos_id", config.audio_stream_eos_id))
    except (OSError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{folder}: tokenizer, feature extractor or generation files cannot be read ({exc})") \
            from exc
    log.info("Higgs Audio v2 loaded from %s. Licence: %s", folder, LICENCE)
    return Loaded(model, codec, processor, generation)


def _feature_extractor(cls: Any, folder: Path, settings: dict[str, Any]) -> Any:
    """The processor's feature extractor: as processor_config.json holds it (transformers 5
    saves it there), else the folder's preprocessor_config.json. Not the audio tokenizer's
    own: its hop pads references to whole frames, which the processor does not."""
    if isinstance(settings.get("feature_extractor"), dict):
        return cls.from_dict({k: v for k, v in settings["feature_extractor"].items() if k != "feature_extractor_type"})
    if (folder / "preprocessor_config.json").is_file():
        return cls.from_pretrained(str(folder))
    raise CheckpointError(f"{folder}: no feature extractor settings "
                          "(processor_config.json or preprocessor_config.json)")


def _chat_template(folder: Path, tokenizer: Any) -> str:
    """The folder's chat template: ``chat_template.jinja``, else the one in a config file."""
    path = folder / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    for name in ("chat_template.json", "processor_config.json"):
        if (folder / name).is_file():
            template = read_json(folder / name).get("chat_template")
            if isinstance(template, str):
                return template
    if isinstance(getattr(tokenizer, "chat_template", None), str):
        return str(tokenizer.chat_template)
    raise CheckpointError(f"{folder}: no chat template (chat_template.jinja) in the folder")
