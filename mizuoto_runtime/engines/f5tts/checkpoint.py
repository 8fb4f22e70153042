"""F5-TTS's checkpoint folder: the published layout (``F5TTS_v1_Base/`` with its vocab and the Vocos
vocoder folder, `check_layout`), its model config (the folder's yaml, else the package's), and
loading the DiT and Vocos through the package's classes (built on meta and filled, M27)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import CheckpointError
from ...nn.checkpoint import load_weights_only
from ...nn.loading import build_on_meta, load_safetensors, reading_weights
from ..checkpoint_files import read_yaml
from .upstream import import_upstream, package_config, vocos_classes

SAMPLE_RATE = 24000


HOP = 256


VOCODER_FOLDER = "vocos-mel-24khz"


DEFAULT_CONFIG = "F5TTS_v1_Base"  # the package's config of the published checkpoint


EMA_PREFIX = "ema_model."


def find_weights(folder: Path) -> Path:
    """The folder's ``model_<step>.safetensors`` (the highest step when there are several)."""
    found = sorted(folder.glob("model_*.safetensors"),
                   key=lambda p: int(m.group(1)) if (m := re.fullmatch(r"model_(\d+)\.safetensors", p.name)) else -1)
    if not found:
        raise CheckpointError(f"{folder}: not an F5-TTS checkpoint folder, no model_<step>.safetensors "
                              "(expected the layout of SWivid/F5-TTS F5TTS_v1_Base/)")
    return found[-1]


