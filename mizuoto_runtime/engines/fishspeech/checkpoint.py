"""Loading Fish Speech checkpoints as users download them (M27).

* S2-Pro: ``config.json``, ``model.safetensors.index.json`` + ``model-*.safetensors`` (keys
  ``text_model.model.*`` for the slow transformer, ``audio_decoder.*`` for the fast one, except
  ``audio_decoder.codebook_embeddings``, which the slow transformer reads), ``tokenizer.json``,
  ``codec.pth``.
* S1-mini: ``config.json``, ``model.pth`` (flat keys, maybe under ``state_dict`` and/or a
  ``model.`` prefix; split ``wq``/``wk``/``wv`` are fused as upstream's load hook does),
  ``tokenizer.tiktoken`` + ``special_tokens.json``, ``codec.pth``.
* ``codec.pth``: a state dict, maybe under ``state_dict`` and/or with a ``generator.`` prefix (then
  only those keys count), weight norm in either key form (folded here). The file has no
  config: the shapes are read off its tensors; the quantizer transformers' attention window is
  not in it, so it is upstream's configured 128 unless the caller gives another.

`.pth` files load with ``torch.load(weights_only=True, mmap=True)``. Models are built on
``meta`` in the run dtype and filled one tensor at a time, so a half-precision model never
holds a float32 copy of itself (weight norm is folded per tensor in the file's precision).
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from ...errors import CheckpointError
from ...nn.checkpoint import CheckpointError as NnCheckpointError
from ...nn.checkpoint import load_state_dict
from ...nn.loading import build_on_meta, load_safetensors, reading_weights
from ...nn.weight_norm import LEGACY, PARAMETRIZED, fold
from .codec import CodecConfig, CodecDecoder, CodecEncoder, TransformerConfig
from .config import DualARConfig, read_config
from .dual_ar import FastTransformer, SlowTransformer
from .tokenizer import IM_END, JsonTokenizer, TiktokenTokenizer, load_tokenizer

log = logging.getLogger(__name__)

CODEC_FILE = "codec.pth"
DEFAULT_CODEC_WINDOW = 128  # upstream's modded_dac_vq.yaml quantizer transformers
CODEC_SAMPLE_RATE = 44100
CODEC_HEAD_DIM = 64

LICENCES = {
    "s2-pro": "Fish Audio S2-Pro: code and weights under the Fish Audio Research License "
              "(research and non-commercial use; commercial use needs a licence from Fish Audio)",
    "s1-mini": "OpenAudio S1-mini: weights under CC-BY-NC-SA-4.0 (non-commercial, share-alike)",
}


@dataclasses.dataclass
class DualAR:
    """A loaded dual-AR model: the two transformers, the tokenizer and the stop token."""

    version: str  # "s2-pro" or "s1-mini"
    config: DualARConfig
    slow: SlowTransformer
    fast: FastTransformer
    tokenizer: JsonTokenizer | TiktokenTokenizer | None  # None: a shapes-only build
    im_end_id: int


def detect_version(folder: Path) -> str | None:
    """"s2-pro", "s1-mini", or None when `folder` is neither layout."""
    if not (folder / "config.json").is_file() or not (folder / CODEC_FILE).is_file():
        return None
    if (folder / "model.safetensors.index.json").is_file() and (folder / "tokenizer.json").is_file():
        return "s2-pro"
    if (folder / "model.pth").is_file() and (folder / "tokenizer.tiktoken").is_file():
        return "s1-mini"
    return None


def read_pth(path: Path) -> dict[str, Tensor]:
    """A ``.pth`` state dict (memory-mapped, weights only), unwrapped from ``state_dict``; the
    reader's errors become `CheckpointError`s naming the file."""
    try:
        return load_state_dict(path, wrappers=("state_dict",))
    except NnCheckpointError as exc:
        raise CheckpointError(str(exc)) from exc


def fill(model: nn.Module, state: Mapping[str, Tensor], where: Path, strict: bool = True) -> nn.Module:
    """Fill `model` (built on meta) from `state`: every tensor read once, its shape checked, converted
    to the model's dtype one at a time; missing, mismatched and (`strict`) unexpected keys in one
    error."""
    own = model.state_dict(keep_vars=True)
    problems = [f"missing {k} {tuple(t.shape)}" for k, t in own.items() if k not in state]
    if strict:
        problems += [f"unexpected {k}" for k in state if k not in own]
    for key, target in own.items():
        if key not in state:
            continue
        source = state[key]
        if tuple(source.shape) != tuple(target.shape):
            problems.append(f"shape of {key}: checkpoint {tuple(source.shape)}, model {tuple(target.shape)}")
            continue
        value = torch.empty(target.shape, dtype=target.dtype)
        value.copy_(source)
        module_name, _, attr = key.rpartition(".")
        module = model.get_submodule(module_name)
        if isinstance(target, nn.Parameter):
            module._parameters[attr] = nn.Parameter(value, requires_grad=False)
        else:
            module._buffers[attr] = value
    if problems:
        raise CheckpointError(f"{where} does not match {type(model).__name__}: " + "; ".join(problems))
    return model


