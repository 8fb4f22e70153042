"""Qwen3-TTS's checkpoint folder: the official 12 Hz layout (`check_layout`), and loading it
through the `qwen-tts` package's model classes (`load_model`: built on meta, filled from the
folder's safetensors, M27), the package imported without its noise and adapted to transformers
5.x (`import_upstream`)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from ...errors import CheckpointError
from ...nn.loading import build_on_meta, load_safetensors, reading_weights
from ..checkpoint_files import config_from, read_json
from ..upstream import ImportNoise, WarningNoise, quiet_import
from . import compat

TOKENIZER_TYPE = "qwen3_tts_tokenizer_12hz"


REQUIRED_FILES = (
    "config.json", "generation_config.json", "model.safetensors",
    "vocab.json", "merges.txt", "tokenizer_config.json",
    "speech_tokenizer/config.json", "speech_tokenizer/model.safetensors",
    "speech_tokenizer/preprocessor_config.json",
)


# ---- the upstream package ------------------------------------------------------------------
#: What importing and running `qwen_tts` says that users cannot act on: the flash-attn banner
#: (printed; the 12 Hz models never use flash-attn), the SoX check (a shell error and a warning;
#: 12 Hz models never call SoX), the config classes' "... is None. Initializing ..." INFO lines,
#: and what transformers 5.x says about the package's 4.57 code: its docstring check's "[ERROR]"
#: lines about the package's own classes (printed as they are defined), and the deprecation
#: notices its configs (`rope_scaling`, `rope_config_validation`, `layer_type_validation`) and
#: its model outputs (`past_key_values`) draw at every load and request. `compat` makes that
#: code run unchanged; the notices are about code we do not change.
QWEN_TTS_NOISE = ImportNoise(
    output=(re.compile(r"\**\s*Warning: flash-attn is not installed\..*?\n\**\n ?", re.S),
            re.compile(r"^.*\bsox: (command )?not found\n", re.M),
            re.compile(r"^\[ERROR\] `\w+` is part of [\w.]+'s signature, but not documented\. Make sure to add it "
                       r"to the docstring of the function in \S*[/\\]qwen_tts[/\\]\S*\.py\.\n", re.M)),
    records=(("sox", "SoX could not be found"),
             ("transformers.configuration_utils", "`layer_type_validation` is deprecated"),
             ("transformers.utils.generic", "`past_key_values`/`cache_params` are deprecated")),
    chatty_loggers=("qwen_tts",),
    warnings=(WarningNoise(FutureWarning, "`rope_scaling` is deprecated", "transformers.configuration_utils"),
              WarningNoise(FutureWarning, "`rope_config_validation` is deprecated",
                           "transformers.modeling_rope_utils")),
)


def import_upstream() -> None:
    """Import `qwen_tts` (an optional extra) without its import noise, adapted to transformers
    5.x where that is what the environment has (`qwen3tts.compat`); stdout stays clean for
    `mizuoto say`'s JSON."""
    compat.install(lambda: quiet_import("qwen_tts", QWEN_TTS_NOISE))


def check_layout(folder: Path) -> dict[str, Any]:
    """The folder's config.json, after checking it is an official 12 Hz Qwen3-TTS folder."""
    if not folder.is_dir():
        raise CheckpointError(f"Qwen3-TTS checkpoint folder not found: {folder}")
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(
            f"{folder}: not a Qwen3-TTS checkpoint folder, missing {', '.join(missing)} "
            "(expected the layout of Qwen/Qwen3-TTS-12Hz-*)"
        )
    config = read_json(folder / "config.json")
    if config.get("model_type") != "qwen3_tts":
        raise CheckpointError(f"{folder / 'config.json'}: model_type is {config.get('model_type')!r}, "
                              "expected 'qwen3_tts'")
    if config.get("tokenizer_type") != TOKENIZER_TYPE:
        raise CheckpointError(f"{folder / 'config.json'}: tokenizer_type {config.get('tokenizer_type')!r} is not "
                              f"supported, only {TOKENIZER_TYPE!r}")
    codec = read_json(folder / "speech_tokenizer" / "config.json")
    if codec.get("model_type") != TOKENIZER_TYPE:
        raise CheckpointError(f"{folder / 'speech_tokenizer' / 'config.json'}: model_type is "
                              f"{codec.get('model_type')!r}, expected {TOKENIZER_TYPE!r}")
    return config


def load_model(folder: Path, dtype: torch.dtype, device: torch.device) -> Any:
    """A `qwen_tts.Qwen3TTSModel` built on meta and filled from the folder's safetensors (M27)."""
    check_layout(folder)
    import_upstream()
    from qwen_tts import Qwen3TTSModel, Qwen3TTSTokenizer
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration, Qwen3TTSProcessor
    from transformers import AutoConfig, AutoFeatureExtractor, AutoProcessor

    config = config_from(Qwen3TTSConfig, folder)
    model = build_on_meta(lambda: Qwen3TTSForConditionalGeneration(config), dtype)
    load_safetensors(model, folder / "model.safetensors")
    model.eval()

    st_folder = folder / "speech_tokenizer"
    codec_config = config_from(Qwen3TTSTokenizerV2Config, st_folder)
    codec = build_on_meta(lambda: Qwen3TTSTokenizerV2Model(codec_config), torch.float32)
    if model.tts_model_type == "base":
        load_safetensors(codec, st_folder / "model.safetensors", rename=compat.codec_module_name)
    else:
        # Nothing but Base clones a voice: the encoder's weights are never read, and dropped.
        load_safetensors(codec.decoder, st_folder / "model.safetensors", prefix="decoder.")
        codec.encoder = None
    codec.eval()

    tokenizer = Qwen3TTSTokenizer()
    tokenizer.model, tokenizer.config = codec, codec.config
    tokenizer.device = device  # cached by the package; inputs and codes go there
    processor = None
    try:
        if reading_weights():  # a shapes-only build (engines.published) reads configs alone
            tokenizer.feature_extractor = AutoFeatureExtractor.from_pretrained(str(st_folder))
            AutoConfig.register("qwen3_tts", Qwen3TTSConfig, exist_ok=True)
            AutoProcessor.register(Qwen3TTSConfig, Qwen3TTSProcessor, exist_ok=True)
            processor = AutoProcessor.from_pretrained(str(folder), fix_mistral_regex=True)
    except (OSError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{folder}: tokenizer or feature extractor files cannot be loaded ({exc})") from exc
    model.load_speech_tokenizer(tokenizer)
    model.load_generate_config(read_json(folder / "generation_config.json"))
    tts = Qwen3TTSModel(model=model, processor=processor, generate_defaults=model.generate_config)
    tts.device = device  # cached by the package from the first parameter; ids go there
    return tts
