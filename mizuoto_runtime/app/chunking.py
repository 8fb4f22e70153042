"""Long text: sentence-aware chunks, each synthesized in its own phases, joined by a crossfade.

An autoregressive TTS model runs into its `max_new_tokens` on long text, and its quality drifts
long before. So a host cuts the text at sentence ends (English `. ! ? …`, Chinese and Japanese
`。！？`, line breaks) into chunks of at most `max_chars` characters, packing whole sentences;
a sentence longer than that is cut at clause marks (`, ; :` `，；：、`), then between words, and
only then anywhere. Each chunk runs the engine's talker and decoder phases in turn (the voice
is prompted once), and consecutive chunks overlap by a short linear crossfade.

Same seed, same audio: chunk *i* samples with seed + *i*, so a chunk's audio depends only on
the seed, its index and its own text. A text that fits in one chunk runs exactly as it would
unchunked (seed unchanged, no crossfade).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

import torch

from ..audio import Audio
from ..engines.base import chunk_seed
from ..errors import MizuotoError

#: Characters per chunk by default: about 12 s of English or 40 s of Chinese speech, well
#: inside every engine's token limit and before autoregressive drift is heard.
DEFAULT_CHUNK_CHARS = 200
MIN_CHUNK_CHARS = 20
#: The overlap of consecutive chunks: long enough to hide a click, short against a pause.
CROSSFADE_MS = 50.0

SENTENCE_ENDS_CJK = "。！？｡"
SENTENCE_ENDS = ".!?…‽" + SENTENCE_ENDS_CJK
CLAUSE_ENDS_CJK = "，；：、"
CLAUSE_ENDS = ",;:—–" + CLAUSE_ENDS_CJK
CLOSERS = "\"')]}»”’」』）】〉》"
OPENERS = "\"'([{«“‘「『（【〈《"
#: Words a period follows without ending the sentence (lower case, without the period).
ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "e.g", "i.e", "cf", "fig",
    "no", "vol", "ch", "p", "pp", "approx", "inc", "ltd", "co", "corp", "dept", "est",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
})

Span = tuple[int, int]


def is_cjk(ch: str) -> bool:
    """CJK ideographs, kana and full-width forms: scripts written without spaces."""
    code = ord(ch)
    return 0x3000 <= code <= 0x9FFF or 0xF900 <= code <= 0xFAFF or 0xFF00 <= code <= 0xFFEF


def _ends_sentence(text: str, start: int, stop: int) -> bool:
    """Whether the run of sentence-end marks text[start:stop] (closers included) ends a sentence."""
    run = text[start:stop]
    if any(ch in SENTENCE_ENDS_CJK for ch in run):
        return True
    following = text[stop] if stop < len(text) else ""
    if following and not (following.isspace() or is_cjk(following)):
        return False  # 3.14, e.g.x, a URL
    if text[stop:].lstrip()[:1].islower():
        return False  # "e.g. the", '"Why?" he asked': a sentence starts upper case
    if run.rstrip(CLOSERS) != ".":
        return True  # ! ? … and runs like ?! or ...
    word = text[:start].rsplit(None, 1)[-1].lstrip(OPENERS) if text[:start].strip() else ""
    return not (word.lower() in ABBREVIATIONS or (len(word) == 1 and word.isalpha()))  # Dr. Smith, J. R. R.


def _ends_clause(text: str, start: int, stop: int) -> bool:
    """Whether the run of clause marks text[start:stop] ends a piece of an overlong sentence:
    CJK marks always; others before whitespace, a CJK character or the end."""
    following = text[stop] if stop < len(text) else ""
    return (any(ch in CLAUSE_ENDS_CJK for ch in text[start:stop]) or not following or following.isspace()
            or is_cjk(following))


def _cuts(text: str, begin: int, end: int, marks: str, ends: Callable[[str, int, int], bool]) -> list[int]:
    """Positions in text[begin:end] just after each run of `marks` (with its closers) that
    `ends(text, start, stop)` accepts."""
    cuts = []
    i = begin
    while i < end:
        if text[i] not in marks:
            i += 1
            continue
        j = i
        while j < end and text[j] in marks:
            j += 1
        while j < end and text[j] in CLOSERS:
            j += 1
        if ends(text, i, j):
            cuts.append(j)
        i = j
    return cuts


def _spans(text: str, begin: int, end: int, cuts: Sequence[int]) -> list[Span]:
    """text[begin:end] cut at `cuts`, without empty or whitespace-only pieces."""
    bounds = [begin, *(c for c in cuts if begin < c < end), end]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if text[a:b].strip()]


def sentence_spans(text: str) -> list[Span]:
    """(start, end) of each sentence of `text`, in order; whitespace goes with the sentence
    before it, so the spans cover the text."""
    cuts = _cuts(text, 0, len(text), SENTENCE_ENDS, _ends_sentence)
    cuts += [m.end() for m in re.finditer(r"\n", text)]
    return _spans(text, 0, len(text), sorted(set(cuts)))


def split_sentences(text: str) -> list[str]:
    return [text[a:b].strip() for a, b in sentence_spans(text)]


def _length(text: str, span: Span) -> int:
    return len(text[span[0]:span[1]].strip())


def _fit(text: str, span: Span, max_chars: int) -> list[Span]:
    """A sentence as pieces of at most `max_chars`: at clause marks, then between words, then
    anywhere (text with neither, such as Chinese without punctuation)."""
    if _length(text, span) <= max_chars:
        return [span]
    a, b = span
    clauses = _cuts(text, a, b, CLAUSE_ENDS, _ends_clause)
    words = [a + m.end() for m in re.finditer(r"\s+", text[a:b])]
    for cuts in (clauses, words):
        pieces = _spans(text, a, b, cuts)
        if len(pieces) > 1:
            return [p for piece in _pack(text, pieces, max_chars) for p in _fit(text, piece, max_chars)]
    start = a + len(text[a:b]) - len(text[a:b].lstrip())
    return [(i, min(i + max_chars, b)) for i in range(start, b, max_chars) if text[i:min(i + max_chars, b)].strip()]


def _pack(text: str, spans: Sequence[Span], max_chars: int) -> list[Span]:
    """Consecutive spans joined while the joined text fits in `max_chars` (greedy)."""
    packed: list[Span] = []
    for span in spans:
        if packed and _length(text, (packed[-1][0], span[1])) <= max_chars:
            packed[-1] = (packed[-1][0], span[1])
        else:
            packed.append(span)
    return packed


def chunk_text(text: str, max_chars: int = DEFAULT_CHUNK_CHARS) -> list[str]:
    """`text` as chunks of whole sentences, each at most `max_chars` characters (a longer
    sentence is cut as `_fit` says). The original spacing inside a chunk is kept."""
    if max_chars < 1:
        raise MizuotoError(f"chunk size must be at least 1 character, got {max_chars}")
    pieces = [p for span in sentence_spans(text) for p in _fit(text, span, max_chars)]
    return [text[a:b].strip() for a, b in _pack(text, pieces, max_chars)]


@dataclasses.dataclass(frozen=True)
class TextChunking:
    """How a host splits long text: on or off, at most `max_chars` per chunk, and the
    crossfade between chunks."""

    enabled: bool = True
    max_chars: int = DEFAULT_CHUNK_CHARS
    crossfade_ms: float = CROSSFADE_MS

    def __post_init__(self) -> None:
        if self.max_chars < MIN_CHUNK_CHARS:
            raise MizuotoError(f"chunk size: at least {MIN_CHUNK_CHARS} characters, got {self.max_chars}")
        if self.crossfade_ms < 0:
            raise MizuotoError(f"chunk crossfade: at least 0 ms, got {self.crossfade_ms}")

    def split(self, text: str) -> list[str]:
        """The chunks to synthesize: the text itself when off or when it has no sentence."""
        if not self.enabled:
            return [text]
        return chunk_text(text, self.max_chars) or [text]


NO_CHUNKING = TextChunking(enabled=False)


def crossfade_samples(sample_rate: int, crossfade_ms: float) -> int:
    return round(sample_rate * crossfade_ms / 1000)


def join_chunks(pieces: Sequence[Audio], crossfade_ms: float = CROSSFADE_MS) -> Audio:
    """Chunks' audio as one: each overlaps the previous by `crossfade_ms` (less where a piece
    is shorter), faded linearly. One piece is returned as it is."""
    if not pieces:
        raise MizuotoError("join_chunks: no audio to join")
    first = pieces[0]
    for piece in pieces[1:]:
        if piece.sample_rate != first.sample_rate or piece.waveform.shape[0] != first.waveform.shape[0]:
            raise MizuotoError(f"join_chunks: chunks differ: {first.sample_rate} Hz × {first.waveform.shape[0]} "
                               f"channels vs {piece.sample_rate} Hz × {piece.waveform.shape[0]}")
    if len(pieces) == 1:
        return first
    target = crossfade_samples(first.sample_rate, crossfade_ms)
    out = first.waveform
    for piece in pieces[1:]:
        wave = piece.waveform.to(out.dtype)
        fade = min(target, out.shape[-1], wave.shape[-1])
        ramp = torch.linspace(0, 1, fade, dtype=out.dtype) if fade else out.new_zeros(0)
        overlap = out[..., out.shape[-1] - fade:] * (1 - ramp) + wave[..., :fade] * ramp
        out = torch.cat([out[..., :out.shape[-1] - fade], overlap, wave[..., fade:]], dim=-1)
    return Audio(out, first.sample_rate)


class ChunkProgress:
    """One progress bar over every chunk: chunk *i*'s own (done, total) fills its share. With
    one chunk the engine's figures pass through unchanged.

    Chunks run phase by phase (`phases` of them: every chunk's talker, then every chunk's
    decode), so the bar has `chunks` x `phases` slots, in run order: `phase` and `index` say
    which slot the engine's figures fill now."""

    STEPS = 1000  # per chunk

    def __init__(self, on_progress: Callable[[int, int], None] | None, chunks: int, phases: int = 1) -> None:
        self.on_progress = on_progress
        self.chunks = chunks
        self.phases = phases
        self.index = 0
        self.phase = 0

    def __call__(self, done: int, total: int) -> None:
        if self.on_progress is None:
            return
        if self.chunks == 1:
            self.on_progress(done, total)
            return
        share = min(max(done / total, 0.0), 1.0) if total > 0 else 0.0
        self._report(share)

    def finished(self, phase: int, index: int) -> None:
        """A chunk's phase ended: its slot is full, also for a phase that reports no steps."""
        if self.on_progress is not None and self.chunks > 1:
            self.phase, self.index = phase, index
            self._report(1.0)

    def _report(self, share: float) -> None:
        assert self.on_progress is not None
        slot = self.phase * self.chunks + self.index
        self.on_progress(round((slot + share) * self.STEPS / self.phases), self.chunks * self.STEPS)


__all__ = [
    "CROSSFADE_MS", "DEFAULT_CHUNK_CHARS", "MIN_CHUNK_CHARS", "NO_CHUNKING", "ChunkProgress", "TextChunking",
    "chunk_seed", "chunk_text", "crossfade_samples", "join_chunks", "sentence_spans", "split_sentences",
]
