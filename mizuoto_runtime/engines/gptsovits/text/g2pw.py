"""g2pW: Chinese polyphones read by a BERT classifier from the user's ``G2PWModel`` folder, as
upstream GPT-SoVITS reads them (issue 26, item 4); without that folder the frontend keeps
pypinyin's phrase dictionary.

Upstream's path, re-implemented here from reading it (GPT-SoVITS ``text/g2pw``, itself from
PaddleSpeech and GitYCC/g2pW; MIT / Apache-2.0): each sentence is converted to Taiwan's
traditional characters (OpenCC ``s2tw``, what g2pW was trained on). A character of the folder's
polyphonic table (``POLYPHONIC_CHARS.txt``, less a fixed list upstream reads with pypinyin) is
asked of the network; one of its monophonic table (``MONOPHONIC_CHARS.txt``, less two) takes
that reading; any other takes pypinyin's ``TONE3`` reading of the sentence turned back to
simplified characters (`zh_normalizer.to_simplified`, upstream's character table). The network's input is
the sentence from 16 characters before its first polyphone to 16 after its last, tokenized by
the chinese-roberta tokenizer (upstream passes its BERT folder as the tokenizer), ``[CLS]`` and
``[SEP]`` around it (texts over 512 tokens are cut around each query as upstream cuts them); a
query is the polyphone's token position, its character id and a mask of its own readings. The
most probable reading (bopomofo, tone digit last) becomes pinyin through
``bopomofo_to_pinyin_wo_tune_dict.json``. Then each word of jieba's cut takes GPT-SoVITS's fixed
readings where it has them (`DATA_FILE`: a whole word, else per character) — upstream's
``correct_pronunciation`` — before tone sandhi.

Memory (M1, M45): the network is ``g2pW.onnx`` converted to a torch module (``onnx2torch``), its
weights the file's initializers, registered as a component (``g2pw``, `oneshot`) and run in its
own phase per request, so its memory is counted, placed and streamed like every other model's
(onnxruntime's would be invisible to the runtime). onnx2torch reads a constant matrix of a
``MatMul`` from a buffer of the graph; `load_net` gives each such matrix to a layer of its own
(`ConstMatMul`, ``torch.matmul`` as onnx2torch calls it, so the numbers do not change) whose
weight streams (M13): those layers are the units (M12), the embeddings and norms the fixed part.
Run in float32 whatever the engine's dtype: the file's precision, the readings upstream gets.
The conversion (13 s and several GB at the published size) runs once per file: the module is
kept as safetensors in the user's cache, keyed by the file's hash (`load_net`, issue 35).

Differences from upstream: upstream runs the texts of a call in one padded batch, or, when one
repeats (its ``g2pw_sentence_dedup``, on by default), each distinct text alone with all its
queries; here each distinct text always runs alone with its queries (the same numbers up to float
rounding). For a sentence over 510 tokens with several polyphones that dedup runs every query on
the first query's cut, each query's position then pointing into the wrong cut; here each query
gets its own cut, as upstream does with dedup off. ``char_bopomofo_dict.json`` is not read
(upstream loads it and reads the same pypinyin reading whether a character is in it or not), and
``config.py`` is read as literals (``use_mask``, ``use_char_phoneme``), never executed. A reading
whose bopomofo has no pinyin in the table (upstream would stop on it) takes pypinyin's.
"""
from __future__ import annotations

import ast
import collections
import dataclasses
import json
import logging
import re
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ....errors import CheckpointError
from . import lexicon
from .zh_normalizer import to_simplified

log = logging.getLogger(__name__)

