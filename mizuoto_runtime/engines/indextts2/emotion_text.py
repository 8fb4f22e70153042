"""Emotion from text: the checkpoint's Qwen3 0.6B emotion model (`qwen0.6bemo4-merge/`, a
transformers causal LM) reads a sentence and answers its emotions as JSON; this turns that into
IndexTTS-2's eight weights, as upstream's QwenEmotion does: the chat prompt "文本情感分类" with
thinking off, the answer after the last </think>, JSON or else "name": value pairs, the
melancholic-word swap of sad and melancholic, labels in English or Chinese, scores clamped to
0..1.2, and calm = 1 when nothing is detected.

One choice differs from upstream: the answer is cut at `MAX_ANSWER_TOKENS` (256) new tokens,
where upstream lets it run to 32768. With thinking off the model answers a dict of eight scores
(under 100 tokens), and the phase's KV cache is estimated at the cap (M46): at 32768 that
estimate would be about 3.6 GiB for Qwen3 0.6B in float16 (28 layers, and one more during a
step, x keys and values x 8 KV heads x 128 x 2 bytes a position) and would push the other
models off the device for an answer of a few dozen tokens; an answer that runs past 256 has
gone astray (upstream would spend minutes on it). When the cap is hit a warning says so: the
weights are read from the first 256 tokens, and the decoding continues a random stream that is
not upstream's. The tiny test model's random answers run to the cap.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import MizuotoError
from ...nn.kv_cache import peak_bytes

log = logging.getLogger(__name__)

PROMPT = "文本情感分类"
ORDER = ("高兴", "愤怒", "悲伤", "恐惧", "反感", "低落", "惊讶", "自然")  # = emotion.EMOTIONS, in Chinese
ENGLISH = dict(zip(ORDER, ("happy", "angry", "sad", "afraid", "disgusted", "melancholic", "surprised", "calm")))
MELANCHOLIC_WORDS = ("低落", "melancholy", "melancholic", "depression", "depressed", "gloomy")
ALIASES = ("emotion", "emotion_label", "label", "情感", "情绪")
MAX_SCORE = 1.2
END_THINK = "</think>"
DTYPE = torch.float16  # upstream loads it so on every device (its answers depend on it)
MAX_ANSWER_TOKENS = 256  # upstream: 32768; see the module docstring
UPSTREAM_ANSWER_TOKENS = 32768


def _label(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    value = value.strip()
    if value in ENGLISH:
        return value
    return next((cn for cn, en in ENGLISH.items() if value.lower() == en), None)


def _score(value: Any) -> float:
    try:
        return max(0.0, min(MAX_SCORE, float(value)))
    except (TypeError, ValueError):
        raise MizuotoError(f"indextts2: the emotion model answered a non-numeric score {value!r}; try again") from None


def parse(answer: str, text: str) -> tuple[float, ...]:
    """The model's answer (after thinking) for `text` -> eight weights in the model's order."""
    try:
        content: Any = json.loads(answer)
    except json.JSONDecodeError:
        content = {m.group(1): float(m.group(2)) for m in re.finditer(r'([^\s":.,]+?)"?\s*:\s*([\d.]+)', answer)}
    if not isinstance(content, dict):
        label = _label(content)
        content = {label: 1.0} if label else {}
    if any(word in text.lower() for word in MELANCHOLIC_WORDS):
        content["悲伤"], content["低落"] = content.get("低落", 0.0), content.get("悲伤", 0.0)
    normalized = dict(content)
    detected = next((d for d in (_label(normalized.get(a)) for a in ALIASES) if d), None)
    if detected and not any(k in normalized for k in ORDER):
        normalized[detected] = 1.0
    for key in ORDER:
        named = _label(normalized.get(key))
        if named is not None:
            normalized[key] = 1.0 if named == key else 0.0
            if named != key:
                normalized[named] = 1.0
    weights = tuple(_score(normalized.get(key, 0.0)) for key in ORDER)
    return weights if any(w > 0 for w in weights) else (0.0,) * 7 + (1.0,)


class EmotionModel(nn.Module):
    """The emotion LM as one component (its decoder layers are the units)."""

    def __init__(self, folder: Path, max_answer_tokens: int = MAX_ANSWER_TOKENS) -> None:
        super().__init__()
        self.max_answer_tokens = max_answer_tokens
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            self.model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True,
                                                              dtype=DTYPE).eval()
        except (OSError, ValueError) as exc:
            raise MizuotoError(f"{folder}: cannot be loaded as the emotion model ({exc})") from exc

    def memory_units(self) -> list[nn.Module]:
        return list(self.model.model.layers)

    def prompt(self, text: str) -> torch.Tensor:
        messages = [{"role": "system", "content": PROMPT}, {"role": "user", "content": text}]
        chat = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                  enable_thinking=False)
        return self.tokenizer([chat], return_tensors="pt").input_ids

    def answer(self, ids: torch.Tensor) -> str:
        """Generate (the folder's generation config, as upstream) and decode after the last </think>;
        a warning when the answer reached `max_answer_tokens` without ending."""
        out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                  max_new_tokens=self.max_answer_tokens, pad_token_id=self.tokenizer.eos_token_id)
        new = out[0, ids.shape[1]:].tolist()
        if len(new) >= self.max_answer_tokens and new[-1] not in self.end_ids():
            log.warning("indextts2: the emotion model's answer was cut at %d tokens (the original IndexTTS-2 lets "
                        "it run to %d); the emotion is read from the part before the cut, so it and the speech "
                        "may differ from the original's", self.max_answer_tokens, UPSTREAM_ANSWER_TOKENS)
        end = self.tokenizer.convert_tokens_to_ids(END_THINK)
        start = len(new) - new[::-1].index(end) if isinstance(end, int) and end in new else 0
        return self.tokenizer.decode(new[start:], skip_special_tokens=True)

    def end_ids(self) -> set[int]:
        """The tokens that end an answer (the generation config's, as generate stops at them)."""
        end = self.model.generation_config.eos_token_id
        return set(end) if isinstance(end, (list, tuple)) else {end} if end is not None else set()

    def kv_bytes(self, positions: int) -> int:
        """M46: the peak of generate's growing cache (transformers' dynamic cache, every layer plus
        one layer's concatenation) at `positions`, in float16 with the model's KV heads."""
        cfg = self.model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return peak_bytes(2 * cfg.num_key_value_heads * head_dim * DTYPE.itemsize, cfg.num_hidden_layers, positions)
