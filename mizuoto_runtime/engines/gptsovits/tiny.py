"""Tiny random GPT-SoVITS voices in the published file forms (no download), for tests and
`mizuoto tiny-checkpoint --engine gptsovits --version v2|v2pro`.

A folder with ``tiny-e15.ckpt`` (GPT: ``weight`` with ``model.`` keys in fp16, ``config``,
``info``), ``tiny_e8_s16.pth`` (SoVITS: fp16 ``weight`` without ``enc_q``, the decoder's and the
flow's convs in legacy weight-norm form ``weight_g`` / ``weight_v``, ``config`` = hps,
``info``; v2Pro's first two bytes are the version tag ``05``), ``chinese-hubert-base/``
(a transformers HubertModel with 768-d output), ``chinese-roberta-wwm-ext-large/`` (a two-layer
BertForMaskedLM with 1024-d features and a vocabulary of a few dozen characters; the others are
[UNK], still one token each) and, for v2Pro, ``sv/`` with a small ERes2NetV2.
Sizes shrink where upstream lets them; the SoVITS quantizer (1024 x 768) and SSL projection do
not, so the SoVITS file is ~30 MB. Differences from a real file: ``config`` is written as plain
dicts (a real file pickles upstream's ``utils.HParams``, which the loader rebuilds the same way),
and v2Pro's ``sv_emb`` reads the small speaker model's 1280 values instead of 20480.
"""
from __future__ import annotations

import io
import re
from pathlib import Path

import torch

from ...nn import weight_norm
from ..tiny import version_of
from .bert import BERT_FOLDER
from .config import SVConfig, T2SConfig, VitsConfig
from .engine import GptSovitsEngine
from .sv import ERes2NetV2
from .t2s import Text2Semantic
from .vits import Synthesizer

T2S_MODEL = {"vocab_size": 1025, "phoneme_vocab_size": 732, "embedding_dim": 64, "hidden_dim": 64, "head": 2,
             "linear_units": 256, "n_layer": 2, "dropout": 0, "EOS": 1024, "random_bert": 0}
VITS_MODEL = {"inter_channels": 32, "hidden_channels": 192, "filter_channels": 64, "n_heads": 2, "n_layers": 2,
              "kernel_size": 3, "p_dropout": 0.1, "resblock": "1", "resblock_kernel_sizes": [3, 7],
              "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]], "upsample_rates": [10, 8, 2, 2, 2],
              "upsample_initial_channel": 64, "upsample_kernel_sizes": [16, 16, 8, 2, 2], "n_layers_q": 3,
              "use_spectral_norm": False, "semantic_frame_rate": "25hz", "freeze_quantizer": True}
VITS_DATA = {"max_wav_value": 32768.0, "sampling_rate": 32000, "filter_length": 2048, "hop_length": 640,
             "win_length": 2048, "n_mel_channels": 128, "n_speakers": 300}
SV_TINY = SVConfig(m_channels=4, num_blocks=(1, 1, 1, 1), embedding_size=32)
# Convs upstream wraps in legacy weight norm (saved as weight_g / weight_v).
WEIGHT_NORMED = re.compile(r"^(dec\.ups\.\d+|dec\.resblocks\.\d+\.convs\d?\.\d+|flow\.flows\.\d+\.enc\."
                           r"(in_layers\.\d+|res_skip_layers\.\d+|cond_layer))\.weight$")
# the version a SoVITS file names, by the version `write` takes
FILE_VERSIONS = {"v2": "v2", "v2pro": "v2Pro"}


def _t2s_state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    cfg = T2SConfig.from_checkpoint(T2S_MODEL, "tiny")
    model = Text2Semantic(cfg)
    for p in model.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.3)
    with torch.no_grad():
        model.ar_predict_layer.weight[cfg.eos] *= 3.0  # so EOS comes after a few dozen steps
    return {f"model.{k}": v.half() for k, v in model.state_dict().items()}


def _legacy_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        if WEIGHT_NORMED.match(key):
            pair = weight_norm.unfold(key, value, legacy=True)
            g_key, v_key = pair
            out[g_key] = (pair[g_key] * torch.empty_like(pair[g_key]).uniform_(0.9, 1.3)).half()
            out[v_key] = value.half()
        else:
            out[key] = value.half()
    return out