FOLDER = "G2PWModel"
# Where the folder is looked for (each beside a voice and up to two folders above it, there or in a
# pretrained_models/, see `layout.find_aux`): upstream's place is GPT_SoVITS/text/G2PWModel.
PLACES = (FOLDER, f"text/{FOLDER}", f"GPT_SoVITS/text/{FOLDER}")
GRAPH_FILES = ("g2pW.onnx", "g2pw.onnx")
POLYPHONIC_CHARS = "POLYPHONIC_CHARS.txt"
MONOPHONIC_CHARS = "MONOPHONIC_CHARS.txt"
BOPOMOFO_PINYIN = "bopomofo_to_pinyin_wo_tune_dict.json"
CONFIG = "config.py"
TABLE_FILES = (POLYPHONIC_CHARS, MONOPHONIC_CHARS, BOPOMOFO_PINYIN)
PACKAGES = ("onnx", "onnx2torch", "opencc", "pypinyin")
# Upstream's lists: polyphones it reads with pypinyin, monophones it does not take from the table.
NOT_POLYPHONIC = frozenset("一不和咋嗲剖差攢倒難奔勁拗肖瘙誒泊听噢")
NOT_MONOPHONIC = frozenset("似攢")
CONTEXT_CHARS = 16  # characters kept on each side of a sentence's polyphones
MAX_TOKENS = 512
DATA_FILE = "g2pw.txt"  # data/g2pw.txt (`lexicon`): GPT-SoVITS's fixed readings
HEAD_SIZE = 64  # BERT's attention head width, to size the scores from the hidden width (M45)
# M45: hidden-wide tensors of a layer in flight, and copies of its attention scores (softmax's
# input and output); 1.3-1.5x the peak of live activations walking the tiny graph's nodes (40 and
# 400 tokens).
ACTIVATION_COPIES = 4
SCORE_COPIES = 2

Predict = Callable[[list[dict[str, torch.Tensor]]], list[torch.Tensor]]


def find_folder(start: Path) -> Path | None:
    """The user's G2PWModel folder for a voice in `start` (see `PLACES`), or None."""
    from ..checkpoint import find_aux

    return next((found for place in PLACES if (found := find_aux(start, place)) is not None), None)


def missing(folder: Path) -> str | None:
    """What a G2PWModel folder or this install lacks to run g2pW, in words; None when nothing."""
    if not any((folder / name).is_file() for name in GRAPH_FILES):
        return f"{folder} has no {GRAPH_FILES[0]}"
    lacking = [name for name in TABLE_FILES if not (folder / name).is_file()]
    if lacking:
        return f"{folder} has no {', '.join(lacking)}"
    import importlib.util

    absent = [p for p in PACKAGES if importlib.util.find_spec(p) is None]
    return f"g2pW needs {', '.join(absent)} (requirements/gptsovits.txt)" if absent else None


# ---- data ------------------------------------------------------------------------------------------
@cache
def fixed_readings() -> dict[str, tuple[str, ...]]:
    """GPT-SoVITS's fixed readings of words and characters (`DATA_FILE`)."""
    found = {}
    for entry in lexicon.entries(DATA_FILE, "fixed_readings"):
        word, *syllables = entry.split()
        found[word] = tuple(syllables)
    return found


def correct(word: str, readings: Sequence[str]) -> list[str]:
    """Upstream's ``correct_pronunciation``: the word's fixed readings, else each character's."""
    fixed = fixed_readings()
    if word in fixed:
        return list(fixed[word])
    return [fixed[c][0] if c in fixed else r for c, r in zip(word, readings)]


def syllables(word: str, readings: Sequence[str]) -> tuple[list[str], list[str]]:
    """pypinyin's strict initials and ``FINALS_TONE3`` finals (neutral tone 5) of `word` read as
    `readings` after `correct`; a punctuation mark is its own initial and final."""
    from pypinyin.contrib.tone_convert import to_finals_tone3, to_initials

    initials, finals = [], []
    for reading in correct(word, readings):
        if reading[:1].isalpha():
            initials.append(to_initials(reading))
            finals.append(to_finals_tone3(reading, neutral_tone_with_five=True))
        else:
            initials.append(reading)
            finals.append(reading)
    return initials, finals


# ---- the folder's tables ---------------------------------------------------------------------------
def _literals(path: Path) -> dict[str, Any]:
    """The top-level ``name = literal`` assignments of g2pW's ``config.py`` (never executed)."""
    if not path.is_file():
        return {}
    found: dict[str, Any] = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue  # not a literal: nothing this reads
    return found


def _pairs(path: Path) -> list[tuple[str, str]]:
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").strip().split("\n"), 1):
        parts = line.split("\t")
        if len(parts) != 2:
            raise CheckpointError(f"{path}, line {number}: expected 'character<TAB>bopomofo', got {line!r}")
        pairs.append((parts[0], parts[1]))
    return pairs


