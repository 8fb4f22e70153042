"""chinese-roberta features for Chinese text, as upstream computes them: the tokenizer's ids of the
normalised text (one token per character), the third-last hidden state of the BERT encoder
without the [CLS] and [SEP] rows, each character's row repeated for each of its phonemes
(``word2ph``), as ``[1024, phonemes]``. Other languages get zeros (upstream's choice).

The model is the encoder (``.bert``, a transformers ``BertModel``) of the ``BertForMaskedLM`` read
from the pretrained folder ``chinese-roberta-wwm-ext-large/``, as upstream loads it; the
masked-LM head is dropped. Model and tokenizer are read from local files only.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import ArgumentError, CheckpointError
from ..base import element_size

BERT_FOLDER = "chinese-roberta-wwm-ext-large"
FEATURES = 1024
HIDDEN_STATE = -3  # upstream's hidden_states[-3:-2]
ACTIVATION_COPIES = 8  # a layer's q, k, v, attention output, MLP hidden (4x) in flight


def load_bert(folder: Path, dtype: torch.dtype) -> tuple[nn.Module, Any]:
    from transformers import AutoTokenizer, BertForMaskedLM

    try:
        model = BertForMaskedLM.from_pretrained(str(folder), local_files_only=True, dtype=dtype).bert
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{folder}: not a chinese-roberta (BERT) folder with its tokenizer ({exc})") from exc
    if model.config.hidden_size != FEATURES:
        raise CheckpointError(f"{folder}: hidden_size {model.config.hidden_size}, GPT-SoVITS takes {FEATURES} "
                              "BERT features")
    return model.eval(), tokenizer


def tokens(tokenizer: Any, text: str) -> dict[str, torch.Tensor]:
    """The tokenizer's inputs for `text`, checked to hold one token per character."""
    inputs = dict(tokenizer(text, return_tensors="pt"))
    found = inputs["input_ids"].shape[1] - 2
    if found != len(text):
        raise ArgumentError(f"BERT tokenizer gave {found} tokens for the {len(text)} characters of {text!r}; "
                            "GPT-SoVITS needs one per character")
    return inputs


def memory(model: nn.Module, length: int, dtype: torch.dtype) -> int:
    """M45: every hidden state (output_hidden_states keeps them) plus one layer's activations."""
    cfg = model.config
    e = element_size(dtype)
    t = length + 2
    return (cfg.num_hidden_layers + 1 + ACTIVATION_COPIES) * t * cfg.hidden_size * e \
        + cfg.num_attention_heads * t * t * e


def features(model: nn.Module, inputs: dict[str, torch.Tensor], word2ph: tuple[int, ...]) -> torch.Tensor:
    """``[1024, sum(word2ph)]`` for one Chinese run."""
    hidden = model(**inputs, output_hidden_states=True).hidden_states[HIDDEN_STATE][0, 1:-1]
    repeats = torch.tensor(word2ph, device=hidden.device)
    return torch.repeat_interleave(hidden, repeats, dim=0).T.float().cpu()
