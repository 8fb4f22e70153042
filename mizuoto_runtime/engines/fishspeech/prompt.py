"""The dual-AR prompt: a chat of system, user and assistant messages, as frames.

A frame row 0 is a token id; rows ``1..num_codebooks`` are codes, non-zero only where the
reference's codes sit (their row-0 id is ``semantic_begin_id + semantic code``). Each text
piece is tokenized on its own (never joined to its neighbour before tokenizing), as upstream
encodes each part of its conversation.

The system message says what to do and, with a voice, holds the reference transcript (tagged
``<|speaker:0|>`` unless it carries a speaker tag) and the reference codes. Text with speaker
tags is split at them into turns, grouped into batches of at most 5 speakers and `chunk_bytes`
UTF-8 bytes; each batch is one user message answered by the assistant in voice, and the codes
each batch produced go back into the chat before the next, as upstream's `generate_long` does.

S1-mini's release code (up to d3df505) prompts with no chat: ``<|interleave|>``, then per
reference ``<|speaker:0|>``, its transcript, its codes and ``<|im_end|>``, then ``<|speaker:0|>``
and the whole text, which the model continues (`s1_prompt`).
"""
from __future__ import annotations

import re

import torch
from torch import Tensor

from .tokenizer import IM_END, IM_START, INTERLEAVE, SPEAKER_TAG, VOICE, TextTokenizer

SYSTEM_WITH_VOICE = "convert the provided text to speech reference to the following:\n\nText:\n"
SYSTEM_PLAIN = "convert the provided text to speech"
SPEECH_HEADER = "\n\nSpeech:\n"
MAX_SPEAKERS = 5
CHUNK_BYTES = 300  # upstream's command-line default

Part = str | Tensor  # text, or codes [num_codebooks, n]


def split_turns(text: str) -> list[str]:
    """Turns starting at each ``<|speaker:N|>`` tag (text before the first tag is dropped)."""
    pieces = re.split(r"(<\|speaker:\d+\|>)", text)
    turns, i = [], 0
    while i < len(pieces):
        piece = pieces[i].strip()
        if SPEAKER_TAG.fullmatch(piece):
            if i + 1 < len(pieces):
                turns.append((piece + pieces[i + 1]).strip())
                i += 2
                continue
            turns.append(piece)
        i += 1
    return turns


def batches(text: str, chunk_bytes: int = CHUNK_BYTES) -> list[str]:
    """The user messages `text` becomes (the whole text when it has no speaker tag)."""
    turns = split_turns(text)
    if not turns:
        return [text]
    out: list[str] = []
    current: list[str] = []
    size = 0
    for turn in turns:
        n = len(turn.encode("utf-8"))
        if len(current) >= MAX_SPEAKERS or (current and size + n > chunk_bytes):
            out.append("\n".join(current))
            current, size = [turn], n
        else:
            current.append(turn)
            size += n
    if current:
        out.append("\n".join(current))
    return out


def system_message(reference_text: str | None, reference_codes: Tensor | None) -> list[Part]:
    if reference_text and reference_codes is not None:
        tagged = reference_text if SPEAKER_TAG.search(reference_text) else f"<|speaker:0|>{reference_text}"
        body: list[Part] = [SYSTEM_WITH_VOICE, tagged, SPEECH_HEADER, reference_codes]
    else:
        body = [SYSTEM_PLAIN]
    return [f"{IM_START}system\n", *body, f"{IM_END}\n"]


def user_message(text: str) -> list[Part]:
    return [f"{IM_START}user\n", text, f"{IM_END}\n"]


def assistant_answer(codes: Tensor) -> list[Part]:
    return [f"{IM_START}assistant\n{VOICE}", codes, f"{IM_END}\n"]


def assistant_turn() -> list[Part]:
    """The open assistant message the model continues."""
    return [f"{IM_START}assistant\n{VOICE}"]


def s1_prompt(reference_text: str | None, reference_codes: Tensor | None, text: str) -> list[Part]:
    parts: list[Part] = [INTERLEAVE]
    if reference_text and reference_codes is not None:
        parts += ["<|speaker:0|>", reference_text, reference_codes, IM_END]
    return [*parts, "<|speaker:0|>", text]


def encode(parts: list[Part], tokenizer: TextTokenizer, num_codebooks: int) -> Tensor:
    """Frames ``[1 + num_codebooks, T]`` (int64) for `parts`."""
    columns: list[Tensor] = []
    for part in parts:
        if isinstance(part, str):
            ids = torch.tensor(tokenizer.encode(part), dtype=torch.long)
            block = torch.zeros((num_codebooks + 1, ids.numel()), dtype=torch.long)
            block[0] = ids
        else:
            if part.dim() != 2 or part.shape[0] != num_codebooks:
                raise ValueError(f"reference codes must be [{num_codebooks}, frames], got {tuple(part.shape)}")
            codes = part.to(torch.long).cpu()
            block = torch.cat([codes[:1] + tokenizer.semantic_begin_id, codes])
        columns.append(block)
    return torch.cat(columns, dim=1)
