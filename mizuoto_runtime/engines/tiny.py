"""What the writers of tiny random checkpoints share (tests and demos; no download): the check of
the version asked for, seeded weights of a plausible scale, a decoder's output brought to a given
loudness, JSON files. Each engine package's ``tiny.write(directory, *, version, seed, dtype)``
is its writer (`base.TinyWriter`)."""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..memory.intra_op import intra_op_threads


def version_of(version: str | None, versions: Sequence[str]) -> str:
    """The checkpoint version to write: `version`, one of the engine's `versions`, or the first
    when None."""
    if version is None:
        return versions[0]
    if version not in versions:
        raise ValueError(f"version must be one of {', '.join(versions)}, got {version!r}")
    return version


def one_version(version: str | None) -> None:
    """An engine with one checkpoint layout has no versions to choose from."""
    if version is not None:
        raise ValueError(f"this engine has one checkpoint layout, no versions: got version {version!r}")


def fan_in_std(p: torch.Tensor) -> float:
    """The standard deviation that keeps a random layer's outputs near unit scale."""
    fan_in = p[0].numel() if p.dim() >= 2 else p.shape[0]
    return 1.0 / max(fan_in, 1) ** 0.5


@torch.no_grad()
def randomize(model: nn.Module, gen: torch.Generator) -> None:
    """Seeded weights of a plausible scale for a transformers model: norms near 1, small biases,
    Snake alphas near 1, unit embeddings, fan-in scaled layers, and random codebooks (a fresh
    one is zeros) with positive cluster sizes (the Higgs audio tokenizer's)."""
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or name.endswith("layer_norm.weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif name.endswith(".bias"):
            p.copy_(0.02 * torch.randn(p.shape, generator=gen))
        elif name.endswith(".alpha"):  # Snake
            p.copy_(1.0 + 0.1 * torch.rand(p.shape, generator=gen))
        elif "embed" in name and p.dim() == 2:
            p.copy_(torch.randn(p.shape, generator=gen))
        else:
            p.copy_(fan_in_std(p) * torch.randn(p.shape, generator=gen))
    for name, b in model.named_buffers():
        if name.endswith(("codebook.embed", "codebook.embed_avg")):
            b.copy_(torch.randn(b.shape, generator=gen))
        elif name.endswith("cluster_size"):
            b.copy_(1.0 + torch.rand(b.shape, generator=gen))


@torch.no_grad()
def scale_output(last: nn.Module, run: Callable[[], object], params: tuple[torch.Tensor, ...],
                 target_std: float = 0.1) -> None:
    """Scale `params` (the last layer's weight and bias) so that `run()` makes `last` output
    `target_std`: a decoder ending in a clamp or tanh then gives a waveform, not a square wave."""
    seen: dict[str, torch.Tensor] = {}
    hook = last.register_forward_hook(lambda _m, _i, out: seen.__setitem__("out", out))
    try:
        with intra_op_threads(1):  # a forward's sums round with the count: the bytes follow the seed alone
            run()
    finally:
        hook.remove()
    scale = target_std / float(seen["out"].std())
    for p in params:
        p.mul_(scale)


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-level BPE alphabet (what Qwen2's tokenizer uses): byte -> character."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in codes)))


def word_merges(words: tuple[str, ...], vocab: dict[str, int]) -> list[str]:
    """BPE merges that make each of `words` one token, left to right; every prefix they make is
    added to `vocab` (whose alphabet must hold the words' characters)."""
    merges: list[str] = []
    for word in words:
        current = word[0]
        for ch in word[1:]:
            merges.append(f"{current} {ch}")
            current += ch
            vocab.setdefault(current, len(vocab))
    return merges


def byte_level_tokenizer(special_tokens: Sequence[str], vocab_size: int, **roles: str) -> Any:
    """A transformers fast tokenizer: byte-level BPE with no merges (one token per byte),
    `special_tokens` added after the 256 bytes, `roles` its eos/pad/bos tokens; it must fit an
    embedding of `vocab_size` rows."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, **roles)
    fast.add_special_tokens({"additional_special_tokens": list(special_tokens)})
    if len(fast) > vocab_size:
        raise ValueError("tiny tokenizer does not fit the LLM's embedding")
    return fast


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def save_shards(state: dict[str, torch.Tensor], folder: Path, shards: int = 2) -> list[str]:
    """`state` as transformers shards it: ``model-0000i-of-0000n.safetensors`` and
    ``model.safetensors.index.json`` (keys in sorted order, split evenly); the files' names."""
    from safetensors.torch import save_file

    names = sorted(state)
    step = -(-len(names) // shards)
    weight_map: dict[str, str] = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i * step:(i + 1) * step]
        save_file({k: state[k].detach().contiguous() for k in part}, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    total = sum(t.numel() * t.element_size() for t in state.values())
    write_json(folder / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    return sorted(set(weight_map.values()))


@torch.no_grad()
def randomize_normed(model: nn.Module, gen: torch.Generator) -> None:
    """Seeded weights of a plausible scale for a transformers model: norms near 1, small biases,
    unit-scale embeddings and codebooks, Snake alphas near 1, everything else at fan-in scale.
    Weight-normed layers get their direction and magnitude drawn alike (Dia's DAC, CSM's Mimi;
    `randomize` is the Higgs tokenizer's, whose cluster sizes it also sets)."""
    for name, p in model.named_parameters():
        owner, _, leaf = name.rpartition(".")
        if "norm" in owner.rpartition(".")[2] and leaf == "weight" and p.dim() == 1:
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif leaf == "bias":
            p.copy_(0.02 * torch.randn(p.shape, generator=gen))
        elif leaf == "alpha":  # Snake
            p.copy_(1.0 + 0.1 * torch.rand(p.shape, generator=gen))
        elif ("embed" in name or "codebook" in name) and p.dim() == 2:
            p.copy_(torch.randn(p.shape, generator=gen))
        else:
            p.copy_(fan_in_std(p) * torch.randn(p.shape, generator=gen))
