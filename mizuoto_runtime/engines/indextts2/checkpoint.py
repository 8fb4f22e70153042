"""IndexTTS-2's published folder and loading it into our modules (each part on its own, so phases
can hold them under separate handles). Every torch file loads with `weights_only=True`.

Layout (as users download it, aux models as upstream's downloader lays them out):
  config.yaml  gpt.pth  s2mel.pth  bpe.model  feat1.pt  feat2.pt  wav2vec2bert_stats.pt
  qwen0.6bemo4-merge/            (optional: emotion text -> emotion vector)
  hf_cache/w2v-bert-2.0/         (transformers Wav2Vec2BertModel + feature extractor)
  hf_cache/semantic_codec_model.safetensors
  hf_cache/campplus_cn_common.bin
  hf_cache/bigvgan/config.json + bigvgan_generator.pt ({"generator": state_dict})
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import CheckpointError, MizuotoError
from ...nn.checkpoint import load_state_dict, load_weights_only
from ...nn.loading import reading_weights
from ...nn.weight_norm import fold_state_dict
from .bigvgan import BigVGAN
from .campplus import CAMPPlus
from .config import BigVGANConfig, CAMPPlusSizes, CodecConfig, GPTConfig, read_config
from .s2mel import S2Mel, gpt_projection
from .semantic_codec import SemanticCodec
from .unified_voice import UnifiedVoice

# Keys a real gpt.pth may hold that the model does not read: GPT-2's unused token and position
# tables, the causal-mask buffers older transformers saved, the inference wrapper's aliases.
IGNORED_GPT_KEYS = re.compile(r"^(inference_model\.|gpt\.wte\.|gpt\.wpe\.|gpt\.h\.\d+\.attn\.(bias|masked_bias)$)")


def load_torch(path: Path) -> Any:
    if not path.is_file():
        raise MizuotoError(f"IndexTTS-2 checkpoint file missing: {path}")
    return load_weights_only(path)


def load_into(module: nn.Module, state: dict[str, torch.Tensor], source: str,
              ignore: re.Pattern[str] | None = None) -> None:
    """Strict load with one clear error naming missing, unexpected and mis-shaped tensors.
    Weight-norm pairs are folded into plain weights first (the models hold plain layers).
    Inside `nn.loading.shapes_only` (a published model's build) nothing is read."""
    if not reading_weights():
        return
    state = fold_state_dict(state)
    own = module.state_dict()
    unexpected = [k for k in state if k not in own and not (ignore and ignore.match(k))]
    missing = [k for k in own if k not in state]
    shapes = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
              for k in own if k in state and state[k].shape != own[k].shape]
    if unexpected or missing or shapes:
        raise MizuotoError(f"{source}: does not match the model built from config.yaml: "
                           f"missing {missing[:8]}, unexpected {unexpected[:8]}, shapes {shapes[:8]}")
    module.load_state_dict({k: v for k, v in state.items() if k in own}, strict=True)


REQUIRED = ("config.yaml", "gpt.pth", "s2mel.pth", "bpe.model", "wav2vec2bert_stats.pt", "feat1.pt", "feat2.pt")


def import_upstream() -> None:
    """Import what the engine needs beside torch (no upstream package: the model code is ours);
    the harness of the real-ComfyUI tests calls it to skip where an environment lacks one."""
    import librosa  # noqa: F401
    import sentencepiece  # noqa: F401
    import torchaudio  # noqa: F401
    import transformers  # noqa: F401
    import yaml  # noqa: F401


def check_layout(folder: Path) -> None:
    if not folder.is_dir():
        raise CheckpointError(f"IndexTTS-2 checkpoint folder not found: {folder}")
    missing = [n for n in REQUIRED if not (folder / n).is_file()]
    if missing:
        raise CheckpointError(f"{folder}: not an IndexTTS-2 folder, missing {', '.join(missing)} "
                              "(expected the layout of IndexTeam/IndexTTS-2)")


AUX = "hf_cache"
AUX_FILES = {"codec": "semantic_codec_model.safetensors", "campplus": "campplus_cn_common.bin", "bigvgan": "bigvgan",
             "w2v_bert": "w2v-bert-2.0"}


@dataclasses.dataclass(frozen=True)
class Layout:
    folder: Path
    config: dict[str, Any]

    @classmethod
    def open(cls, folder: str | Path) -> Layout:
        folder = Path(folder)
        return cls(folder, read_config(folder))

    def file(self, key: str, default: str) -> Path:
        return self.folder / str(self.config.get(key, default))

    def aux(self, name: str) -> Path:
        """An auxiliary model's file or folder under hf_cache/ (`AUX_FILES`)."""
        return self.folder / AUX / AUX_FILES[name]

    @property
    def qwen_emotion_dir(self) -> Path:
        return self.file("qwen_emo_path", "qwen0.6bemo4-merge")


