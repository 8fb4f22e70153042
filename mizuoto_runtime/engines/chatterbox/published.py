"""Chatterbox's published checkpoints as data (issue 35, `engines.published`): the folder
``ResembleAI/chatterbox``, which holds both Chatterbox (English) and Chatterbox Multilingual (its
``t3_mtl23ls_v2.safetensors``, the file a user picks, `checkpoint.split_choice`). The folder has
no config: upstream's classes hard-code the sizes, which a loader reading weights reads back
from the safetensors headers (or the multilingual S3Gen pickle) and a shapes-only build takes as
published (`checkpoint.PUBLISHED`); so every file here is an empty stand-in. Published in
float32 (T3's 0.5B Llama backbone is 2.1 GB).
"""
from __future__ import annotations

import torch

from ..published import FileContent, PublishedModel
from .checkpoint import MULTILINGUAL_FILES, MULTILINGUAL_T3, REQUIRED_FILES

_FILES: dict[str, FileContent] = {path: None for path in (*REQUIRED_FILES, *MULTILINGUAL_FILES)}

MODELS = (
    PublishedModel("chatterbox", "Chatterbox", "ResembleAI/chatterbox", _FILES, dtype=torch.float32, version="english"),
    PublishedModel("chatterbox", "Chatterbox Multilingual", "ResembleAI/chatterbox", _FILES, dtype=torch.float32,
                   version="multilingual", choice=MULTILINGUAL_T3),
)