@dataclasses.dataclass(frozen=True)
class Tables:
    """What the folder's text files say: the network's labels, which labels each character may
    take, and the readings that need no network."""

    labels: list[str]
    char_ids: dict[str, int]
    char_labels: dict[str, list[int]]
    use_mask: bool
    use_char_phoneme: bool
    polyphonic: frozenset[str]
    monophonic: dict[str, str]  # character → bopomofo
    bopomofo: dict[str, str]  # toneless bopomofo → pinyin

    def pinyin(self, bopomofo: str) -> str | None:
        """``ㄏㄤ2`` → ``hang2``; None when the table has no pinyin for it."""
        if bopomofo[-1:] not in ("1", "2", "3", "4", "5"):
            return None
        base = self.bopomofo.get(bopomofo[:-1])
        return base + bopomofo[-1] if base else None

    def mask(self, char: str) -> list[float]:
        if not self.use_mask:
            return [1.0] * len(self.labels)
        allowed = set(self.char_labels[char])
        return [1.0 if i in allowed else 0.0 for i in range(len(self.labels))]


def read_tables(folder: Path) -> Tables:
    config = _literals(folder / CONFIG)
    use_char_phoneme = bool(config.get("use_char_phoneme", False))
    pairs = _pairs(folder / POLYPHONIC_CHARS)
    names = [f"{c} {p}" if use_char_phoneme else p for c, p in pairs]
    labels = sorted(set(names))
    index = {label: i for i, label in enumerate(labels)}
    char_labels: dict[str, list[int]] = {}
    for (char, _), name in zip(pairs, names):
        char_labels.setdefault(char, []).append(index[name])
    try:
        bopomofo = json.loads((folder / BOPOMOFO_PINYIN).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{folder / BOPOMOFO_PINYIN}: not JSON ({exc})") from exc
    chars = sorted(char_labels)
    return Tables(labels=labels, char_ids={c: i for i, c in enumerate(chars)}, char_labels=char_labels,
                  use_mask=bool(config.get("use_mask", True)), use_char_phoneme=use_char_phoneme,
                  polyphonic=frozenset(chars) - NOT_POLYPHONIC,
                  monophonic={c: p for c, p in _pairs(folder / MONOPHONIC_CHARS) if c not in NOT_MONOPHONIC},
                  bopomofo=bopomofo)


# ---- the network -----------------------------------------------------------------------------------
class ConstMatMul(nn.Module):
    """``x @ weight`` for a matrix the ONNX graph holds as a constant: a layer that reads its
    weight only in its own forward, so the weight streams (M13)."""

    STREAMABLE = True

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight)


class G2PWNet(nn.Module):
    """The converted graph: six ``[B, T]`` / ``[B]`` inputs → ``[queries, labels]`` probabilities."""

    def __init__(self, graph: nn.Module, matmuls: list[ConstMatMul]) -> None:
        super().__init__()
        self.graph = graph
        self._units = matmuls  # plain list: the modules are registered under `graph`

    def memory_units(self) -> list[nn.Module]:
        """M12: each constant matrix's layer."""
        return list(self._units)

    @property
    def hidden_size(self) -> int:
        """The encoder's width: the input width most of its matrices have (q, k, v, out, up)."""
        widths = collections.Counter(int(u.weight.shape[0]) for u in self._units)
        return widths.most_common(1)[0][0] if widths else 0

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        order = ("input_ids", "token_type_ids", "attention_mask", "phoneme_mask", "char_ids", "position_ids")
        out = self.graph(*(inputs[name] for name in order))
        return out[0] if isinstance(out, (tuple, list)) else out


