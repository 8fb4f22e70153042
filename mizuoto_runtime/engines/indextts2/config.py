"""IndexTTS-2's configuration: the sizes each loader reads from the checkpoint's own config.

`read_config` reads the folder's ``config.yaml``; `GPTConfig`, `DiTConfig` and `CodecConfig`
are its ``gpt``, ``s2mel`` and ``semantic_codec`` sections, `BigVGANConfig` the vocoder's
``config.json``, and `CAMPPlusSizes` the speaker model's sizes, read from its tensors.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from ...errors import MizuotoError


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.yaml"
    if not path.is_file():
        raise MizuotoError(f"IndexTTS-2 checkpoint folder {folder} has no config.yaml")
    import yaml  # an engine requirement: imported when a checkpoint loads, not when the engine table does

    with path.open(encoding="utf-8") as f:
        cfg = yaml.safe_load(f)
    if not isinstance(cfg, dict) or "gpt" not in cfg:
        raise MizuotoError(f"{path}: not an IndexTTS-2 config (no 'gpt' section)")
    return cfg


@dataclasses.dataclass(frozen=True)
class BigVGANConfig:
    num_mels: int
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    upsample_initial_channel: int
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    snake_logscale: bool = True
    use_tanh_at_final: bool = True
    use_bias_at_final: bool = True

    @classmethod
    def read(cls, path: Path) -> BigVGANConfig:
        with path.open(encoding="utf-8") as f:
            h: dict[str, Any] = json.load(f)
        if h.get("resblock") != "1" or h.get("activation") != "snakebeta":
            raise ValueError(f"{path}: BigVGAN v2 with resblock '1' and snakebeta expected, got "
                             f"resblock {h.get('resblock')!r}, activation {h.get('activation')!r}")
        return cls(h["num_mels"], tuple(h["upsample_rates"]), tuple(h["upsample_kernel_sizes"]),
                   h["upsample_initial_channel"], tuple(h["resblock_kernel_sizes"]),
                   tuple(tuple(d) for d in h["resblock_dilation_sizes"]), h.get("snake_logscale", True),
                   h.get("use_tanh_at_final", True), h.get("use_bias_at_final", True))

    @property
    def hop(self) -> int:
        return int(torch.tensor(self.upsample_rates).prod())


@dataclasses.dataclass(frozen=True)
class CAMPPlusSizes:
    feat_dim: int = 80
    embedding_size: int = 192
    growth_rate: int = 32
    bn_size: int = 4
    init_channels: int = 128
    head_channels: int = 32

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor], feat_dim: int = 80) -> CAMPPlusSizes:
        def shape(key: str) -> torch.Size:
            if key not in state:
                raise ValueError(f"CAM++ checkpoint: no tensor {key!r}")
            return state[key].shape
        growth = shape("xvector.block1.tdnnd1.cam_layer.linear_local.weight")[0]
        return cls(feat_dim, shape("xvector.dense.linear.weight")[0], growth,
                   shape("xvector.block1.tdnnd1.linear1.weight")[0] // growth,
                   shape("xvector.tdnn.linear.weight")[0], shape("head.conv1.weight")[0])


@dataclasses.dataclass(frozen=True)
class DiTConfig:
    hidden: int
    heads: int
    depth: int
    in_channels: int
    content_dim: int
    content_codebook_size: int
    style_dim: int
    wn_hidden: int
    wn_kernel: int
    wn_dilation: int
    wn_layers: int

    @classmethod
    def from_yaml(cls, s2mel: dict[str, Any]) -> DiTConfig:
        dit, wn = s2mel["DiT"], s2mel["wavenet"]
        unsupported = {k: dit.get(k) for k, want in (("final_layer_type", "wavenet"), ("time_as_token", False),
                                                      ("style_as_token", False), ("uvit_skip_connection", True),
                                                      ("long_skip_connection", True), ("style_condition", True),
                                                      ("is_causal", False)) if dit.get(k, want) != want}
        if unsupported:
            raise ValueError(f"config.yaml s2mel.DiT: settings IndexTTS-2 does not use: {unsupported}")
        if wn["hidden_dim"] != dit["hidden_dim"]:
            raise ValueError("config.yaml s2mel: wavenet.hidden_dim must equal DiT.hidden_dim "
                             "(the final layer reads the DiT time embedding)")
        return cls(dit["hidden_dim"], dit["num_heads"], dit["depth"], dit["in_channels"], dit["content_dim"],
                   dit["content_codebook_size"], s2mel["style_encoder"]["dim"], wn["hidden_dim"],
                   wn["kernel_size"], wn["dilation_rate"], wn["num_layers"])


@dataclasses.dataclass(frozen=True)
class CodecConfig:
    codebook_size: int = 8192
    hidden_size: int = 1024
    codebook_dim: int = 8
    vocos_dim: int = 384
    vocos_intermediate_dim: int = 2048
    vocos_num_layers: int = 12

    @classmethod
    def from_yaml(cls, cfg: dict[str, Any]) -> CodecConfig:
        for key in ("num_quantizers", "downsample_scale"):
            if cfg.get(key, 1) != 1:
                raise ValueError(f"config.yaml semantic_codec.{key}={cfg[key]}: IndexTTS-2 uses 1")
        return cls(**{f.name: cfg[f.name] for f in dataclasses.fields(cls) if f.name in cfg})


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    model_dim: int
    heads: int
    layers: int
    max_mel_tokens: int
    max_text_tokens: int
    number_text_tokens: int
    number_mel_codes: int
    start_mel_token: int
    stop_mel_token: int
    start_text_token: int
    stop_text_token: int
    condition_module: dict[str, Any]
    emo_condition_module: dict[str, Any]

    @classmethod
    def from_yaml(cls, gpt: dict[str, Any]) -> GPTConfig:
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in gpt]
        if missing:
            raise ValueError(f"config.yaml gpt: missing keys {missing}")
        if gpt.get("condition_type", "conformer_perceiver") != "conformer_perceiver":
            raise ValueError(f"config.yaml gpt.condition_type {gpt['condition_type']!r}: IndexTTS-2 uses "
                             "'conformer_perceiver'")
        return cls(**{n: gpt[n] for n in names})
