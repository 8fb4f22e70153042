"""Tiny random F5-TTS checkpoints in the published layout, for tests and demos (issue 11).

`write(dir)` writes what ``SWivid/F5-TTS``'s ``F5TTS_v1_Base/`` and
``charactr/vocos-mel-24khz`` hold, plus the model config F5-TTS's own tools read::

    model_1250000.safetensors   EMA weights under ``ema_model.`` (plus EMA's ``initted``/``step``)
    vocab.txt                   one token a line, space first (index 0 = unknown)
    F5TTS_tiny.yaml             F5-TTS's config format (configs/F5TTS_v1_Base.yaml), tiny arch
    vocos-mel-24khz/config.yaml, pytorch_model.bin   Vocos as published (a torch.save state dict)

The modules are the packages' own classes (every tensor name and shape is theirs) with weights
from a seeded generator: byte-identical files on every run. Geometry: every DiT block (4) is a
1.8 MB unit in bfloat16 and 3.7 MB in float32, every Vocos ConvNeXt block (3) 1 MB: the M57
tests really stream. F5-TTS zero-initializes its adaLN and output layers (a fresh model's flow
is zero): they are randomized like the rest, so the audio depends on every weight.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...nn.dtypes import parse_dtype
from ..tiny import one_version
from .checkpoint import EMA_PREFIX, VOCODER_FOLDER
from .upstream import import_upstream

log = logging.getLogger(__name__)

ARCH: dict[str, Any] = {  # real v1 Base: dim 1024, depth 22, heads 16, text_dim 512, conv_layers 4
    "dim": 256, "depth": 4, "heads": 4, "dim_head": 64, "ff_mult": 2, "text_dim": 128,
    "text_mask_padding": True, "qk_norm": None, "conv_layers": 2, "pe_attn_head": None,
    "attn_backend": "torch", "attn_mask_enabled": False, "checkpoint_activations": False,
}
MEL_SPEC: dict[str, Any] = {"target_sample_rate": 24000, "n_mel_channels": 100, "hop_length": 256,
                            "win_length": 1024, "n_fft": 1024, "mel_spec_type": "vocos"}
VOCOS_CONFIG: dict[str, Any] = {  # real: dim 512, intermediate_dim 1536, num_layers 8
    "feature_extractor": {"class_path": "vocos.feature_extractors.MelSpectrogramFeatures",
                          "init_args": {"sample_rate": 24000, "n_fft": 1024, "hop_length": 256, "n_mels": 100,
                                        "padding": "center"}},
    "backbone": {"class_path": "vocos.models.VocosBackbone",
                 "init_args": {"input_channels": 100, "dim": 128, "intermediate_dim": 1024, "num_layers": 3}},
    "head": {"class_path": "vocos.heads.ISTFTHead",
             "init_args": {"dim": 128, "n_fft": 1024, "hop_length": 256, "padding": "same"}},
}
# Space first (upstream maps unknown characters to 0), then what English and pinyin text needs.
VOCAB: list[str] = [" ", *"abcdefghijklmnopqrstuvwxyz", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ", *"0123456789",
                    *",.!?;:'\"-()", *(f"{s}{t}" for s in ("ni", "hao", "shi", "de") for t in "12345")]
WEIGHTS_NAME = "model_1250000.safetensors"  # the published name (its training step)
CONFIG_NAME = "F5TTS_tiny.yaml"


def model_config() -> dict[str, Any]:
    """F5-TTS's config format (``model:`` as in the package's configs), tiny architecture."""
    return {"model": {"name": "F5TTS_tiny", "tokenizer": "custom", "tokenizer_path": "vocab.txt", "backbone": "DiT",
                      "arch": dict(ARCH), "mel_spec": dict(MEL_SPEC),
                      "vocoder": {"is_local": True, "local_path": VOCODER_FOLDER}}}


@torch.no_grad()
def randomize(model: nn.Module, gen: torch.Generator, out_std: float = 1.0) -> None:
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or name.endswith(".gamma"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif name.endswith(".bias"):
            p.copy_(0.02 * torch.randn(p.shape, generator=gen))
        elif "embed" in name and p.dim() == 2 and "proj" not in name and "mlp" not in name:
            p.copy_(torch.randn(p.shape, generator=gen))
        else:
            fan_in = p[0].numel() if p.dim() >= 2 else p.shape[0]
            p.copy_(out_std / max(fan_in, 1) ** 0.5 * torch.randn(p.shape, generator=gen))


def _write_yaml(path: Path, obj: dict[str, Any]) -> None:
    import yaml

    path.write_text(yaml.safe_dump(obj, sort_keys=False), encoding="utf-8")


def write(directory: str | Path, *, version: str | None = None, seed: int = 0,
          dtype: torch.dtype | None = None) -> Path:
    """Write a tiny random F5-TTS folder; `dtype` is that of the DiT weights (None: float32;
    Vocos: float32)."""
    from safetensors.torch import save_file
    from vocos import Vocos
    from vocos.feature_extractors import MelSpectrogramFeatures
    from vocos.heads import ISTFTHead
    from vocos.models import VocosBackbone

    one_version(version)
    dtype = parse_dtype(torch.float32 if dtype is None else dtype, "tiny checkpoint dtype")
    modules = import_upstream()
    out = Path(directory)
    (out / VOCODER_FOLDER).mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)

    (out / "vocab.txt").write_text("".join(token + "\n" for token in VOCAB), encoding="utf-8")
    config = model_config()
    _write_yaml(out / CONFIG_NAME, config)
    arch = {k: v for k, v in ARCH.items() if k != "checkpoint_activations"}
    mel = {k: MEL_SPEC[k] for k in ("n_fft", "hop_length", "win_length", "target_sample_rate", "mel_spec_type")}
    cfm = modules.CFM(transformer=modules.DiT(**arch, text_num_embeds=len(VOCAB), mel_dim=100),
                      mel_spec_kwargs={**mel, "n_mel_channels": 100},
                      vocab_char_map={t: i for i, t in enumerate(VOCAB)})
    randomize(cfm, gen)
    state = {EMA_PREFIX + k: v.detach().to(dtype if v.is_floating_point() else v.dtype).contiguous().clone()
             for k, v in cfm.state_dict().items()}
    state.update(initted=torch.tensor(True), step=torch.tensor(1250000))  # EMA's own buffers, as published
    save_file(state, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    os.chmod(out / WEIGHTS_NAME, 0o644)

    vocos_dir = out / VOCODER_FOLDER
    _write_yaml(vocos_dir / "config.yaml", VOCOS_CONFIG)
    parts = {part: VOCOS_CONFIG[part]["init_args"] for part in ("feature_extractor", "backbone", "head")}
    vocos = Vocos(feature_extractor=MelSpectrogramFeatures(**parts["feature_extractor"]),
                  backbone=VocosBackbone(**parts["backbone"]), head=ISTFTHead(**parts["head"]))
    randomize(vocos, gen, out_std=0.5)
    torch.save({k: v.contiguous().clone() for k, v in vocos.state_dict().items()}, vocos_dir / "pytorch_model.bin")
    log.info("wrote tiny F5-TTS checkpoint to %s (%d DiT + %d Vocos parameters)", out,
             sum(p.numel() for p in cfm.parameters()), sum(p.numel() for p in vocos.parameters()))
    return out
