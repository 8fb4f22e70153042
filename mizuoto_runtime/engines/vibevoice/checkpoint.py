"""VibeVoice's checkpoint folder: the transformers layout of ``vibevoice/VibeVoice-1.5B-hf`` and
``vibevoice/VibeVoice-7B-hf`` (`check_layout`), and loading it through transformers' own classes
(`load_model`: built on meta in the run precision and filled from the memory-mapped shards, M27;
`load_processor`: the processor from its JSON and template files, nothing executed).

The folder::

    config.json  generation_config.json  model.safetensors.index.json  model-*-of-*.safetensors
    processor_config.json (or preprocessor_config.json)  tokenizer.json  tokenizer_config.json
    chat_template.jinja (or the template inside tokenizer_config.json / processor_config.json)
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import CheckpointError
from ...nn.loading import build_on_meta, load_safetensors, reading_weights
from ..checkpoint_files import read_json

MODEL_TYPE = "vibevoice"
INDEX = "model.safetensors.index.json"
SHARD_PATTERN = "model-{:05d}-of-{:05d}.safetensors"
REQUIRED_FILES = ("config.json", INDEX, "tokenizer.json", "tokenizer_config.json")
# The feature extractor's settings: in processor_config.json as transformers 5 saves a processor,
# or in a preprocessor_config.json of its own.
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
# The diffusion head's settings where a converted config.json keeps them at its top level, with
# no diffusion_head_config (the 1.5B -hf config as vLLM-Omni's tests record it, from a
# transformers 5.13 dev conversion): config key -> the head config's. transformers 5.24 would
# ignore them and build its default head (right for the 1.5B, not for the 7B's wider one).
FLAT_HEAD_KEYS = {"num_head_layers": "num_hidden_layers", "intermediate_size": "intermediate_size",
                  "rms_norm_eps": "rms_norm_eps", "hidden_act": "hidden_act",
                  "frequency_embedding_size": "frequency_embedding_size",
                  "diffusion_max_period": "diffusion_max_period", "mlp_bias": "mlp_bias"}


def check_layout(folder: Path) -> dict[str, Any]:
    """config.json of a VibeVoice ``-hf`` folder; one `CheckpointError` naming what is wrong."""
    if not folder.is_dir():
        raise CheckpointError(f"VibeVoice checkpoint folder not found: {folder}")
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if not any((folder / name).is_file() for name in PROCESSOR_FILES):
        missing.append(" or ".join(PROCESSOR_FILES))
    if missing:
        raise CheckpointError(f"{folder}: not a VibeVoice checkpoint folder, missing {', '.join(missing)} "
                              "(expected the transformers layout of vibevoice/VibeVoice-1.5B-hf or -7B-hf)")
    config = read_json(folder / "config.json")
    if config.get("model_type") != MODEL_TYPE:
        raise CheckpointError(f"{folder / 'config.json'}: model_type is {config.get('model_type')!r}, "
                              f"expected {MODEL_TYPE!r}")
    return config


def shards(folder: Path) -> list[Path]:
    """The safetensors shards the index names (each checked to exist)."""
    index_path = folder / INDEX
    try:
        names = sorted(set(json.loads(index_path.read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{index_path}: not a safetensors index with a weight_map ({exc})") from exc
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise CheckpointError(f"{folder}: shards named in {INDEX} are missing: {', '.join(missing)}")
    return [folder / n for n in names]


def model_config(folder: Path) -> Any:
    """`VibeVoiceConfig` of the folder's config.json (checked), its top-level head settings, if
    that is where it keeps them, moved into its diffusion_head_config (`FLAT_HEAD_KEYS`)."""
    from transformers import VibeVoiceConfig

    data = check_layout(folder)
    if "diffusion_head_config" not in data and "num_head_layers" in data:
        data = {**data, "diffusion_head_config": {head: data[key] for key, head in FLAT_HEAD_KEYS.items()
                                                  if key in data}}
    try:
        return VibeVoiceConfig.from_dict(data)
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{folder / 'config.json'}: not a valid VibeVoiceConfig ({exc})") from exc


def import_upstream() -> None:
    """transformers' VibeVoice classes (part of transformers >= 5.24)."""
    from transformers import VibeVoiceForConditionalGeneration  # noqa: F401


def load_model(folder: Path, dtype: torch.dtype) -> nn.Module:
    """`VibeVoiceForConditionalGeneration` in `dtype`, built on meta and filled from the folder's
    shards (M27; a tied LM head is filled once, through the embedding). The acoustic
    tokenizer's decoder is put before its encoder, so the model's first parameter (where
    transformers' ``model.device`` looks) is one the talker phase places."""
    import_upstream()
    from transformers import GenerationConfig, VibeVoiceForConditionalGeneration

    config = model_config(folder)
    model = build_on_meta(lambda: VibeVoiceForConditionalGeneration(config), dtype)
    if reading_weights():  # a shapes-only build (engines.published) reads no index or shard
        load_safetensors(model, shards(folder))
    tower = model.model.audio_tower._modules
    tower["encoder"] = tower.pop("encoder")  # after the decoder, in the module order
    model.eval()
    if (folder / "generation_config.json").is_file():
        try:
            model.generation_config = GenerationConfig.from_pretrained(str(folder))
        except (OSError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{folder / 'generation_config.json'}: cannot be read ({exc})") from exc
    return model


def load_processor(folder: Path) -> Any:
    """`VibeVoiceProcessor` from the folder's tokenizer, feature extractor and chat template."""
    from transformers import VibeVoiceProcessor

    try:
        return VibeVoiceProcessor.from_pretrained(str(folder))
    except (OSError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{folder}: processor files cannot be loaded ({exc})") from exc
