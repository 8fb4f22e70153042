"""IndexTTS-2's text front end: normalisation, CJK splitting, SentencePiece on bpe.model, and
the split into segments the GPT takes one at a time.

Read from upstream's front end as a specification. Kept: the punctuation map (full-width and
bracket characters to ASCII ones), "x's" -> "x is", the CJK split (each CJK character its own
word, everything upper-cased), the single-character shortcut, and the segment splitting (on
sentence punctuation, then commas, then dashes, then by length; short neighbours merged).
Numbers and symbols are normalised by `wetext` (what upstream uses on macOS and Windows; on Linux
it builds WeTextProcessing's grammars, which may differ in corner cases such as interjections).
Not kept: upstream's protection of names, technical terms, pinyin with tones, e-mail addresses
and <word|reading> annotations from the normaliser, and its glossary.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

from ...errors import MizuotoError

log = logging.getLogger(__name__)

CHAR_MAP = {
    "：": ",", "；": ",", ";": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": " ", "·": "-",
    "、": ",", "...": "…", ",,,": "…", "，，，": "…", "……": "…", "“": "'", "”": "'", '"': "'",
    "‘": "'", "’": "'", "（": "'", "）": "'", "(": "'", ")": "'", "《": "'", "》": "'", "【": "'",
    "】": "'", "[": "'", "]": "'", "—": "-", "～": "-", "~": "-", "「": "'", "」": "'", ":": ",",
}
ZH_CHAR_MAP = {"$": ".", **CHAR_MAP}
CJK = re.compile(r"([\u1100-\u11ff\u2e80-\ua4cf\ua840-\uD7AF\uF900-\uFAFF\uFE30-\uFE4F\uFF65-\uFFDC"
                 r"\U00020000-\U0002FFFF])")
CONTRACTION = re.compile(r"(what|where|who|which|how|t?here|it|s?he|that|this)'s", re.IGNORECASE)
EMAIL = re.compile(r"^[a-zA-Z0-9]+@[a-zA-Z0-9]+\.[a-zA-Z]+$")
SENTENCE_END = (".", "!", "?", "▁.", "▁?", "▁...")
COMMAS = (",", "▁,")
QUOTES = ("'", "▁'")
MAX_SEGMENT_TOKENS = 120


def _replace(text: str, table: dict[str, str]) -> str:
    pattern = re.compile("|".join(re.escape(k) for k in table))
    return pattern.sub(lambda m: table[m.group()], text)


def is_chinese(text: str) -> bool:
    """Upstream's choice of the Chinese path: CJK present, or no Latin letters, or an e-mail."""
    return bool(re.search(r"[\u4e00-\u9fff]", text)) or not re.search(r"[a-zA-Z]", text) or bool(EMAIL.match(text))


class Normalizer:
    """The punctuation and contraction rules, plus wetext's number grammars when installed."""

    def __init__(self) -> None:
        self._zh = self._en = None
        try:
            from wetext import Normalizer as WeText
        except ImportError:
            log.info("indextts2: the wetext package is not installed; numbers and symbols are read as written")
        else:
            self._zh = WeText(remove_erhua=False, lang="zh", operator="tn")
            self._en = WeText(lang="en", operator="tn")

    def __call__(self, text: str) -> str:
        text = CONTRACTION.sub(r"\1 is", text)
        if is_chinese(text):
            text = self._zh.normalize(text.rstrip()) if self._zh else text.rstrip()
            return _replace(text, ZH_CHAR_MAP)
        text = self._en.normalize(text) if self._en else text
        return _replace(text, CHAR_MAP)


def split_cjk(text: str) -> str:
    return " ".join(w.strip().upper() for w in CJK.split(text.strip()) if w.strip())


class TextTokenizer:
    def __init__(self, bpe_model: Path) -> None:
        if not bpe_model.is_file():
            raise MizuotoError(f"IndexTTS-2 tokenizer missing: {bpe_model}")
        from sentencepiece import SentencePieceProcessor

        self.sp = SentencePieceProcessor(model_file=str(bpe_model))
        self.normalize = Normalizer()

    def tokens(self, text: str) -> list[str]:
        if not text:
            return []
        if len(text.strip()) != 1:
            text = split_cjk(self.normalize(text))
        return list(self.sp.Encode(text, out_type=str))

    def ids(self, tokens: list[str]) -> list[int]:
        return [self.sp.PieceToId(t) for t in tokens]

    @property
    def unk_id(self) -> int:
        return self.sp.unk_id()

    def segments(self, text: str, max_tokens: int = MAX_SEGMENT_TOKENS) -> list[list[int]]:
        """The text as the id lists of its segments, each at most `max_tokens` long."""
        pieces = split_segments(self.tokens(text), SENTENCE_END, max_tokens)
        return [self.ids(p) for p in pieces]


def split_segments(tokens: list[str], marks: tuple[str, ...], max_tokens: int) -> list[list[str]]:
    """Upstream's splitting: close a segment at a mark (keeping a following quote), re-split a
    segment holding commas (then dashes) on them, cut an over-long one by length; then merge
    neighbours that fit together."""
    segments: list[list[str]] = []
    current: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        current.append(token)
        if not any(c in marks for c in COMMAS) and any(c in current for c in COMMAS):
            sub = split_segments(current, COMMAS, max_tokens)
        elif "-" not in marks and "-" in current:
            sub = split_segments(current, ("-",), max_tokens)
        elif len(current) <= max_tokens:
            if token in marks and len(current) > 2:
                if i < len(tokens) - 1 and tokens[i + 1] in QUOTES:
                    current.append(tokens[i + 1])  # upstream appends the quote without skipping it
                segments.append(current)
                current = []
            i += 1
            continue
        else:
            log.warning("indextts2: a segment of %d tokens is longer than %d; cut by length", len(current), max_tokens)
            sub = [current[j:j + max_tokens] for j in range(0, len(current), max_tokens)]
        segments.extend(sub)
        current = []
        i += 1
    if current:
        segments.append(current)
    merged: list[list[str]] = []
    for segment in segments:
        if not segment:
            continue
        if merged and (len(merged[-1]) + len(segment) <= max_tokens):
            merged[-1] = merged[-1] + segment
        else:
            merged.append(segment)
    return merged
