"""Fish Speech's text tokenizers, as each published layout ships them.

* S2-Pro: ``tokenizer.json``, a byte-level BPE (the `tokenizers` library reads it) whose special
  tokens include ``<|im_start|>``, ``<|im_end|>``, ``<|voice|>`` and ``<|semantic:i|>``.
* S1-mini: ``tokenizer.tiktoken`` (base64 token, rank per line) and ``special_tokens.json``
  (`tiktoken` reads them with upstream's split pattern). Upstream numbers the special tokens
  after the ordinary ones in the JSON's key order, ignoring the ids the JSON gives; so does this.

Special tokens written in the text are parsed as special tokens (``<|speaker:0|>`` is plain
text in both). The semantic range is the smallest and largest id of ``<|semantic:i|>``,
``i < 4096``.
"""
from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Protocol

from ...errors import CheckpointError
from ..checkpoint_files import read_json

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VOICE = "<|voice|>"
INTERLEAVE = "<|interleave|>"
SEMANTIC = "<|semantic:{i}|>"
MAX_SEMANTIC = 4096

# Upstream's S1 split pattern (GPT-4o's, with punctuation split off).
S1_PATTERN = "|".join([
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)", r"\p{P}", r"[^\r\n\p{L}\p{N}]?\p{L}+", r"\p{N}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*", r"\s*[\r\n]+", r"\s+(\?!\S)", r"\s+",
])
S1_CHUNK_CHARS = 400_000


class TextTokenizer(Protocol):
    semantic_begin_id: int
    semantic_end_id: int

    def encode(self, text: str) -> list[int]: ...

    def token_id(self, token: str) -> int: ...


def _semantic_range(vocab: dict[str, int], where: Path) -> tuple[int, int]:
    ids = [vocab[t] for t in (SEMANTIC.format(i=i) for i in range(MAX_SEMANTIC)) if t in vocab]
    if not ids:
        raise CheckpointError(f"{where}: no <|semantic:i|> tokens: not a Fish Speech tokenizer")
    return min(ids), max(ids)


class JsonTokenizer:
    """S2-Pro's ``tokenizer.json``."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the tokenizers library raises a bare Exception on a bad file
            raise CheckpointError(f"{path}: cannot be read as a tokenizer ({exc})") from exc
        self._vocab = self._tok.get_vocab(with_added_tokens=True)
        self.semantic_begin_id, self.semantic_end_id = _semantic_range(self._vocab, path)
        self.path = path

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def token_id(self, token: str) -> int:
        if token not in self._vocab:
            raise CheckpointError(f"{self.path}: has no token {token}")
        return self._vocab[token]


class TiktokenTokenizer:
    """S1-mini's ``tokenizer.tiktoken`` + ``special_tokens.json``."""

    def __init__(self, folder: Path) -> None:
        try:
            import tiktoken
        except ImportError as exc:
            raise CheckpointError(f"{folder}: reading tokenizer.tiktoken needs the 'tiktoken' package "
                                  "(requirements/fishspeech.txt)") from exc
        path, specials_path = folder / "tokenizer.tiktoken", folder / "special_tokens.json"
        ranks = self._ranks(path)
        names = list(read_json(specials_path))
        self._specials = {name: len(ranks) + i for i, name in enumerate(names)}
        self.semantic_begin_id, self.semantic_end_id = _semantic_range(self._specials, specials_path)
        self._enc = tiktoken.Encoding(name=path.stem, pat_str=S1_PATTERN, mergeable_ranks=ranks,
                                      special_tokens=self._specials)
        self.path = specials_path

    @staticmethod
    def _ranks(path: Path) -> dict[bytes, int]:
        ranks: dict[bytes, int] = {}
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path}: cannot be read ({exc})") from exc
        for n, line in enumerate(lines, 1):
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2 or not parts[1].isdigit():
                raise CheckpointError(f"{path}: line {n} is not '<base64 token> <rank>'")
            if parts[0] != "=":
                ranks[base64.b64decode(parts[0])] = int(parts[1])
        return ranks

    def __len__(self) -> int:
        return self._enc.n_vocab

    def encode(self, text: str) -> list[int]:
        chunks = [text[i:i + S1_CHUNK_CHARS] for i in range(0, len(text), S1_CHUNK_CHARS)]
        allowed = self._enc.special_tokens_set
        return [t for ids in self._enc.encode_batch(chunks, allowed_special=allowed, disallowed_special=set())
                for t in ids]

    def token_id(self, token: str) -> int:
        if token not in self._specials:
            raise CheckpointError(f"{self.path}: has no special token {token}")
        return self._specials[token]


def load_tokenizer(folder: Path) -> JsonTokenizer | TiktokenTokenizer:
    if (folder / "tokenizer.json").is_file():
        return JsonTokenizer(folder / "tokenizer.json")
    if (folder / "tokenizer.tiktoken").is_file() and (folder / "special_tokens.json").is_file():
        return TiktokenTokenizer(folder)
    raise CheckpointError(f"{folder}: no tokenizer.json (S2-Pro) "
                          "nor tokenizer.tiktoken + special_tokens.json (S1-mini)")


SPEAKER_TAG = re.compile(r"<\|speaker:\d+\|>")