def _own_matmuls(graph: Any) -> list[ConstMatMul]:
    """Give every ``MatMul`` whose second input is a constant 2-D matrix read by it alone a
    `ConstMatMul` holding that matrix, and drop the graph's buffer of it."""
    from onnx2torch.node_converters.matmul import OnnxMatMul

    made: list[ConstMatMul] = []
    for node in list(graph.graph.nodes):
        if node.op != "call_module" or not isinstance(graph.get_submodule(node.target), OnnxMatMul):
            continue
        source = node.args[1] if len(node.args) == 2 else None
        if getattr(source, "op", None) != "get_attr" or len(source.users) != 1:
            continue
        owner, _, name = source.target.rpartition(".")
        weight = graph.get_submodule(owner)._buffers.get(name) if owner else None
        if weight is None or weight.dim() != 2:
            continue
        layer = ConstMatMul(weight)
        target = f"{node.target}_const"
        graph.add_submodule(target, layer)
        with graph.graph.inserting_after(node):
            replacement = graph.graph.call_module(target, (node.args[0],))
        node.replace_all_uses_with(replacement)
        graph.graph.erase_node(node)
        graph.graph.erase_node(source)
        del graph.get_submodule(owner)._buffers[name]
        made.append(layer)
    graph.graph.lint()
    graph.recompile()
    return made


CACHE_FOLDER = "g2pw"  # under `checkpoint_files.cache_root`: the converted network, per ONNX file


def load_net(folder: Path, cache: Path | None = None) -> G2PWNet:
    """``g2pW.onnx`` as a torch module in float32 (see the module doc). `cache`: where the
    converted module is kept as safetensors, keyed by the file's hash (`nn.onnx_cache`), so
    that later loads skip the conversion; None converts every time."""
    from ....nn.onnx_cache import load_converted

    path = next(folder / name for name in GRAPH_FILES if (folder / name).is_file())
    net = load_converted(path, _build, cache)
    assert isinstance(net, G2PWNet)
    return net


def _build(graph: Any) -> G2PWNet:
    return G2PWNet(graph, _own_matmuls(graph)).float().eval()


