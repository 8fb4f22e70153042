"""CosyVoice's published checkpoints as data (issue 35, `engines.published`): the model yaml of
``FunAudioLLM/CosyVoice2-0.5B`` (``cosyvoice2.yaml``) and ``FunAudioLLM/Fun-CosyVoice3-0.5B-2512``
(``cosyvoice3.yaml``) — the entries the loader reads (`config`: llm, flow, hift, feat_extractor
and the values they refer to), written by the tiny writer's template (`tiny.model_yaml`) with the
published sizes — and ``CosyVoice-BlankEN/config.json`` (Qwen2-0.5B: 896 wide, 24 layers, 14 heads, 2 KV heads,
tied embeddings). The voice-prompt parts (``campplus.onnx`` and the S3 speech tokenizer) are
ONNX graphs whose shapes come from the files themselves: a published build has no voice-prompt
component, as a folder without those files has none.
"""
from __future__ import annotations

from typing import Any

import torch

from ..published import FileContent, PublishedModel
from .checkpoint import BLANK_EN, YAMLS
from .tiny import model_yaml

BLANK_EN_CONFIG: dict[str, Any] = dict(
    architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_act="silu", hidden_size=896,
    intermediate_size=4864, max_position_embeddings=32768, max_window_layers=24, num_attention_heads=14,
    num_hidden_layers=24, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1000000.0, sliding_window=32768,
    tie_word_embeddings=True, use_sliding_window=False, vocab_size=151936, bos_token_id=151643,
    eos_token_id=151643, torch_dtype="bfloat16",
)

# The published models' sizes in the yaml (`tiny.model_yaml`'s fields; the tiny checkpoint's are
# `tiny.TINY_SIZES`): Qwen2-0.5B's width, 6561 speech tokens; CosyVoice 2's conformer encoder
# and UNet estimator, CosyVoice 3's DiT estimator; HiFT.
SIZES: dict[str, int] = dict(
    hidden=896, speech=6561, flow_width=512, encoder_heads=8, encoder_units=2048, encoder_blocks=6,
    unet_channels=256, unet_head_dim=64, unet_blocks=4, unet_mid_blocks=12, unet_heads=8, lookahead_channels=1024,
    dit_dim=1024, dit_depth=22, dit_heads=16, dit_head_dim=64, hift_channels=512, f0_channels=512,
)
TITLE = "CosyVoice {version} at its published sizes (Mizuoto's fit table)"


def _model(version: int, name: str, repo: str) -> PublishedModel:
    files: dict[str, FileContent] = {YAMLS[version]: model_yaml(version, SIZES, TITLE),
                                     f"{BLANK_EN}/config.json": BLANK_EN_CONFIG,
                                     "llm.pt": None, "flow.pt": None, "hift.pt": None}
    return PublishedModel("cosyvoice", name, repo, files, dtype=torch.float32, version=str(version))


MODELS = (
    _model(2, "CosyVoice2-0.5B", "FunAudioLLM/CosyVoice2-0.5B"),
    _model(3, "Fun-CosyVoice3-0.5B-2512", "FunAudioLLM/Fun-CosyVoice3-0.5B-2512"),
)
