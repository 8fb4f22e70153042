"""A tiny ``G2PWModel`` folder in the published layout, for the g2pW tests (issue 26, item 4).

The published folder holds ``g2pW.onnx`` (a BERT-base encoder exported from torch with g2pW's
head), ``config.py``, ``POLYPHONIC_CHARS.txt`` / ``MONOPHONIC_CHARS.txt`` (traditional
characters with their bopomofo readings, tone digit last), ``bopomofo_to_pinyin_wo_tune_dict.json``
and ``char_bopomofo_dict.json``. This writes the same files at toy size: a two-layer post-norm
BERT with g2pW's interface (inputs ``input_ids``, ``token_type_ids``, ``attention_mask``
``[B, T]`` int64, ``phoneme_mask`` ``[B, labels]`` float, ``char_ids`` and ``position_ids``
``[B]`` int64; output ``[B, labels]`` probabilities) exported by torch's TorchScript exporter at
opset 11, random weights from `seed`, and a dozen polyphonic characters. Its encoder is ours, not
g2pW's code: what matters is the graph's interface and that its readings come from the weights.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch
from torch import nn

INPUTS = ("input_ids", "token_type_ids", "attention_mask", "phoneme_mask", "char_ids", "position_ids")
# Traditional characters and readings (bopomofo, tone digit last), as the published tables are.
POLYPHONIC = {"行": ("ㄒㄧㄥ2", "ㄏㄤ2"), "長": ("ㄔㄤ2", "ㄓㄤ3"), "重": ("ㄓㄨㄥ4", "ㄔㄨㄥ2"),
              "好": ("ㄏㄠ3", "ㄏㄠ4"), "樂": ("ㄌㄜ4", "ㄩㄝ4"), "還": ("ㄏㄞ2", "ㄏㄨㄢ2"),
              "得": ("ㄉㄜ2", "ㄉㄜ5", "ㄉㄟ3"), "了": ("ㄌㄜ5", "ㄌㄧㄠ3"), "著": ("ㄓㄜ5", "ㄓㄠ2", "ㄓㄨㄛ2"),
              "都": ("ㄉㄡ1", "ㄉㄨ1"), "為": ("ㄨㄟ2", "ㄨㄟ4"), "地": ("ㄉㄧ4", "ㄉㄜ5"),
              "中": ("ㄓㄨㄥ1", "ㄓㄨㄥ4"), "大": ("ㄉㄚ4", "ㄉㄞ4"), "和": ("ㄏㄜ2", "ㄏㄜ4")}
# 似: upstream reads it with pypinyin
MONOPHONIC = {"你": "ㄋㄧ3", "們": "ㄇㄣ5", "天": "ㄊㄧㄢ1", "是": "ㄕ4", "我": "ㄨㄛ3", "似": "ㄕ4"}
PINYIN = {"ㄒㄧㄥ": "xing", "ㄏㄤ": "hang", "ㄔㄤ": "chang", "ㄓㄤ": "zhang", "ㄓㄨㄥ": "zhong", "ㄔㄨㄥ": "chong",
          "ㄏㄠ": "hao", "ㄌㄜ": "le", "ㄩㄝ": "yue", "ㄏㄞ": "hai", "ㄏㄨㄢ": "huan", "ㄉㄜ": "de", "ㄉㄟ": "dei",
          "ㄌㄧㄠ": "liao", "ㄓㄜ": "zhe", "ㄓㄠ": "zhao", "ㄓㄨㄛ": "zhuo", "ㄉㄡ": "dou", "ㄉㄨ": "du",
          "ㄨㄟ": "wei", "ㄉㄧ": "di", "ㄉㄚ": "da", "ㄉㄞ": "dai", "ㄏㄜ": "he", "ㄋㄧ": "ni", "ㄇㄣ": "men",
          "ㄊㄧㄢ": "tian", "ㄕ": "shi", "ㄨㄛ": "wo"}


@dataclasses.dataclass(frozen=True)
class Size:
    vocab: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    positions: int = 512


# vocab: at least every tokenizer vocabulary the tests give it; 64 KB matrices: they stream
TINY = Size(vocab=256, hidden=128, layers=2, heads=2, intermediate=256)
# The published g2pW's encoder: bert-base-chinese (issue 35: its load time at full size). The
# published head's conditional descriptors are left out (our head is the tiny one's).
PUBLISHED = Size(vocab=21128, hidden=768, layers=12, heads=12, intermediate=3072)


def labels() -> list[str]:
    return sorted({r for readings in POLYPHONIC.values() for r in readings})


class _Layer(nn.Module):
    def __init__(self, size: Size) -> None:
        super().__init__()
        hidden = size.hidden
        self.n_heads = size.heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.out = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden, eps=1e-12)
        self.up = nn.Linear(hidden, size.intermediate)
        self.down = nn.Linear(size.intermediate, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, t, hidden = x.shape
        d = hidden // self.n_heads

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.n_heads, d).permute(0, 2, 1, 3)

        scores = heads(self.query(x)) @ heads(self.key(x)).transpose(-1, -2) / math.sqrt(d) + bias
        context = (torch.softmax(scores, dim=-1) @ heads(self.value(x))).permute(0, 2, 1, 3).reshape(b, t, hidden)
        x = self.norm1(x + self.out(context))
        return self.norm2(x + self.down(nn.functional.gelu(self.up(x))))


class TinyG2PW(nn.Module):
    """A BERT encoder, the query character's hidden state scaled by a per-character vector, a
    classifier, and a softmax over the character's own readings (`phoneme_mask`)."""

    def __init__(self, chars: int, n_labels: int, size: Size = TINY) -> None:
        super().__init__()
        self.words = nn.Embedding(size.vocab, size.hidden)
        self.positions = nn.Embedding(size.positions, size.hidden)
        self.types = nn.Embedding(2, size.hidden)
        self.norm = nn.LayerNorm(size.hidden, eps=1e-12)
        self.layers = nn.ModuleList(_Layer(size) for _ in range(size.layers))
        self.chars = nn.Embedding(chars, size.hidden)
        self.classifier = nn.Linear(size.hidden, n_labels)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor,
                phoneme_mask: torch.Tensor, char_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        x = self.words(input_ids) + self.types(token_type_ids) + self.positions(torch.arange(t).unsqueeze(0))
        x = self.norm(x)
        bias = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
        for layer in self.layers:
            x = layer(x, bias)
        # the batch of the encoder (one row when the queries share a sentence) indexes the queries
        picked = x[torch.arange(input_ids.shape[0]), position_ids]
        logits = self.classifier(picked * self.chars(char_ids))
        weighted = torch.exp(logits - logits.max(dim=1, keepdim=True)[0]) * phoneme_mask
        return torch.clamp(weighted / weighted.sum(dim=1, keepdim=True), 1e-6, 1 - 1e-6)


