"""Chatterbox's published checkpoint as data (issue 35, `engines.published`): ``ResembleAI/chatterbox``
(English). Its folder has no config: upstream's classes hard-code the sizes, which a loader
reading weights reads back from the safetensors headers and a shapes-only build takes as
published (`checkpoint.PUBLISHED`); so every file here is an empty stand-in. Published in
float32 (T3's 0.5B Llama backbone is 2.1 GB).

Not here: Chatterbox Multilingual, chosen as the file ``t3_mtl23ls_v2.safetensors`` inside the
folder (`checkpoint.split_choice`), which `engines.published.build` (a folder) cannot name.
"""
from __future__ import annotations

import torch

from ..published import FileContent, PublishedModel
from .checkpoint import REQUIRED_FILES

_FILES: dict[str, FileContent] = {path: None for path in REQUIRED_FILES}

MODELS = (PublishedModel("chatterbox", "Chatterbox", "ResembleAI/chatterbox", _FILES, dtype=torch.float32,
                         version="english"),)