def memory(net: G2PWNet, tokens: int, queries: int, n_labels: int) -> int:
    """M45: float32 activations of one text: a layer's hidden-wide copies, its 4x-wide MLP, the
    attention scores of every head, and the queries' rows."""
    hidden = net.hidden_size
    heads = max(1, hidden // HEAD_SIZE)
    return 4 * ((ACTIVATION_COPIES + 4) * tokens * hidden + SCORE_COPIES * heads * tokens * tokens
                + queries * (hidden + n_labels))


# ---- inputs ----------------------------------------------------------------------------------------
_WORD = re.compile(r" +|[a-zA-Z0-9]+|.", re.S)


def tokenize(tokenizer: Any, text: str) -> tuple[list[str], list[int | None]]:
    """Tokens of `text` as upstream makes them (spaces dropped, an ASCII letter/digit run one
    word, any other character one word, each word tokenized alone, a word of no token or only
    unknowns one ``[UNK]``) and each character's token index (None for a space)."""
    tokens: list[str] = []
    spans: list[tuple[int, int]] = []
    char_token: list[int | None] = []
    words = 0
    for match in _WORD.finditer(text):
        piece, start = match.group(), match.start()
        if piece[0] == " ":
            char_token += [None] * len(piece)
            continue
        char_token += [words] * len(piece)  # upstream's map starts from word indices
        words += 1
        found = tokenizer.tokenize(piece)
        if not found or found == ["[UNK]"]:
            tokens.append("[UNK]")
            spans.append((start, start + len(piece)))
            continue
        at = start
        for token in found:
            width = len(token[2:] if token.startswith("##") else token)
            tokens.append(token)
            spans.append((at, at + width))
            at += width
    for index, (start, end) in enumerate(spans):
        for position in range(start, end):
            char_token[position] = index
    return tokens, char_token


def _window(tokens: list[str], at: int) -> tuple[list[str], int]:
    """Upstream's cut of a text over `MAX_TOKENS`: ``MAX_TOKENS - 2`` tokens around the query's
    token `at`, shifted to stay inside the text; those tokens and the query's index in them."""
    size = MAX_TOKENS - 2
    start = max(0, min(at - size // 2, len(tokens) - size))
    return tokens[start:start + size], at - start


def inputs(tokenizer: Any, tables: Tables, text: str, queries: Sequence[int]) -> list[dict[str, torch.Tensor]]:
    """The network's inputs for the polyphones at `queries` of `text`: one batch for a text that
    fits (its queries share the encoder row), else one per query with its own cut."""
    text = text.lower()
    tokens, char_token = tokenize(tokenizer, text)
    at = [char_token[q] for q in queries]
    if any(a is None for a in at):
        raise ValueError(f"g2pW: a polyphone of {text!r} has no token")
    if len(tokens) <= MAX_TOKENS - 2:
        cuts = [(tokens, at, list(queries))]
    else:
        cuts = [(part, [where], [q]) for q, a in zip(queries, at) for part, where in [_window(tokens, a)]]
    batches = []
    for part, positions, asked in cuts:
        ids = tokenizer.convert_tokens_to_ids(["[CLS]", *part, "[SEP]"])
        batches.append({
            "input_ids": torch.tensor([ids], dtype=torch.long),
            "token_type_ids": torch.zeros(1, len(ids), dtype=torch.long),
            "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            "phoneme_mask": torch.tensor([tables.mask(text[q]) for q in asked], dtype=torch.float32),
            "char_ids": torch.tensor([tables.char_ids[text[q]] for q in asked], dtype=torch.long),
            "position_ids": torch.tensor([p + 1 for p in positions], dtype=torch.long),  # after [CLS]
        })
    return batches


# ---- readings --------------------------------------------------------------------------------------
@cache
def _taiwan_converter() -> Any:
    import opencc

    return opencc.OpenCC("s2tw")


def to_taiwan(text: str) -> str:
    """`text` in Taiwan's traditional characters (OpenCC ``s2tw``), as g2pW reads it."""
    taiwan = _taiwan_converter().convert(text)
    if len(taiwan) != len(text):
        raise ValueError(f"OpenCC changed the length of {text!r} to {taiwan!r}")
    return taiwan


class Polyphones:
    """Per character of each sentence, its pinyin (``TONE3``, neutral tone 5; a mark: itself).
    `predict` runs the network on a list of inputs (the engine runs it in the ``g2pw`` phase)."""

    def __init__(self, tables: Tables, tokenizer: Any, predict: Predict) -> None:
        self.tables = tables
        self.tokenizer = tokenizer
        self.predict = predict

    @staticmethod
    def _pypinyin(taiwan: str) -> list[str]:
        """pypinyin's reading of each character of the sentence turned back to simplified
        characters; indexed by character as upstream does (pypinyin gives one item per run of
        what is not Chinese, which normalised text has one at a time)."""
        from pypinyin import Style, pinyin

        items = pinyin(to_simplified(taiwan), neutral_tone_with_five=True, style=Style.TONE3)
        return [items[i][0] if i < len(items) else c for i, c in enumerate(taiwan)]

    def _known(self, taiwan: str, fallback: list[str]) -> tuple[list[str], list[int]]:
        """The readings that need no network, and the positions that do (theirs `fallback`'s for now)."""
        readings = list(fallback)
        asked: list[int] = []
        for i, char in enumerate(taiwan):
            if char in self.tables.polyphonic:
                asked.append(i)
            elif char in self.tables.monophonic:
                readings[i] = self.tables.pinyin(self.tables.monophonic[char]) or fallback[i]
        return readings, asked

    def __call__(self, sentences: Sequence[str]) -> list[list[str]]:
        results: list[list[str]] = []
        jobs: list[tuple[int, list[int], list[dict[str, torch.Tensor]], int]] = []
        for n, sentence in enumerate(sentences):
            taiwan = to_taiwan(sentence)
            readings, asked = self._known(taiwan, self._pypinyin(taiwan))
            results.append(readings)
            if asked:
                left = max(0, asked[0] - CONTEXT_CHARS)
                right = min(len(taiwan), asked[-1] + CONTEXT_CHARS + 1)
                batches = inputs(self.tokenizer, self.tables, taiwan[left:right], [i - left for i in asked])
                jobs.append((n, asked, batches, left))
        if not jobs:
            return results
        probs = self.predict([b for _, _, batches, _ in jobs for b in batches])
        rows = iter(row for p in probs for row in p)
        for n, asked, _, _ in jobs:
            for i in asked:
                label = self.tables.labels[int(torch.argmax(next(rows)))]
                bopomofo = label.split(" ")[1] if self.tables.use_char_phoneme else label
                results[n][i] = self.tables.pinyin(bopomofo) or results[n][i]
        return results
