"""CSM's checkpoint folder, as people download it, and loading it through transformers' own
classes (built on meta and filled from the memory-mapped safetensors, M27; nothing in the folder
is executed: no remote code, no pickles).

``sesame/csm-1b`` (the transformers layout): ``config.json`` (model_type ``csm``, with the depth
decoder's and the Mimi codec's configs), ``model.safetensors`` or ``model.safetensors.index.json``
with its shards (the codec's weights among them, under ``codec_model.``),
``generation_config.json``, the tokenizer (``tokenizer.json``, ``tokenizer_config.json``), the
chat template (``chat_template.jinja``) and the feature extractor's ``preprocessor_config.json``
(or a ``processor_config.json`` that holds it).
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

FEATURE_FILES = ("preprocessor_config.json", "processor_config.json")
DEPTH_PREFIX = "depth_decoder_"  # generation_config.json's settings of the depth decoder


def check_layout(folder: Path) -> dict[str, Any]:
    """config.json of a CSM folder, after checking its files; one `CheckpointError` naming what
    is missing or wrong."""
    if not folder.is_dir():
        raise CheckpointError(f"CSM checkpoint folder not found: {folder}")
    missing = [name for name in ("config.json", "tokenizer.json", "tokenizer_config.json")
               if not (folder / name).is_file()]
    if not any((folder / name).is_file() for name in FEATURE_FILES):
        missing.append(" or ".join(FEATURE_FILES))
    if missing:
        raise CheckpointError(f"{folder}: not a CSM checkpoint folder, missing {', '.join(missing)} "
                              "(expected the layout of sesame/csm-1b)")
    config = read_json(folder / "config.json")
    if config.get("model_type") != "csm":
        raise CheckpointError(f"{folder / 'config.json'}: model_type is {config.get('model_type')!r}, expected 'csm'")
    safetensors_files(folder)
    return config


@dataclasses.dataclass
class CsmParts:
    """What a CSM folder loads into: the model without its codec, the codec, the processor."""

    model: nn.Module  # CsmForConditionalGeneration (backbone, depth decoder), in the run precision
    codec: nn.Module  # MimiModel, float32 as published
    processor: Any  # CsmProcessor (feature extractor, tokenizer, chat template); None in a shapes-only build


def load_model(folder: Path, dtype: torch.dtype) -> CsmParts:
    """CSM built on meta and filled from the folder's safetensors (M27). The codec is a submodule
    upstream; it is taken out of the model (kept as a plain attribute) so that the talker's
    component holds the backbone and depth decoder only, and it stays float32."""
    check_layout(folder)
    from transformers import CsmConfig, CsmForConditionalGeneration, CsmProcessor, GenerationConfig

    config = config_from(CsmConfig, folder)
    model = build_on_meta(lambda: CsmForConditionalGeneration(config), dtype)
    model.codec_model.to(torch.float32)  # still on meta: free
    load_safetensors(model, safetensors_files(folder))
    codec = model._modules.pop("codec_model")
    object.__setattr__(model, "codec_model", codec)
    model.eval()
    codec.eval()
    try:
        if (folder / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(str(folder))
        # A shapes-only build (engines.published) reads no tokenizer: it cannot run a request.
        processor = CsmProcessor.from_pretrained(str(folder)) if reading_weights() else None
    except (OSError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{folder}: tokenizer, feature extractor or generation config cannot be loaded "
                              f"({exc})") from exc
    # What CsmForConditionalGeneration.from_pretrained does: generation_config.json's
    # depth_decoder_* settings are the depth decoder's own generation config.
    settings = model.generation_config
    depth = {k[len(DEPTH_PREFIX):]: v for k, v in vars(settings).items() if k.startswith(DEPTH_PREFIX)}
    vars(model.depth_decoder.generation_config).update({"_from_model_config": False, **depth})
    for key in depth:
        delattr(settings, DEPTH_PREFIX + key)
    return CsmParts(model, codec, processor)
