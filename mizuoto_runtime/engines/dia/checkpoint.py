"""Dia's checkpoint folders, as people download them, and loading them through transformers' own
classes (built on meta and filled from the memory-mapped safetensors, M27; nothing in a folder is
executed: no remote code, no pickles).

* ``nari-labs/Dia-1.6B-0626`` (the transformers layout): ``config.json`` (model_type ``dia``),
  ``model.safetensors`` or ``model.safetensors.index.json`` with its shards,
  ``generation_config.json``, ``tokenizer_config.json``, and the feature extractor's
  ``preprocessor_config.json`` (or a ``processor_config.json`` that holds it).
* ``descript/dac_44khz``, the codec Dia's processor names (``config.json``, ``model.safetensors``):
  a folder ``dac_44khz`` inside the Dia folder, or beside it (``models/mizuoto/dac_44khz``).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import CheckpointError
from ...nn.loading import build_on_meta, load_safetensors, reading_weights
from ..checkpoint_files import config_from, read_json, safetensors_files

DAC_FOLDER = "dac_44khz"
FEATURE_FILES = ("preprocessor_config.json", "processor_config.json")


def check_layout(folder: Path) -> dict[str, Any]:
    """config.json of a Dia folder, after checking its files; one `CheckpointError` naming what
    is missing or wrong."""
    if not folder.is_dir():
        raise CheckpointError(f"Dia checkpoint folder not found: {folder}")
    missing = [name for name in ("config.json", "tokenizer_config.json") if not (folder / name).is_file()]
    if not any((folder / name).is_file() for name in FEATURE_FILES):
        missing.append(" or ".join(FEATURE_FILES))
    if missing:
        raise CheckpointError(f"{folder}: not a Dia checkpoint folder, missing {', '.join(missing)} "
                              "(expected the layout of nari-labs/Dia-1.6B-0626)")
    config = read_json(folder / "config.json")
    if config.get("model_type") != "dia":
        raise CheckpointError(f"{folder / 'config.json'}: model_type is {config.get('model_type')!r}, expected 'dia'")
    safetensors_files(folder)
    return config


def dac_folder(folder: Path) -> Path:
    """The DAC 44 kHz folder Dia decodes with: inside the Dia folder, else beside it."""
    for candidate in (folder / DAC_FOLDER, folder.parent / DAC_FOLDER):
        if (candidate / "config.json").is_file():
            config = read_json(candidate / "config.json")
            if config.get("model_type") != "dac":
                raise CheckpointError(f"{candidate / 'config.json'}: model_type is {config.get('model_type')!r}, "
                                      "expected 'dac'")
            safetensors_files(candidate)
            return candidate
    raise CheckpointError(f"{folder}: Dia needs the DAC codec (descript/dac_44khz): put its folder at "
                          f"{folder / DAC_FOLDER} or {folder.parent / DAC_FOLDER}")


@dataclasses.dataclass
class DiaParts:
    """What a Dia folder loads into: the model, its codec and the processor over both."""

    model: nn.Module  # DiaForConditionalGeneration, in the run precision
    dac: nn.Module  # DacModel, float32 as published
    processor: Any  # DiaProcessor (feature extractor, tokenizer, the codec); None in a shapes-only build


def load_model(folder: Path, dtype: torch.dtype) -> DiaParts:
    """Dia and its codec built on meta and filled from the folders' safetensors (M27)."""
    check_layout(folder)
    codec_folder = dac_folder(folder)
    from transformers import (
        DacConfig,
        DacModel,
        DiaConfig,
        DiaFeatureExtractor,
        DiaForConditionalGeneration,
        DiaProcessor,
        DiaTokenizer,
        GenerationConfig,
    )

    config = config_from(DiaConfig, folder)
    model = build_on_meta(lambda: DiaForConditionalGeneration(config), dtype)
    load_safetensors(model, safetensors_files(folder))
    dac = build_on_meta(lambda: DacModel(config_from(DacConfig, codec_folder)), torch.float32)
    load_safetensors(dac, safetensors_files(codec_folder))
    model.eval()
    dac.eval()
    try:
        if (folder / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(str(folder))
        # A shapes-only build (engines.published) reads no tokenizer: it cannot run a request.
        processor = (DiaProcessor(DiaFeatureExtractor.from_pretrained(str(folder)),
                                  DiaTokenizer.from_pretrained(str(folder)), dac) if reading_weights() else None)
    except (OSError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{folder}: tokenizer, feature extractor or generation config cannot be loaded "
                              f"({exc})") from exc
    return DiaParts(model, dac, processor)
