"""F5-TTS's published checkpoint as data (issue 35, `engines.published`): ``F5TTS_v1_Base``
of ``SWivid/F5-TTS`` (its model config is the package's own ``F5TTS_v1_Base.yaml``, which the
loader reads when the folder has none) with the Vocos vocoder of ``charactr/vocos-mel-24khz``.
Its ``vocab.txt`` has 2545 tokens (the text embedding's 2546 rows: one more for the filler);
only that count is a shape, so the stand-in lists 2545 placeholder tokens."""
from __future__ import annotations

import torch

from ..published import PublishedModel
from .checkpoint import VOCODER_FOLDER
from .tiny import WEIGHTS_NAME

VOCAB_SIZE = 2545

VOCOS_CONFIG = {
    "feature_extractor": {"class_path": "vocos.feature_extractors.MelSpectrogramFeatures",
                          "init_args": {"sample_rate": 24000, "n_fft": 1024, "hop_length": 256, "n_mels": 100,
                                        "padding": "center"}},
    "backbone": {"class_path": "vocos.models.VocosBackbone",
                 "init_args": {"input_channels": 100, "dim": 512, "intermediate_dim": 1536, "num_layers": 8}},
    "head": {"class_path": "vocos.heads.ISTFTHead",
             "init_args": {"dim": 512, "n_fft": 1024, "hop_length": 256, "padding": "center"}},
}

MODELS = (
    PublishedModel("f5tts", "F5-TTS v1 Base", "SWivid/F5-TTS", {
        WEIGHTS_NAME: None,
        "vocab.txt": "".join(f"t{i}\n" for i in range(VOCAB_SIZE)),
        f"{VOCODER_FOLDER}/config.yaml": VOCOS_CONFIG,
        f"{VOCODER_FOLDER}/pytorch_model.bin": None,
    }, dtype=torch.float32),
)
