"""The factorized vector quantizer's search (DAC's, improved RVQGAN), issue 32: Fish Speech's
codec codebooks and IndexTTS-2's semantic codec (RepCodec) look their codes up the same way.
Their modules stay in the engines: the published files name the 1x1 projections differently
(``in_proj`` / ``in_project``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def nearest_codes(z_e: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """For each frame of `z_e` ``(B, D, T)``, the row of `codebook` ``(N, D)`` nearest to it with
    both L2-normalised: the argmax of ``-(|e|^2 - 2 e.c + |c|^2)``, computed as upstream does.
    Returns ``(B, T)``."""
    enc = F.normalize(z_e.transpose(1, 2).reshape(-1, z_e.shape[1]))
    book = F.normalize(codebook)
    dist = enc.pow(2).sum(1, keepdim=True) - 2 * enc @ book.t() + book.pow(2).sum(1, keepdim=True).t()
    return (-dist).max(1)[1].view(z_e.shape[0], -1)
