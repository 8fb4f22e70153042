"""Fold weight normalisation into plain weights: ``w = g * v / ||v||`` (norm over every dim but
`dim`), for both key forms a checkpoint may carry:

- ``<m>.parametrizations.weight.original0`` (g) / ``.original1`` (v):
  ``torch.nn.utils.parametrizations.weight_norm``;
- ``<m>.weight_g`` / ``<m>.weight_v``: the legacy ``torch.nn.utils.weight_norm``.

The fold uses ``torch._weight_norm``, the kernel both torch forms call, so the folded weight is
bit-equal to the one the parametrized module computes at every forward. (For a ConvTranspose
stored as ``[in, out, k]``, dim 0 is the input channel, as in upstream's g of shape [in,1,1].)
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

PARAMETRIZED = (".parametrizations.weight.original0", ".parametrizations.weight.original1")
LEGACY = (".weight_g", ".weight_v")


def fold(g: torch.Tensor, v: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """The weight of a weight-normed module from its magnitude `g` and direction `v`."""
    return torch._weight_norm(v, g, dim)


def unfold(key: str, weight: torch.Tensor, *, legacy: bool = False) -> dict[str, torch.Tensor]:
    """``<m>.weight`` as weight norm stores it (g = per-row norm over every dim but 0, v = the
    weight), in the parametrization's or the legacy key form: what tiny checkpoints write where
    the published files carry weight norm, so that the loaders' `fold_state_dict` is exercised."""
    base = key[: -len(".weight")]
    g_suffix, v_suffix = LEGACY if legacy else PARAMETRIZED
    return {base + g_suffix: torch.norm_except_dim(weight, 2, 0), base + v_suffix: weight}


def fold_state_dict(state: Mapping[str, torch.Tensor], dim: int = 0) -> dict[str, torch.Tensor]:
    """A copy of `state` with every weight-norm pair replaced by ``<m>.weight``.

    A g without its v (or the reverse) is one clear error naming the key."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        dotted = "." + key  # a top-level module's keys have no leading dot
        for g_suffix, v_suffix in (PARAMETRIZED, LEGACY):
            is_g = dotted.endswith(g_suffix)
            if is_g or dotted.endswith(v_suffix):
                base = dotted[: -len(g_suffix if is_g else v_suffix)]
                other = (base + (v_suffix if is_g else g_suffix))[1:]
                if other not in state:
                    raise KeyError(f"weight norm: {key!r} has no partner {other!r} in the checkpoint")
                if is_g:
                    out[(base + ".weight")[1:]] = fold(value, state[other], dim)
                break
        else:
            out[key] = value
    return out
