"""Fish Speech's dual-AR settings, read from either published ``config.json``.

Two layouts carry them:

* S2-Pro (``model_type: fish_qwen3_omni``): a ``text_config`` for the slow transformer and an
  ``audio_decoder_config`` for the fast one. Upstream reads it into its flat dual-AR settings
  with two fixed choices: the codebook embeddings at semantic positions are scaled by
  ``1/sqrt(num_codebooks + 1)`` and the fast transformer is fed the final-normed hidden state;
  the fast transformer takes the text config's RoPE base and norm eps (its own are not read).
* S1-mini (``model_type: dual_ar``): the flat settings themselves, every field optional with
  upstream's defaults (``fast_*`` fall back to the slow transformer's values).

The semantic token range comes from the tokenizer (the ids of ``<|semantic:i|>``), which
overrides whatever the config says, as upstream's loader does.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ...errors import CheckpointError
from ..checkpoint_files import read_json


def _multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


@dataclasses.dataclass(frozen=True)
class DualARConfig:
    """The slow (per frame) and fast (per codebook) transformers' shapes and token ranges."""

    vocab_size: int
    n_layer: int
    n_head: int
    n_local_heads: int
    head_dim: int
    dim: int
    intermediate_size: int
    rope_base: float
    norm_eps: float
    max_seq_len: int
    tie_word_embeddings: bool
    attention_qkv_bias: bool
    attention_o_bias: bool
    attention_qk_norm: bool
    codebook_size: int
    num_codebooks: int
    semantic_begin_id: int
    semantic_end_id: int
    scale_codebook_embeddings: bool
    norm_fastlayer_input: bool
    n_fast_layer: int
    fast_dim: int
    fast_n_head: int
    fast_n_local_heads: int
    fast_head_dim: int
    fast_intermediate_size: int
    fast_attention_qkv_bias: bool
    fast_attention_o_bias: bool
    fast_attention_qk_norm: bool

    def with_semantic_range(self, begin: int, end: int) -> DualARConfig:
        return dataclasses.replace(self, semantic_begin_id=begin, semantic_end_id=end)


# Upstream's defaults for a flat (S1-era ``dual_ar``) config.json.
_FLAT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "n_layer": 32, "n_head": 32, "dim": 4096, "intermediate_size": None,
    "n_local_heads": -1, "head_dim": 64, "rope_base": 10000, "norm_eps": 1e-5, "max_seq_len": 2048,
    "tie_word_embeddings": True, "attention_qkv_bias": False, "attention_o_bias": False,
    "attention_qk_norm": False, "codebook_size": 160, "num_codebooks": 4, "semantic_begin_id": 0,
    "semantic_end_id": 0, "scale_codebook_embeddings": False, "norm_fastlayer_input": False,
    "n_fast_layer": 4, "fast_dim": None, "fast_n_head": None, "fast_n_local_heads": None,
    "fast_head_dim": None, "fast_intermediate_size": None, "fast_attention_qkv_bias": None,
    "fast_attention_o_bias": None, "fast_attention_qk_norm": None,
}


def _resolve(flat: dict[str, Any]) -> DualARConfig:
    """Upstream's `__post_init__` defaults: local heads, FFN width, and every ``fast_*`` field."""
    v = {**_FLAT_DEFAULTS, **{k: val for k, val in flat.items() if val is not None}}
    if v["n_local_heads"] == -1:
        v["n_local_heads"] = v["n_head"]
    if v["intermediate_size"] is None:
        v["intermediate_size"] = _multiple(int(2 * 4 * v["dim"] / 3), 256)
    if v["head_dim"] is None:
        v["head_dim"] = v["dim"] // v["n_head"]
    for fast, slow in (("fast_dim", "dim"), ("fast_n_head", "n_head"), ("fast_n_local_heads", "n_local_heads"),
                       ("fast_head_dim", "head_dim"), ("fast_intermediate_size", "intermediate_size"),
                       ("fast_attention_qkv_bias", "attention_qkv_bias"),
                       ("fast_attention_o_bias", "attention_o_bias"),
                       ("fast_attention_qk_norm", "attention_qk_norm")):
        if v[fast] is None:
            v[fast] = v[slow]
    names = {f.name for f in dataclasses.fields(DualARConfig)}
    return DualARConfig(**{k: v[k] for k in names})


def _from_omni(data: dict[str, Any], path: Path) -> DualARConfig:
    tc, adc = data.get("text_config"), data.get("audio_decoder_config")
    if not isinstance(tc, dict) or not isinstance(adc, dict):
        raise CheckpointError(f"{path}: model_type fish_qwen3_omni needs text_config and audio_decoder_config objects")
    for key in ("vocab_size", "n_layer", "n_head", "dim"):
        if key not in tc:
            raise CheckpointError(f"{path}: text_config has no {key!r}")
    for key in ("vocab_size", "num_codebooks", "n_layer"):
        if key not in adc:
            raise CheckpointError(f"{path}: audio_decoder_config has no {key!r}")
    flat = {k: tc.get(k) for k in ("vocab_size", "n_layer", "n_head", "n_local_heads", "head_dim", "dim",
                                   "intermediate_size", "rope_base", "norm_eps", "max_seq_len",
                                   "tie_word_embeddings", "attention_qkv_bias", "attention_o_bias",
                                   "attention_qk_norm")}
    flat.update(
        semantic_begin_id=data.get("semantic_start_token_id", 0),
        semantic_end_id=data.get("semantic_end_token_id", 0),
        scale_codebook_embeddings=True, norm_fastlayer_input=True,
        codebook_size=adc["vocab_size"], num_codebooks=adc["num_codebooks"], n_fast_layer=adc["n_layer"],
        fast_dim=adc.get("dim"), fast_n_head=adc.get("n_head"), fast_n_local_heads=adc.get("n_local_heads"),
        fast_head_dim=adc.get("head_dim"), fast_intermediate_size=adc.get("intermediate_size"),
        fast_attention_qkv_bias=adc.get("attention_qkv_bias"), fast_attention_qk_norm=adc.get("attention_qk_norm"),
        fast_attention_o_bias=adc.get("attention_o_bias"),
    )
    return _resolve(flat)


def read_config(folder: Path) -> DualARConfig:
    """`DualARConfig` from ``folder/config.json`` (either layout); errors name the file and key."""
    path = folder / "config.json"
    data = read_json(path)
    kind = data.get("model_type")
    if kind == "fish_qwen3_omni":
        return _from_omni(data, path)
    if kind == "dual_ar":
        known = set(_FLAT_DEFAULTS)
        return _resolve({k: v for k, v in data.items() if k in known})
    raise CheckpointError(f"{path}: model_type {kind!r} is not a Fish Speech dual-AR model "
                          "(expected 'fish_qwen3_omni' or 'dual_ar')")
