"""MaskGCT's semantic codec (RepCodec) as IndexTTS-2 uses it: w2v-BERT features -> codes and
their quantized embedding, and codes -> embeddings (`vq2emb`).

Read from upstream's RepCodec as a specification: a Vocos ConvNeXt encoder + Linear, then one
factorized VQ (weight-normed 1x1 projection to the small codebook dimension, nearest
L2-normalised codebook entry, the RAW entry projected back). The decoder half is stored but not
used by inference; it is built so the file loads strictly.
"""
from __future__ import annotations

import torch
from torch import nn

from ...nn.convnext import ConvNeXtBlock
from ...nn.vq import nearest_codes
from .config import CodecConfig


class VocosBackbone(nn.Module):
    """(B, C_in, T) -> (B, T, dim)."""

    def __init__(self, cin: int, dim: int, inner: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Conv1d(cin, dim, kernel_size=7, padding=3)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.convnext = nn.ModuleList(ConvNeXtBlock(dim, inner) for _ in range(layers))
        self.final_layer_norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.embed(x).transpose(1, 2)).transpose(1, 2)
        for block in self.convnext:
            x = block(x)
        return self.final_layer_norm(x.transpose(1, 2))


class FactorizedVQ(nn.Module):
    def __init__(self, dim: int, codebook_size: int, codebook_dim: int) -> None:
        super().__init__()
        self.in_project = nn.Conv1d(dim, codebook_dim, 1)
        self.out_project = nn.Conv1d(codebook_dim, dim, 1)
        self.codebook = nn.Embedding(codebook_size, codebook_dim)

    def encode(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """z (B, D, T) -> indices (B, T) and the quantized (B, D, T)."""
        z_e = self.in_project(z)
        indices = nearest_codes(z_e, self.codebook.weight)
        z_q = self.codebook(indices).transpose(1, 2)
        return indices, self.out_project(z_e + (z_q - z_e))

    def embed(self, indices: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, D, T)."""
        return self.out_project(self.codebook(indices).transpose(1, 2))


class SemanticCodec(nn.Module):
    def __init__(self, c: CodecConfig) -> None:
        super().__init__()
        self.encoder = nn.Sequential(VocosBackbone(c.hidden_size, c.vocos_dim, c.vocos_intermediate_dim,
                                                   c.vocos_num_layers), nn.Linear(c.vocos_dim, c.hidden_size))
        self.decoder = nn.Sequential(VocosBackbone(c.hidden_size, c.vocos_dim, c.vocos_intermediate_dim,
                                                   c.vocos_num_layers), nn.Linear(c.vocos_dim, c.hidden_size))
        self.quantizer = nn.Module()
        self.quantizer.quantizers = nn.ModuleList([FactorizedVQ(c.hidden_size, c.codebook_size, c.codebook_dim)])

    def quantize(self, feat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """feat (B, T, hidden) -> codes (B, T) and quantized (B, T, hidden)."""
        codes, quantized = self.quantizer.quantizers[0].encode(self.encoder(feat.transpose(1, 2)).transpose(1, 2))
        return codes, quantized.transpose(1, 2)

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (B, T) -> (B, hidden, T) (upstream's vq2emb)."""
        return self.quantizer.quantizers[0].embed(codes)
