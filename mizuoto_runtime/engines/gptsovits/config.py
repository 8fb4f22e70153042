"""GPT-SoVITS's configuration: the sizes each loader reads from its checkpoint's own config.

`T2SConfig` is the T2S ``.ckpt`` 's ``config["model"]``, `VitsConfig` the SoVITS ``.pth`` 's
``hps``, and `SVConfig` (built by `config_for`) the speaker model's sizes, read from its tensors.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

PRO_VERSIONS = ("v2Pro", "v2ProPlus")


@dataclasses.dataclass(frozen=True)
class SVConfig:
    base_width: int = 24
    scale: int = 4
    expansion: int = 4
    m_channels: int = 64
    num_blocks: tuple[int, ...] = (3, 4, 6, 3)
    embedding_size: int = 192
    feat_dim: int = 80

    @property
    def output_dim(self) -> int:
        """forward3's size: channels x frequency bins of the last stage."""
        return self.m_channels * 8 * self.expansion * math.ceil(self.feat_dim / 8)


def config_for(state: dict[str, torch.Tensor], where: str) -> SVConfig:
    """The published sizes, or a smaller model's read from its tensors (m_channels from conv1,
    blocks per stage from the layer indices, embedding size from seg_1); baseWidth 24, scale 4
    and expansion 4 are what upstream hard-codes."""
    try:
        m = state["conv1.weight"].shape[0]
        blocks = tuple(1 + max(int(k.split(".")[1]) for k in state if k.startswith(f"layer{i}."))
                       for i in range(1, 5))
        emb = state["seg_1.weight"].shape[0]
    except (KeyError, ValueError):
        raise ValueError(f"{where}: not an ERes2NetV2 state dict (needs conv1, layer1..4 and seg_1)") from None
    return SVConfig(m_channels=m, num_blocks=blocks, embedding_size=emb)


@dataclasses.dataclass(frozen=True)
class T2SConfig:
    """The ``config["model"]`` block of a GPT-SoVITS ``.ckpt`` (s1longer-v2.yaml)."""

    vocab_size: int
    phoneme_vocab_size: int
    embedding_dim: int
    hidden_dim: int
    head: int
    n_layer: int
    eos: int

    @classmethod
    def from_checkpoint(cls, model: dict[str, Any], where: str) -> T2SConfig:
        try:
            cfg = cls(int(model["vocab_size"]), int(model["phoneme_vocab_size"]), int(model["embedding_dim"]),
                      int(model["hidden_dim"]), int(model["head"]), int(model["n_layer"]), int(model["EOS"]))
        except KeyError as exc:
            raise ValueError(f"{where}: config['model'] has no {exc.args[0]!r}") from None
        if cfg.eos != cfg.vocab_size - 1:
            raise ValueError(f"{where}: EOS {cfg.eos} is not vocab_size - 1 ({cfg.vocab_size - 1})")
        if cfg.hidden_dim % cfg.head:
            raise ValueError(f"{where}: hidden_dim {cfg.hidden_dim} is not a multiple of head {cfg.head}")
        return cfg


@dataclasses.dataclass(frozen=True)
class VitsConfig:
    """``hps.model`` of a SoVITS ``.pth`` (s2.json / s2v2Pro.json / s2v2ProPlus.json), with
    ``version`` as the loader decided it, and ``hps.data`` 's spectrogram settings."""

    inter_channels: int
    hidden_channels: int
    filter_channels: int
    n_heads: int
    n_layers: int
    kernel_size: int
    resblock: str
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    upsample_rates: tuple[int, ...]
    upsample_initial_channel: int
    upsample_kernel_sizes: tuple[int, ...]
    gin_channels: int
    version: str
    filter_length: int = 2048
    hop_length: int = 640
    win_length: int = 2048
    sampling_rate: int = 32000
    sv_dim: int = 20480  # the speaker embedding's size (ERes2NetV2.forward3); smaller in tiny models

    @property
    def is_pro(self) -> bool:
        return self.version in PRO_VERSIONS

    @classmethod
    def from_hparams(cls, model: dict[str, Any], data: dict[str, Any], version: str, where: str,
                     sv_dim: int = 20480) -> VitsConfig:
        try:
            return cls(
                int(model["inter_channels"]), int(model["hidden_channels"]), int(model["filter_channels"]),
                int(model["n_heads"]), int(model["n_layers"]), int(model["kernel_size"]), str(model["resblock"]),
                tuple(int(k) for k in model["resblock_kernel_sizes"]),
                tuple(tuple(int(d) for d in ds) for ds in model["resblock_dilation_sizes"]),
                tuple(int(u) for u in model["upsample_rates"]), int(model["upsample_initial_channel"]),
                tuple(int(k) for k in model["upsample_kernel_sizes"]), int(model["gin_channels"]), version,
                int(data["filter_length"]), int(data["hop_length"]), int(data["win_length"]),
                int(data["sampling_rate"]), sv_dim)
        except KeyError as exc:
            raise ValueError(f"{where}: config has no {exc.args[0]!r}") from None

    @property
    def samples_per_code(self) -> int:
        """Audio samples per 25 Hz semantic code (each code is two frames of the decoder)."""
        return 2 * math.prod(self.upsample_rates)
