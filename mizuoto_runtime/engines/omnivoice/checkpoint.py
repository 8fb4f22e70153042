"""OmniVoice's checkpoint folder: the layout of ``k2-fsa/OmniVoice`` (`check_layout`), and loading
it through the `omnivoice` package's model classes (`load_model`: built on meta and filled from
the folder's safetensors, M27), the package imported without its noise (`import_upstream`)."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ...errors import CheckpointError
from ...nn.loading import build_on_meta, load_safetensors, reading_weights
from ..checkpoint_files import config_from, read_json
from ..upstream import ImportNoise, WarningNoise, quiet_import

REQUIRED_FILES = (
    "config.json", "model.safetensors", "tokenizer_config.json",
    "audio_tokenizer/config.json", "audio_tokenizer/model.safetensors", "audio_tokenizer/preprocessor_config.json",
)


def check_layout(folder: Path) -> None:
    if not folder.is_dir():
        raise CheckpointError(f"OmniVoice checkpoint folder not found: {folder}")
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(f"{folder}: not an OmniVoice checkpoint folder, missing {', '.join(missing)} "
                              "(expected the layout of k2-fsa/OmniVoice)")
    for name, model_type in (("config.json", "omnivoice"), ("audio_tokenizer/config.json", "higgs_audio_v2_tokenizer")):
        found = read_json(folder / name).get("model_type")
        if found != model_type:
            raise CheckpointError(f"{folder / name}: model_type is {found!r}, expected {model_type!r}")


#: What importing `omnivoice` says that users cannot act on: pydub's "Couldn't find ffmpeg"
#: warning. The package hands pydub arrays, never files, so ffmpeg is never called.
OMNIVOICE_NOISE = ImportNoise(warnings=(
    WarningNoise(RuntimeWarning, "Couldn't find ffmpeg or avconv", "pydub.utils"),))


def import_upstream() -> None:
    """Import `omnivoice` (an optional extra; needs transformers >= 5.3) without its noise."""
    quiet_import("omnivoice", OMNIVOICE_NOISE)


def load_model(folder: Path, dtype: torch.dtype) -> tuple[nn.Module, nn.Module]:
    """(`omnivoice.OmniVoice` ready to generate, its codec) built on meta and filled (M27)."""
    check_layout(folder)
    import_upstream()
    from omnivoice import OmniVoice, OmniVoiceConfig
    from omnivoice.utils.duration import RuleDurationEstimator
    from transformers import (
        AutoFeatureExtractor,
        AutoTokenizer,
        HiggsAudioV2TokenizerConfig,
        HiggsAudioV2TokenizerModel,
    )

    config = config_from(OmniVoiceConfig, folder)
    model = build_on_meta(lambda: OmniVoice(config), dtype)
    load_safetensors(model, folder / "model.safetensors")
    codec_folder = folder / "audio_tokenizer"
    codec_config = config_from(HiggsAudioV2TokenizerConfig, codec_folder)
    codec = build_on_meta(lambda: HiggsAudioV2TokenizerModel(codec_config), torch.float32)
    load_safetensors(codec, codec_folder / "model.safetensors")
    model.eval()
    codec.eval()
    object.__setattr__(model, "audio_tokenizer", codec)
    if not reading_weights():  # a shapes-only build (engines.published) reads configs alone
        model.sampling_rate = codec_config.sample_rate
        return model, codec
    try:
        text_tokenizer = AutoTokenizer.from_pretrained(str(folder))
        features = AutoFeatureExtractor.from_pretrained(str(codec_folder))
    except (OSError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{folder}: tokenizer or feature extractor files cannot be loaded ({exc})") from exc
    # What upstream's from_pretrained attaches, without making the codec a submodule.
    model.text_tokenizer = text_tokenizer
    model.feature_extractor = features
    model.sampling_rate = features.sampling_rate
    model.duration_estimator = RuleDurationEstimator()
    return model, codec
