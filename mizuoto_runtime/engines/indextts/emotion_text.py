"""Emotion from text: the checkpoint's Qwen3 0.6B emotion model (`qwen0.6bemo4-merge/`, a
transformers causal LM) reads a sentence and answers its emotions as JSON; this turns that into
IndexTTS-2's eight weights, as upstream's QwenEmotion does: the chat prompt "文本情感分类" with
thinking off, the answer after the last </think>, JSON or else "name": value pairs, the
melancholic-word swap of sad and melancholic, labels in English or Chinese, scores clamped to
0..1.2, and calm = 1 when nothing is detected.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import MizuotoError

PROMPT = "文本情感分类"
ORDER = ("高兴", "愤怒", "悲伤", "恐惧", "反感", "低落", "惊讶", "自然")  # = emotion.EMOTIONS, in Chinese
ENGLISH = dict(zip(ORDER, ("happy", "angry", "sad", "afraid", "disgusted", "melancholic", "surprised", "calm")))
MELANCHOLIC_WORDS = ("低落", "melancholy", "melancholic", "depression", "depressed", "gloomy")
ALIASES = ("emotion", "emotion_label", "label", "情感", "情绪")
MAX_SCORE = 1.2
END_THINK = "</think>"
DTYPE = torch.float16  # upstream loads it so on every device (its answers depend on it)
MAX_NEW_TOKENS = 256  # upstream allows 32768; eight scores in JSON take well under 100 tokens


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

    def __init__(self, folder: Path) -> None:
        super().__init__()
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
        """Generate (the folder's generation config, as upstream) and decode after the last </think>."""
        out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW_TOKENS,
                                  pad_token_id=self.tokenizer.eos_token_id)
        new = out[0, ids.shape[1]:].tolist()
        end = self.tokenizer.convert_tokens_to_ids(END_THINK)
        start = len(new) - new[::-1].index(end) if isinstance(end, int) and end in new else 0
        return self.tokenizer.decode(new[start:], skip_special_tokens=True)

    def kv_bytes(self, positions: int) -> int:
        cfg = self.model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return 2 * cfg.num_hidden_layers * positions * cfg.num_key_value_heads * head_dim * DTYPE.itemsize