def feature_width(layout: Layout) -> int:
    """The w2v-BERT features' width, from the stats file (1024 for the real model)."""
    stats = load_torch(layout.file("w2v_stat", "wav2vec2bert_stats.pt"))
    mean = stats.get("mean") if isinstance(stats, dict) else None
    if not isinstance(mean, torch.Tensor) or mean.ndim != 1:
        raise MizuotoError(f"{layout.file('w2v_stat', 'wav2vec2bert_stats.pt')}: "
                           "expected {'mean': [width], 'var': [width]}")
    return int(mean.shape[0])


def load_gpt(layout: Layout) -> UnifiedVoice:
    path = layout.file("gpt_checkpoint", "gpt.pth")
    model = UnifiedVoice(GPTConfig.from_yaml(layout.config["gpt"]), feature_width(layout))
    if reading_weights():  # a shapes-only build (engines.published) reads the config alone
        load_into(model, load_state_dict(path, wrappers=("model",)), str(path), IGNORED_GPT_KEYS)
    return model.eval()


def load_s2mel(layout: Layout) -> S2Mel:
    path = layout.file("s2mel_checkpoint", "s2mel.pth")
    data = load_torch(path)
    net = data.get("net") if isinstance(data, dict) else None
    parts = ("cfm", "length_regulator", "gpt_layer")
    if not isinstance(net, dict) or any(not isinstance(net.get(p), dict) for p in parts):
        raise MizuotoError(f"{path}: expected {{'net': {{'cfm', 'length_regulator', 'gpt_layer'}}}}")
    model = S2Mel(layout.config["s2mel"], gpt_projection(net["gpt_layer"]))
    load_into(model, {f"{p}.{k}": v for p in parts for k, v in net[p].items()}, str(path))
    return model.eval()


def load_codec(layout: Layout) -> SemanticCodec:
    from safetensors.torch import load_file

    path = layout.aux("codec")
    if not path.is_file():
        raise MizuotoError(f"IndexTTS-2 semantic codec missing: {path}")
    model = SemanticCodec(CodecConfig.from_yaml(layout.config["semantic_codec"]))
    if reading_weights():
        load_into(model, load_file(str(path)), str(path))
    return model.eval()


def load_campplus(layout: Layout) -> CAMPPlus:
    path = layout.aux("campplus")
    state = load_state_dict(path, wrappers=())
    model = CAMPPlus(CAMPPlusSizes.from_state(state))
    load_into(model, state, str(path))
    return model.eval()


def load_bigvgan(layout: Layout) -> BigVGAN:
    folder = layout.aux("bigvgan")
    if not (folder / "config.json").is_file():
        raise MizuotoError(f"IndexTTS-2 BigVGAN folder lacks config.json: {folder}")
    path = folder / "bigvgan_generator.pt"
    model = BigVGAN(BigVGANConfig.read(folder / "config.json"))
    if reading_weights():
        load_into(model, load_state_dict(path, wrappers=("generator",)), str(path))
    return model.eval()


@dataclasses.dataclass
class Tables:
    """wav2vec2bert_stats.pt, feat1.pt (speaker matrix) and feat2.pt (emotion matrix) split by
    config.yaml's emo_num (rows per emotion)."""

    w2v_mean: torch.Tensor
    w2v_std: torch.Tensor
    spk_matrix: tuple[torch.Tensor, ...]
    emo_matrix: tuple[torch.Tensor, ...]


def load_tables(layout: Layout) -> Tables:
    stats_path = layout.file("w2v_stat", "wav2vec2bert_stats.pt")
    stats = load_torch(stats_path)
    if not isinstance(stats, dict) or not {"mean", "var"} <= set(stats):
        raise MizuotoError(f"{stats_path}: expected {{'mean': tensor, 'var': tensor}}")
    emo_num = [int(n) for n in layout.config.get("emo_num", [])]
    matrices = []
    for key, default in (("spk_matrix", "feat1.pt"), ("emo_matrix", "feat2.pt")):
        path = layout.file(key, default)
        m = load_torch(path)
        if not isinstance(m, torch.Tensor) or m.ndim != 2 or m.shape[0] != sum(emo_num):
            raise MizuotoError(f"{path}: expected a matrix of {sum(emo_num)} rows (config emo_num {emo_num})")
        matrices.append(tuple(torch.split(m, emo_num)))
    return Tables(stats["mean"], torch.sqrt(stats["var"]), matrices[0], matrices[1])
