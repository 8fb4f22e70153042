"""The components the engine's phases place, each a view over the loaded modules (shared, not
copied): which weights a phase needs decides what it places (M1, M4)."""
from __future__ import annotations

import copy

import torch
from torch import nn

from .s2mel import S2Mel
from .semantic_codec import SemanticCodec
from .unified_voice import UnifiedVoice


class Conditioning(nn.Module):
    """UnifiedVoice's speaker and emotion encoders (the voice prompt's part of the GPT)."""

    def __init__(self, gpt: UnifiedVoice) -> None:
        super().__init__()
        for name in ("conditioning_encoder", "perceiver_encoder", "emo_conditioning_encoder",
                     "emo_perceiver_encoder", "emovec_layer", "emo_layer"):
            setattr(self, name, getattr(gpt, name))


class Talker(nn.Module):
    """What decoding and the latent forward run: GPT-2's blocks (the units, M11), embeddings,
    the final norm and the mel head. The text head is never used and stays out."""

    def __init__(self, gpt: UnifiedVoice) -> None:
        super().__init__()
        for name in ("gpt", "text_embedding", "text_pos_embedding", "mel_embedding", "mel_pos_embedding",
                     "speed_emb", "final_norm", "mel_head"):
            setattr(self, name, getattr(gpt, name))

    def memory_units(self) -> list[nn.Module]:
        return list(self.gpt.h)


class CodecEncoder(nn.Module):
    """The semantic codec's encoder and quantizer (the voice prompt); its unused decoder stays out."""

    def __init__(self, codec: SemanticCodec) -> None:
        super().__init__()
        self.encoder = codec.encoder
        self.quantizer = codec.quantizer


class Flow(nn.Module):
    """s2mel (CFM with its DiT + WaveNet estimator, length regulator, GPT projection) and a copy of
    the codec's code embedding (codebook + out projection, a few hundred KB), so that turning codes
    into content never places the codec itself."""

    def __init__(self, s2mel: S2Mel, codec: SemanticCodec) -> None:
        super().__init__()
        self.s2mel = s2mel
        vq = codec.quantizer.quantizers[0]
        self.codebook = copy.deepcopy(vq.codebook)
        self.out_project = copy.deepcopy(vq.out_project)

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (1, n) -> (1, n, hidden), as the codec's vq2emb then transposed."""
        return self.out_project(self.codebook(codes).transpose(1, 2)).transpose(1, 2)

    def memory_units(self) -> list[nn.Module]:
        return list(self.s2mel.cfm.estimator.transformer.layers)