def write_onnx(path: Path, seed: int, size: Size = TINY) -> None:
    import warnings

    torch.manual_seed(seed)
    chars = sorted(POLYPHONIC)
    model = TinyG2PW(len(chars), len(labels()), size).eval()
    with torch.no_grad():  # sharper than the default init, so the readings differ between seeds
        model.classifier.weight.mul_(20)
        model.chars.weight.normal_(0, 2)
    b, t = 2, 7
    example = (torch.randint(0, size.vocab, (b, t)), torch.zeros(b, t, dtype=torch.long),
               torch.ones(b, t, dtype=torch.long), torch.ones(b, len(labels())), torch.tensor([0, 1]),
               torch.tensor([1, 2]))
    axes = {name: ({0: "batch", 1: "tokens"} if i < 3 else {0: "queries"}) for i, name in enumerate(INPUTS)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, example, str(path), dynamo=False, opset_version=11, input_names=list(INPUTS),
                          output_names=["probs"], dynamic_axes={**axes, "probs": {0: "queries"}})


def write_folder(folder: Path, seed: int = 1, size: Size = TINY) -> Path:
    """A G2PWModel folder (`seed`: the network's weights; `size`: its encoder's)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_onnx(folder / "g2pW.onnx", seed, size)
    (folder / "config.py").write_text("manual_seed = 1313\nmodel_source = 'bert-base-chinese'\nwindow_size = 32\n"
                                      "use_mask = True\nuse_char_phoneme = False\nuse_conditional = True\n",
                                      encoding="utf-8")
    (folder / "POLYPHONIC_CHARS.txt").write_text(
        "\n".join(f"{c}\t{r}" for c, readings in POLYPHONIC.items() for r in readings) + "\n", encoding="utf-8")
    (folder / "MONOPHONIC_CHARS.txt").write_text("\n".join(f"{c}\t{r}" for c, r in MONOPHONIC.items()) + "\n",
                                                 encoding="utf-8")
    (folder / "bopomofo_to_pinyin_wo_tune_dict.json").write_text(json.dumps(PINYIN, ensure_ascii=False),
                                                                 encoding="utf-8")
    bopomofo = {c: list(r) for c, r in POLYPHONIC.items()} | {c: [r] for c, r in MONOPHONIC.items()}
    (folder / "char_bopomofo_dict.json").write_text(json.dumps(bopomofo, ensure_ascii=False), encoding="utf-8")
    return folder


def write_tokenizer(folder: Path) -> Path:
    """A BERT tokenizer whose vocabulary has the tables' characters, simplified and traditional."""
    from transformers import BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    chars = dict.fromkeys("行长重好乐还得了着都为地中大和你们天是我似一不今北京玩"
                          + "".join(POLYPHONIC) + "".join(MONOPHONIC))
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"!,-.?…", *chars]) + "\n",
                     encoding="utf-8")
    BertTokenizer(str(vocab)).save_pretrained(str(folder))
    return folder