def _s2_rename(fast: bool) -> Callable[[str], str]:
    """Key in the S2-Pro shards -> our name in the slow (or fast) transformer; other keys are
    renamed past every name the model has, so they are skipped."""
    def rename(key: str) -> str:
        if key.startswith("text_model.model."):
            return "\0other" + key if fast else key[len("text_model.model."):]
        if key.startswith("audio_decoder."):
            rest = key[len("audio_decoder."):]
            if rest.startswith("codebook_embeddings."):
                return "\0other" + key if fast else rest
            return "fast_" + rest if fast else "\0other" + key
        return "\0other" + key
    return rename


def _s2_shards(folder: Path) -> list[Path]:
    index_path = folder / "model.safetensors.index.json"
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        shards = sorted(set(index["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{index_path}: not a safetensors index with a weight_map ({exc})") from exc
    return [folder / s for s in shards]


def _s1_state(folder: Path) -> dict[str, Tensor]:
    path = folder / "model.pth"
    state = read_pth(path)
    if state and next(iter(state)).startswith("model."):
        state = {k.replace("model.", "", 1): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if "audio_" not in k}  # upstream drops them too
    for key in [k for k in state if k.endswith("attention.wq.weight")]:
        base = key[: -len("wq.weight")]
        state[base + "wqkv.weight"] = torch.cat([state.pop(base + "wq.weight"), state.pop(base + "wk.weight"),
                                                 state.pop(base + "wv.weight")])
    return state


def load_dual_ar(folder: Path, dtype: torch.dtype) -> DualAR:
    """The dual-AR model of an S2-Pro or S1-mini folder, in `dtype` (M27)."""
    version = detect_version(folder)
    if version is None:
        raise CheckpointError(f"{folder}: not a Fish Speech checkpoint folder (S2-Pro: config.json, "
                              "model.safetensors.index.json, model-*.safetensors, tokenizer.json, codec.pth; "
                              "S1-mini: config.json, model.pth, tokenizer.tiktoken, special_tokens.json, codec.pth)")
    # A shapes-only build (engines.published) reads configs alone: no tokenizer, so the semantic
    # range and the stop token it gives stay unset, and no weight.
    tokenizer = load_tokenizer(folder) if reading_weights() else None
    cfg = read_config(folder)
    if tokenizer is not None:
        cfg = cfg.with_semantic_range(tokenizer.semantic_begin_id, tokenizer.semantic_end_id)
    slow = build_on_meta(lambda: SlowTransformer(cfg), dtype)
    fast = build_on_meta(lambda: FastTransformer(cfg), dtype)
    if tokenizer is None:
        return DualAR(version, cfg, slow.eval(), fast.eval(), None, -1)
    if version == "s2-pro":
        shards = _s2_shards(folder)
        load_safetensors(slow, shards, strict=False, rename=_s2_rename(fast=False))
        load_safetensors(fast, shards, strict=False, rename=_s2_rename(fast=True))
    else:
        state = _s1_state(folder)
        fill(slow, {k: v for k, v in state.items() if not k.startswith("fast_")}, folder / "model.pth")
        fill(fast, {k: v for k, v in state.items() if k.startswith("fast_")}, folder / "model.pth")
    log.info("Fish Speech %s loaded from %s. Licence: %s", version, folder, LICENCES[version])
    return DualAR(version, cfg, slow.eval(), fast.eval(), tokenizer, tokenizer.token_id(IM_END))


# ---- codec --------------------------------------------------------------------------------------

class FoldedState(Mapping[str, Tensor]):
    """A state dict whose weight-norm pairs (either key form) read as their folded ``<m>.weight``,
    folded when read: loading fills one tensor at a time, so a half-precision codec never holds
    the float32 file's folded weights all at once (M27)."""

    def __init__(self, state: Mapping[str, Tensor]) -> None:
        self._state = state
        self._pairs: dict[str, tuple[str, str]] = {}  # folded name -> (g key, v key)
        self._plain: list[str] = []
        for key in state:
            for g_suffix, v_suffix in (PARAMETRIZED, LEGACY):
                if key.endswith(g_suffix) or key.endswith(v_suffix):
                    base = key[: -len(g_suffix if key.endswith(g_suffix) else v_suffix)]
                    g, v = base + g_suffix, base + v_suffix
                    if g not in state or v not in state:
                        raise CheckpointError(f"weight norm: {key!r} has no partner {v if key == g else g!r}")
                    self._pairs[base + ".weight"] = (g, v)
                    break
            else:
                self._plain.append(key)

    def __getitem__(self, key: str) -> Tensor:
        if key in self._pairs:
            g, v = self._pairs[key]
            return fold(self._state[g], self._state[v])
        if key in self._plain:
            return self._state[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter([*self._plain, *self._pairs])

    def __len__(self) -> int:
        return len(self._plain) + len(self._pairs)


def read_codec_state(path: Path) -> FoldedState:
    state = read_pth(path)
    if any("generator." in k for k in state):
        state = {k.replace("generator.", ""): v for k, v in state.items() if "generator." in k}
    # Rotary tables and causal masks some releases store: computed here at the length needed.
    return FoldedState({k: v for k, v in state.items() if not k.endswith((".freqs_cis", ".causal_mask"))})


def _count(state: Mapping[str, Tensor], pattern: str) -> int:
    n = 0
    while pattern.format(n) in state:
        n += 1
    return n


def _shape(state: Mapping[str, Tensor], key: str, path: Path) -> tuple[int, ...]:
    if key not in state:
        raise CheckpointError(f"{path}: no tensor {key} (not a Fish Speech codec)")
    return tuple(state[key].shape)


def _transformer(state: Mapping[str, Tensor], prefix: str, window: int, path: Path) -> TransformerConfig | None:
    n_layer = _count(state, prefix + "layers.{}.attention.wqkv.weight")
    if n_layer == 0:
        return None
    qkv = _shape(state, prefix + "layers.0.attention.wqkv.weight", path)
    return TransformerConfig(n_layer=n_layer, dim=qkv[1], n_head=qkv[0] // 3 // CODEC_HEAD_DIM,
                             intermediate_size=_shape(state, prefix + "layers.0.feed_forward.w1.weight", path)[0],
                             window=window)


def infer_codec_config(state: Mapping[str, Tensor], path: Path, window: int = DEFAULT_CODEC_WINDOW) -> CodecConfig:
    """The codec's shapes read off its (folded) tensors."""
    blocks = [i for i in range(1, 64) if f"encoder.block.{i}.block.4.conv.weight" in state]
    if not blocks:
        raise CheckpointError(f"{path}: no encoder blocks (not a Fish Speech codec)")
    rates = tuple(_shape(state, f"encoder.block.{i}.block.4.conv.weight", path)[-1] // 2 for i in blocks)
    layers = tuple(_count(state, f"encoder.block.{i}.block.5.layers.{{}}.attention.wqkv.weight") for i in blocks)
    last = blocks[-1] + 2
    dec_blocks = [i for i in range(1, 64) if f"decoder.model.{i}.block.1.conv.weight" in state]
    ds = _count(state, "quantizer.downsample.{}.0.conv.weight")
    semantic = _shape(state, "quantizer.semantic_quantizer.quantizers.0.codebook.weight", path)
    residual = _shape(state, "quantizer.quantizer.quantizers.0.codebook.weight", path)
    return CodecConfig(
        sample_rate=CODEC_SAMPLE_RATE,
        encoder_dim=_shape(state, "encoder.block.0.conv.weight", path)[0],
        encoder_rates=rates, latent_dim=_shape(state, f"encoder.block.{last}.conv.weight", path)[0],
        decoder_dim=_shape(state, "decoder.model.0.conv.weight", path)[0],
        decoder_rates=tuple(_shape(state, f"decoder.model.{i}.block.1.conv.weight", path)[-1] // 2 for i in dec_blocks),
        encoder_transformer_layers=layers,
        n_codebooks=_count(state, "quantizer.quantizer.quantizers.{}.codebook.weight"),
        codebook_size=residual[0], codebook_dim=residual[1], semantic_codebook_size=semantic[0],
        downsample_factor=tuple(_shape(state, f"quantizer.downsample.{i}.0.conv.weight", path)[-1] for i in range(ds)),
        pre=_transformer(state, "quantizer.pre_module.", window, path),
        post=_transformer(state, "quantizer.post_module.", window, path),
    )


def load_codec(folder: Path, dtype: torch.dtype,
               window: int = DEFAULT_CODEC_WINDOW) -> tuple[CodecEncoder, CodecDecoder]:
    """The codec's two halves from ``folder/codec.pth`` in `dtype` (every tensor used by one)."""
    path = folder / CODEC_FILE
    state = read_codec_state(path)
    cfg = infer_codec_config(state, path, window)
    encoder = build_on_meta(lambda: CodecEncoder(cfg), dtype)
    decoder = build_on_meta(lambda: CodecDecoder(cfg), dtype)
    unused = set(state) - set(encoder.state_dict()) - set(decoder.state_dict())
    if unused:
        raise CheckpointError(f"{path}: tensors no codec part reads: {', '.join(sorted(unused)[:8])}")
    if reading_weights():  # a shapes-only build (engines.published) reads the shapes only
        fill(encoder, state, path, strict=False)
        fill(decoder, state, path, strict=False)
    return encoder.eval(), decoder.eval()