def check_layout(folder: Path) -> tuple[Path, Path, Path]:
    """(weights, vocab.txt, vocoder folder) of an F5-TTS folder, each checked to exist."""
    if not folder.is_dir():
        raise CheckpointError(f"F5-TTS checkpoint folder not found: {folder}")
    weights = find_weights(folder)
    missing = [name for name in ("vocab.txt", f"{VOCODER_FOLDER}/config.yaml", f"{VOCODER_FOLDER}/pytorch_model.bin")
               if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(f"{folder}: F5-TTS folder is missing {', '.join(missing)} (the vocoder goes in "
                              f"{VOCODER_FOLDER}/, as published in charactr/vocos-mel-24khz)")
    return weights, folder / "vocab.txt", folder / VOCODER_FOLDER


def model_config(folder: Path) -> dict[str, Any]:
    """``model:`` of the folder's F5-TTS config (``*.yaml``), else of the package's v1 Base."""
    configs = sorted(folder.glob("*.yaml"))
    if len(configs) > 1:
        raise CheckpointError(f"{folder}: several model configs ({', '.join(p.name for p in configs)}); keep one")
    config = read_yaml(configs[0]) if configs else package_config(DEFAULT_CONFIG)
    model = config.get("model")
    if not isinstance(model, dict) or model.get("backbone") != "DiT" or not isinstance(model.get("arch"), dict):
        where = configs[0] if configs else f"{DEFAULT_CONFIG}.yaml"
        raise CheckpointError(f"{where}: expected an F5-TTS model config with model.backbone DiT and model.arch")
    if model.get("mel_spec", {}).get("mel_spec_type", "vocos") != "vocos":
        raise CheckpointError(f"{folder}: only the Vocos mel (mel_spec_type: vocos) is supported")
    return model


def read_vocab(path: Path) -> dict[str, int]:
    """vocab.txt as upstream reads it (one token a line; index = line number)."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc})") from exc
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise CheckpointError(f"{path}: empty vocabulary")
    return {token: i for i, token in enumerate(lines)}


def load_flow(folder: Path, dtype: torch.dtype) -> tuple[nn.Module, dict[str, Any]]:
    """`f5_tts.model.CFM` with its DiT, built on meta in `dtype` and filled from the folder (M27)."""
    weights, vocab_path, _ = check_layout(folder)
    config = model_config(folder)
    modules = import_upstream()
    vocab = read_vocab(vocab_path)
    mel = config.get("mel_spec", {})
    arch = {k: v for k, v in config["arch"].items() if k != "checkpoint_activations"}
    mel_kwargs = dict(n_fft=mel.get("n_fft", 1024), hop_length=mel.get("hop_length", HOP),
                      win_length=mel.get("win_length", 1024), n_mel_channels=mel.get("n_mel_channels", 100),
                      target_sample_rate=mel.get("target_sample_rate", SAMPLE_RATE), mel_spec_type="vocos")

    def build() -> nn.Module:
        try:
            dit = modules.DiT(**arch, text_num_embeds=len(vocab), mel_dim=mel_kwargs["n_mel_channels"])
        except TypeError as exc:
            raise CheckpointError(f"{folder}: model.arch does not fit F5-TTS's DiT ({exc})") from exc
        return modules.CFM(transformer=dit, mel_spec_kwargs=mel_kwargs, odeint_kwargs={"method": "euler"},
                           vocab_char_map=vocab)

    cfm = build_on_meta(build, dtype)
    load_safetensors(cfm, weights, prefix=EMA_PREFIX)
    # Upstream runs the model `.to(dtype)`: floating buffers (text positions, rotary frequencies)
    # in the run precision too, else half-precision convolutions meet float32 inputs. The
    # parameters are already in `dtype` (nothing is copied for them).
    return cfm.to(dtype).eval(), mel_kwargs


def load_vocoder(folder: Path) -> nn.Module:
    """Vocos from the published ``config.yaml`` + ``pytorch_model.bin``, float32 as shipped."""
    config = read_yaml(folder / "config.yaml")
    classes = vocos_classes()
    parts = {}
    for part in ("feature_extractor", "backbone", "head"):
        spec = config.get(part)
        if not isinstance(spec, dict) or spec.get("class_path") not in classes:
            raise CheckpointError(f"{folder / 'config.yaml'}: {part}.class_path must be one of "
                                  f"{', '.join(sorted(classes))}, "
                                  f"got {spec.get('class_path') if isinstance(spec, dict) else spec!r}")
        parts[part] = (classes[spec["class_path"]], spec.get("init_args") or {})
    from vocos import Vocos

    def build() -> nn.Module:
        return Vocos(**{part: cls(**args) for part, (cls, args) in parts.items()})

    vocoder = build_on_meta(build, torch.float32)
    if not reading_weights():  # a shapes-only build (engines.published)
        return vocoder.eval()
    state = load_weights_only(folder / "pytorch_model.bin", mmap=True)
    expected = vocoder.state_dict(keep_vars=True)
    wanted = {k: v for k, v in state.items() if not k.startswith("feature_extractor.")}  # the mel is computed by F5
    missing = sorted(set(expected) - set(wanted) - {k for k in expected if k.startswith("feature_extractor.")})
    unexpected = sorted(set(wanted) - set(expected))
    mismatched = [f"{k}: checkpoint {tuple(v.shape)}, model {tuple(expected[k].shape)}"
                  for k, v in wanted.items() if k in expected and tuple(v.shape) != tuple(expected[k].shape)]
    if missing or unexpected or mismatched:
        raise CheckpointError(f"{folder / 'pytorch_model.bin'} does not match Vocos: " + "; ".join(
            [f"missing {k}" for k in missing] + [f"unexpected {k}" for k in unexpected] + mismatched))
    for name, tensor in expected.items():
        value = wanted.get(name)
        if value is None:  # feature-extractor buffers: computed at construction for real
            continue
        module_name, _, attr = name.rpartition(".")
        module = vocoder.get_submodule(module_name)
        copy = torch.empty(tensor.shape, dtype=tensor.dtype)
        copy.copy_(value)
        if attr in module._parameters:
            module._parameters[attr] = nn.Parameter(copy, requires_grad=False)
        else:
            module._buffers[attr] = copy
    left = [n for n, t in vocoder.state_dict().items() if t.is_meta]
    if left:
        raise CheckpointError(f"{folder / 'pytorch_model.bin'}: tensors not in the checkpoint: {', '.join(left)}")
    return vocoder.eval()