def _vits_state(version: str, gin: int, sv_dim: int, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    cfg = VitsConfig.from_hparams({**VITS_MODEL, "gin_channels": gin}, VITS_DATA, version, "tiny", sv_dim)
    model = Synthesizer(cfg)
    with torch.no_grad():
        model.quantizer.embed.normal_()
        for name, p in model.named_parameters():
            if name.startswith("dec.") and p.dim() > 1:
                torch.nn.init.normal_(p, std=0.05)
    state = _legacy_weight_norm(model.state_dict())
    layer = "quantizer.vq.layers.0._codebook."
    state[layer + "embed_avg"] = state[layer + "embed"].clone()
    state[layer + "cluster_size"] = torch.ones(1024, dtype=torch.float16)
    state[layer + "inited"] = torch.ones(1, dtype=torch.float16)
    return state


def _write_hubert(folder: Path, seed: int) -> None:
    from transformers import HubertConfig, HubertModel

    torch.manual_seed(seed)
    config = HubertConfig(hidden_size=768, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                          conv_dim=(32,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=16)
    HubertModel(config).eval().save_pretrained(str(folder))


BERT_CHARS = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年好今天北京玩"
BERT_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def write_bert_tokenizer(folder: Path) -> int:
    """The BERT folder's tokenizer (a vocabulary of a few dozen characters); returns its size."""
    from transformers import BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join([*BERT_SPECIAL, *"!,-.?…", *BERT_CHARS]) + "\n", encoding="utf-8")
    BertTokenizer(str(vocab)).save_pretrained(str(folder))
    return len(vocab.read_text(encoding="utf-8").split())


def _write_bert(folder: Path, seed: int) -> None:
    from transformers import BertConfig, BertForMaskedLM

    vocab_size = write_bert_tokenizer(folder)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=vocab_size, hidden_size=1024,
                        num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=128)
    BertForMaskedLM(config).half().eval().save_pretrained(str(folder))


def write(directory: str | Path, *, version: str | None = None, seed: int = 1234, dtype: torch.dtype | None = None,
          name: str = "tiny", with_features: bool = True) -> Path:
    """A tiny voice pair in `directory` (`version`: ``v2`` or ``v2pro``; None: ``v2``), in half
    precision as published voices are (`dtype`: float16 or None); `with_features` adds the
    HuBERT and BERT folders (and v2Pro's speaker model)."""
    version = version_of(version, GptSovitsEngine.VERSIONS)
    if dtype not in (None, torch.float16):
        raise ValueError(f"the tiny GPT-SoVITS voice is float16, as published voices are, not {dtype}")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    pro = version == "v2pro"
    with torch.random.fork_rng():
        gpt = {"weight": _t2s_state(seed), "info": "GPT-e15",
               "config": {"model": dict(T2S_MODEL), "data": {"max_sec": 54}, "train": {"exp_name": name}}}
        torch.save(gpt, folder / f"{name}-e15.ckpt")
        sv_cfg = SV_TINY
        hps = {"model": {**VITS_MODEL, "gin_channels": 32 if pro else 512, "version": "v2"}, "data": dict(VITS_DATA),
               "train": {"segment_size": 20480}, "name": name, "version": FILE_VERSIONS[version]}
        sovits = {"weight": _vits_state(FILE_VERSIONS[version], hps["model"]["gin_channels"], sv_cfg.output_dim,
                                        seed + 1),
                  "config": hps, "info": "8epoch_16iteration"}
        buffer = io.BytesIO()
        torch.save(sovits, buffer)
        data = buffer.getvalue()
        (folder / f"{name}_e8_s16.pth").write_bytes(b"05" + data[2:] if pro else data)
        if with_features:
            _write_hubert(folder / "chinese-hubert-base", seed + 2)
            _write_bert(folder / BERT_FOLDER, seed + 4)
            if pro:
                torch.manual_seed(seed + 3)
                sv = ERes2NetV2(sv_cfg).eval()
                (folder / "sv").mkdir(exist_ok=True)
                torch.save(sv.state_dict(), folder / "sv" / "pretrained_eres2netv2w24s4ep4.ckpt")
    return folder
