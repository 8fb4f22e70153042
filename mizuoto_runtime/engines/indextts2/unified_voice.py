"""UnifiedVoice v2: the text-to-semantic-code GPT of IndexTTS-2 with its conditioning.

Read from upstream's model as a specification. Sequence layout fed to GPT-2:
[32 speaker latents + emotion vector][speed(1)][speed(0)] [start_text, text, stop_text]
[start_mel, codes...]. Quirks kept on purpose (they change numbers):
- the prompt drops every text id equal to start_text or stop_text before adding both;
- during cached decoding the mel position of a new code is (attention length - prefix length),
  so the first generated code sits at position 2, not 1 (the uncached forward uses 0, 1, 2...);
- the latent forward strips the last two positions of the mel part.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...nn.conformer import ConformerEncoder
from .config import GPTConfig
from .gpt2 import GPT2Stack, LayerCache
from .perceiver import PerceiverResampler

COND_LATENTS = 32
W2V_DIM = 1024  # w2v-BERT 2.0's width; a test checkpoint may use another (read from the stats file)
EMO_DIM = 1024  # the emotion perceiver's width (fixed upstream, whatever the features' width)


class LearnedPositions(nn.Module):
    def __init__(self, rows: int, dim: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(rows, dim)

    def first(self, n: int) -> torch.Tensor:
        return self.emb(torch.arange(n, device=self.emb.weight.device))

    def at(self, index: int) -> torch.Tensor:
        return self.emb.weight[index][None, None, :]


def _encoder(cfg: dict[str, Any], features: int) -> ConformerEncoder:
    return ConformerEncoder(features, cfg["output_size"], cfg["linear_units"], cfg["attention_heads"],
                            cfg["num_blocks"], cfg["input_layer"])


class UnifiedVoice(nn.Module):
    def __init__(self, cfg: GPTConfig, features: int = W2V_DIM) -> None:
        super().__init__()
        self.cfg = cfg
        d, cm, em = cfg.model_dim, cfg.condition_module, cfg.emo_condition_module
        self.conditioning_encoder = _encoder(cm, features)
        self.perceiver_encoder = PerceiverResampler(d, cm["output_size"], COND_LATENTS,
                                                    cm["attention_heads"], cm["perceiver_mult"])
        self.speed_emb = nn.Embedding(2, d)
        self.emo_conditioning_encoder = _encoder(em, features)
        self.emo_perceiver_encoder = PerceiverResampler(EMO_DIM, em["output_size"], 1,
                                                        em["attention_heads"], em["perceiver_mult"])
        self.text_embedding = nn.Embedding(cfg.number_text_tokens + 1, d)
        self.emo_layer = nn.Linear(d, d)
        self.emovec_layer = nn.Linear(EMO_DIM, d)
        self.mel_embedding = nn.Embedding(cfg.number_mel_codes, d)
        self.gpt = GPT2Stack(d, cfg.heads, cfg.layers)
        self.mel_pos_embedding = LearnedPositions(cfg.max_mel_tokens + 3, d)
        self.text_pos_embedding = LearnedPositions(cfg.max_text_tokens + 2, d)
        self.final_norm = nn.LayerNorm(d)
        self.text_head = nn.Linear(d, cfg.number_text_tokens + 1)
        self.mel_head = nn.Linear(d, cfg.number_mel_codes)

    # --- conditioning (the voice prompt phase) ---
    def speaker_conformer(self, spk: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conditioning_encoder(spk, lengths)

    def speaker_latent(self, spk: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """spk (B, T, features) normalised w2v-BERT features -> (B, 32, d)."""
        x, mask = self.conditioning_encoder(spk, lengths)
        return self.perceiver_encoder(x, F.pad(mask.squeeze(1), (COND_LATENTS, 0), value=True))

    def emotion_perceiver(self, emo: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x, mask = self.emo_conditioning_encoder(emo, lengths)
        return self.emo_perceiver_encoder(x, F.pad(mask.squeeze(1), (1, 0), value=True)).squeeze(1)

    def emotion_vector(self, emo: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, T, features) -> (B, d)."""
        return self.emo_layer(self.emovec_layer(self.emotion_perceiver(emo, lengths)))

    def merge_emotion(self, spk: torch.Tensor, emo: torch.Tensor, spk_lengths: torch.Tensor,
                      emo_lengths: torch.Tensor, alpha: float) -> torch.Tensor:
        emo_vec = self.emotion_vector(emo, emo_lengths)
        base = self.emotion_vector(spk, spk_lengths)
        return base + alpha * (emo_vec - base)

    def conds_latent(self, spk_latent: torch.Tensor, emo_vec: torch.Tensor) -> torch.Tensor:
        b = spk_latent.shape[0]
        speed = self.speed_emb(torch.tensor([1, 0], device=spk_latent.device)).unsqueeze(0).expand(b, -1, -1)
        return torch.cat((spk_latent + emo_vec.unsqueeze(1), speed), dim=1)

    # --- decoding inputs ---
    def text_part(self, text: torch.Tensor) -> torch.Tensor:
        """One text (L,) -> embeddings of [start, text without start/stop ids, stop] (L', d)."""
        cfg = self.cfg
        kept = text[(text != cfg.stop_text_token) & (text != cfg.start_text_token)].long()
        ids = F.pad(F.pad(kept, (1, 0), value=cfg.start_text_token), (0, 1), value=cfg.stop_text_token)
        if ids.shape[0] > self.text_pos_embedding.emb.num_embeddings:
            raise ValueError(f"text of {ids.shape[0] - 2} tokens is longer than the model's "
                             f"{cfg.max_text_tokens}: split it into shorter segments")
        return self.text_embedding(ids) + self.text_pos_embedding.first(ids.shape[0])

    def prefix(self, conds: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """conds (1, C, d), text (1, L) -> prefix embeddings (1, C + L' , d), without start_mel."""
        if text.shape[0] != 1 or conds.shape[0] != 1:
            raise ValueError(f"one text per call: got text {tuple(text.shape)}, conditioning {tuple(conds.shape)}")
        return torch.cat([conds[0], self.text_part(text[0])], dim=0).unsqueeze(0)

    def mel_input(self, codes: torch.Tensor, position: int) -> torch.Tensor:
        """codes (R, 1) at one mel position -> (R, 1, d)."""
        return self.mel_embedding(codes) + self.mel_pos_embedding.at(position)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.mel_head(self.final_norm(hidden))

    def decode(self, embeds: torch.Tensor, cache: list[LayerCache] | None
               ) -> tuple[torch.Tensor, list[LayerCache]]:
        """GPT-2 over new embeddings (R, t, d) with the cache -> last position's logits (R, V)."""
        hidden, cache = self.gpt(embeds, cache)
        return self.logits(hidden[:, -1]), cache

    def teacher_forced_logits(self, prefix: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """The inference model without cache on [prefix, start_mel, codes] -> (1, n+1, V)."""
        mel = torch.cat([torch.full_like(codes[:, :1], self.cfg.start_mel_token), codes], dim=1)
        mel_emb = self.mel_embedding(mel) + self.mel_pos_embedding.first(mel.shape[1])
        hidden, _ = self.gpt(torch.cat([prefix, mel_emb], dim=1))
        return self.logits(hidden[:, prefix.shape[1]:])

    # --- the latent for s2mel ---
    def latent(self, spk_latent: torch.Tensor, text: torch.Tensor, codes: torch.Tensor,
               emo_vec: torch.Tensor) -> torch.Tensor:
        """The full forward over known codes -> final_norm output at the mel positions (B, n, d).

        Unlike the prompt, the text keeps any start/stop ids it holds (only wrapped by them)."""
        cfg = self.cfg
        conds = self.conds_latent(spk_latent, emo_vec)
        text = F.pad(F.pad(text.long(), (0, 1), value=cfg.stop_text_token), (1, 0), value=cfg.start_text_token)
        text_emb = self.text_embedding(text) + self.text_pos_embedding.first(text.shape[1])
        mel = F.pad(F.pad(codes.long(), (0, 1), value=cfg.stop_mel_token), (1, 0), value=cfg.start_mel_token)
        mel_emb = self.mel_embedding(mel) + self.mel_pos_embedding.first(mel.shape[1])
        hidden, _ = self.gpt(torch.cat([conds, text_emb, mel_emb], dim=1))
        enc = self.final_norm(hidden[:, conds.shape[1]:])
        return enc[:, -mel.shape[1]:][:, :-2]


class PromptedDecoder:
    """The `StepModel` decoding reads: UnifiedVoice's GPT over one prompt, rows = beams."""

    def __init__(self, model: UnifiedVoice, prefix: torch.Tensor) -> None:
        self.model, self.prefix = model, prefix
        self.cache: list[LayerCache] | None = None
        self.length = 0

    def prompt_ids(self) -> torch.Tensor:
        """Upstream's placeholder ids: ones for the prefix, then start_mel (the repetition
        penalty reads them)."""
        ids = torch.ones(1, self.prefix.shape[1] + 1, dtype=torch.long)
        ids[0, -1] = self.model.cfg.start_mel_token
        return ids

    def start(self, rows: int) -> torch.Tensor:
        start = torch.full((1, 1), self.model.cfg.start_mel_token, device=self.prefix.device)
        embeds = torch.cat([self.prefix, self.model.mel_input(start, 0)], dim=1).expand(rows, -1, -1)
        self.length = embeds.shape[1]
        logits, self.cache = self.model.decode(embeds, None)
        return logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.length += 1
        embeds = self.model.mel_input(tokens[:, None].to(self.prefix.device), self.length - self.prefix.shape[1])
        logits, self.cache = self.model.decode(embeds, self.cache)
        return logits

    def reorder(self, rows: torch.Tensor) -> None:
        if self.cache is not None:
            index = rows.to(self.prefix.device)
            self.cache = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.cache]
