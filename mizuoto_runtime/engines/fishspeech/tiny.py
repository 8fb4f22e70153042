"""Tiny random Fish Speech checkpoints in the official layouts, for tests and demos.

`write(dir, version=version)` writes what the engine reads:

* ``s2-pro`` (``fishaudio/s2-pro``): ``config.json`` (``fish_qwen3_omni``), two shards
  ``model-0000N-of-00002.safetensors`` with ``model.safetensors.index.json`` (keys
  ``text_model.model.*`` / ``audio_decoder.*``), ``tokenizer.json`` (a byte-level BPE with the
  Qwen3 chat tokens, the Fish tokens and ``<|semantic:i|>``), ``codec.pth``;
* ``s1-mini`` (``fishaudio/openaudio-s1-mini``): ``config.json`` (``dual_ar``), ``model.pth`` (flat
  keys), ``tokenizer.tiktoken`` + ``special_tokens.json``, ``codec.pth``.

``codec.pth`` is a flat state dict with weight norm in both key forms as the real file has it
(``parametrizations.weight.original0/1`` on the encoder and decoder convs, ``weight_g/weight_v``
on the codebook projections). Every module is ours, filled from a seeded generator, so the
files are byte-identical on every run. The geometry is the shape of the real one with narrow
widths (hop 512, 2048 samples a code frame at 44.1 kHz) and enough per layer that every
component has streamable units. Left unscaled, ``<|im_end|>`` comes after a few to a few hundred frames.
"""
from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from ...nn import weight_norm
from ..tiny import version_of
from .codec import CodecConfig, CodecDecoder, CodecEncoder, TransformerConfig
from .config import DualARConfig
from .dual_ar import FastTransformer, SlowTransformer
from .engine import FishSpeechEngine
from .tokenizer import IM_END, SEMANTIC

NUM_CODEBOOKS = 10
CODEBOOK_SIZE = 64
SEED = 1234
# Qwen3's specials, then Fish's, in the real files' order (S2-Pro); S1-mini's list (special_tokens.json).
S2_SPECIALS = ["<|endoftext|>", "<|im_start|>", IM_END, "<|pad|>", "<|phoneme_start|>", "<|phoneme_end|>",
               "<|text|>", "<|voice|>", "<|interleave|>", "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>"]
S1_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|im_start|>", IM_END, "<|phoneme_start|>",
               "<|phoneme_end|>", "<|tool_call_start|>", "<|tool_call_end|>", "<|text|>", "<|voice|>",
               "<|interleave|>", "<|audio_start|>", "<|audio_end|>", "<|audio|>"]
CORPUS = ["Hello world, this is a tiny test.", "A short reference line.", "Streaming is exact.",
          "convert the provided text to speech reference to the following:", "Text: Speech: system user assistant"]


def _config(vocab: int, sem_begin: int, sem_end: int, version: str) -> DualARConfig:
    return DualARConfig(
        vocab_size=vocab, n_layer=3, n_head=4, n_local_heads=2, head_dim=16, dim=64, intermediate_size=192,
        rope_base=1000000, norm_eps=1e-6, max_seq_len=4096, tie_word_embeddings=True, attention_qkv_bias=False,
        attention_o_bias=False, attention_qk_norm=True, codebook_size=CODEBOOK_SIZE, num_codebooks=NUM_CODEBOOKS,
        semantic_begin_id=sem_begin, semantic_end_id=sem_end, scale_codebook_embeddings=True,
        norm_fastlayer_input=version == "s2-pro",  # S1's config has no such key: the fast transformer reads pre-norm
        n_fast_layer=2, fast_dim=64, fast_n_head=4, fast_n_local_heads=2, fast_head_dim=16,
        fast_intermediate_size=192, fast_attention_qkv_bias=False, fast_attention_o_bias=False,
        fast_attention_qk_norm=False)


CODEC = CodecConfig(
    sample_rate=44100, encoder_dim=8, encoder_rates=(2, 4, 8, 8), latent_dim=128, decoder_dim=128,
    decoder_rates=(8, 8, 4, 2), encoder_transformer_layers=(0, 0, 0, 2), n_codebooks=9, codebook_size=32,
    codebook_dim=8, semantic_codebook_size=CODEBOOK_SIZE, downsample_factor=(2, 2),
    pre=TransformerConfig(n_layer=2, dim=128, n_head=2, intermediate_size=384, window=128),
    post=TransformerConfig(n_layer=2, dim=128, n_head=2, intermediate_size=384, window=128))


def _randomize(module: nn.Module, g: torch.Generator) -> None:
    """Linear/conv ~ N(0, 1/fan_in), embeddings ~ N(0, 1), norm-like vectors 1 + 0.1 N(0, 1)."""
    for name, p in module.named_parameters():
        with torch.no_grad():
            if p.dim() == 1 and name.endswith("bias"):
                p.copy_(0.01 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1 or name.endswith("alpha"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embeddings" in name or name.endswith("codebook.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))


def _dual_ar(cfg: DualARConfig, g: torch.Generator) -> dict[str, Tensor]:
    slow, fast = SlowTransformer(cfg), FastTransformer(cfg)
    _randomize(slow, g)
    _randomize(fast, g)
    return {**slow.state_dict(), **{k: v for k, v in fast.state_dict().items()}}


def _codec_state(g: torch.Generator) -> dict[str, Tensor]:
    encoder, decoder = CodecEncoder(CODEC), CodecDecoder(CODEC)
    _randomize(encoder, g)
    _randomize(decoder, g)
    with torch.no_grad():
        for q in (decoder.quantizer.semantic_quantizer, decoder.quantizer.quantizer):  # one codebook set
            enc_q = getattr(encoder.quantizer, "semantic_quantizer" if q is decoder.quantizer.semantic_quantizer
                            else "quantizer")
            q.load_state_dict(enc_q.state_dict())
        decoder.decoder.model[-2].conv.weight.mul_(0.05)  # a waveform of moderate level, not tanh's clamp
        for scale in (decoder.quantizer.post_module, encoder.quantizer.pre_module):
            for layer in getattr(scale, "layers", []):
                layer.attention_layer_scale.gamma.mul_(0.1)
                layer.ffn_layer_scale.gamma.mul_(0.1)
    state: dict[str, Tensor] = {}
    for key, value in {**encoder.state_dict(), **decoder.state_dict()}.items():
        if key in state:
            continue
        state.update(codec_stored(key, value))
    return {k: v.contiguous() for k, v in state.items()}


def codec_stored(key: str, value: Tensor) -> dict[str, Tensor]:
    """How ``codec.pth`` stores the codec's tensor `key`: the encoder's and decoder's convs as
    weight norm's parametrization pair, the codebook projections as its legacy pair, any other
    tensor as it is."""
    is_conv = key.endswith("conv.weight") and not key.startswith("quantizer.")
    is_proj = key.endswith(("in_proj.weight", "out_proj.weight")) and value.dim() == 3
    return weight_norm.unfold(key, value, legacy=is_proj) if is_conv or is_proj else {key: value}


def write_s2_tokenizer(folder: Path, semantic_tokens: int = CODEBOOK_SIZE) -> tuple[int, int]:
    """tokenizer.json with `semantic_tokens` ``<|semantic:i|>`` (the codebook's size); returns
    (its length, the first semantic id)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    tok.add_special_tokens(S2_SPECIALS + [SEMANTIC.format(i=i) for i in range(semantic_tokens)])
    tok.save(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    return tok.get_vocab_size(with_added_tokens=True), vocab[SEMANTIC.format(i=0)]


def _s1_tokenizer(folder: Path) -> tuple[int, int]:
    """tokenizer.tiktoken (the 256 bytes) + special_tokens.json; returns (its length, the first semantic id)."""
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    (folder / "tokenizer.tiktoken").write_text("\n".join(lines) + "\n", encoding="utf-8")
    names = S1_SPECIALS + [SEMANTIC.format(i=i) for i in range(CODEBOOK_SIZE)]
    (folder / "special_tokens.json").write_text(json.dumps({n: 256 + i for i, n in enumerate(names)}, indent=2),
                                                encoding="utf-8")
    return 256 + len(names), 256 + names.index(SEMANTIC.format(i=0))


def _s2_config(cfg: DualARConfig) -> dict[str, object]:
    common = {"dropout": 0.0, "use_gradient_checkpointing": False, "initializer_range": 0.02}
    return {
        "model_type": "fish_qwen3_omni", "dtype": "bfloat16", "sample_rate": 44100,
        "semantic_start_token_id": cfg.semantic_begin_id, "semantic_end_token_id": cfg.semantic_end_id,
        "text_config": {"model_type": "fish_qwen3", "vocab_size": cfg.vocab_size, "n_layer": cfg.n_layer,
                        "n_head": cfg.n_head, "dim": cfg.dim, "intermediate_size": cfg.intermediate_size,
                        "n_local_heads": cfg.n_local_heads, "head_dim": cfg.head_dim, "rope_base": cfg.rope_base,
                        "norm_eps": cfg.norm_eps, "max_seq_len": cfg.max_seq_len, "tie_word_embeddings": True,
                        "attention_qkv_bias": False, "attention_o_bias": False, "attention_qk_norm": True, **common},
        "audio_decoder_config": {"model_type": "fish_qwen3_audio_decoder", "vocab_size": cfg.codebook_size,
                                 "n_layer": cfg.n_fast_layer, "n_head": cfg.fast_n_head, "dim": cfg.fast_dim,
                                 "intermediate_size": cfg.fast_intermediate_size,
                                 "n_local_heads": cfg.fast_n_local_heads, "head_dim": cfg.fast_head_dim,
                                 "rope_base": cfg.rope_base, "norm_eps": cfg.norm_eps,
                                 "max_seq_len": cfg.num_codebooks + 1, "tie_word_embeddings": False,
                                 "attention_qkv_bias": False, "attention_o_bias": False, "attention_qk_norm": False,
                                 "text_dim": cfg.dim, "num_codebooks": cfg.num_codebooks, **common},
    }


def s2_key(key: str) -> str:
    if key.startswith("fast_"):
        return "audio_decoder." + key[len("fast_"):]
    if key.startswith("codebook_embeddings."):
        return "audio_decoder." + key
    return "text_model.model." + key


def _write_s2(folder: Path, weights: dict[str, Tensor], cfg: DualARConfig) -> None:
    tensors = {s2_key(k): v.contiguous() for k, v in weights.items()}
    names = sorted(tensors)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: tensors[k] for k in shard}, str(folder / file), metadata={"format": "pt"})
        weight_map.update({k: file for k in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total, "total_parameters": sum(t.numel() for t in tensors.values())},
             "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
    (folder / "config.json").write_text(json.dumps(_s2_config(cfg), indent=2), encoding="utf-8")


def _write_s1(folder: Path, weights: dict[str, Tensor], cfg: DualARConfig) -> None:
    torch.save({k: v.contiguous() for k, v in weights.items()}, folder / "model.pth")
    flat = {k: getattr(cfg, k) for k in ("vocab_size", "n_layer", "n_head", "n_local_heads", "head_dim", "dim",
                                          "intermediate_size", "rope_base", "norm_eps", "max_seq_len",
                                          "tie_word_embeddings", "attention_qkv_bias", "attention_o_bias",
                                          "attention_qk_norm", "codebook_size", "num_codebooks",
                                          "scale_codebook_embeddings", "n_fast_layer",
                                          "fast_dim", "fast_n_head", "fast_n_local_heads", "fast_head_dim",
                                          "fast_intermediate_size", "fast_attention_qkv_bias",
                                          "fast_attention_o_bias", "fast_attention_qk_norm")}
    (folder / "config.json").write_text(json.dumps({"model_type": "dual_ar", **flat}, indent=2), encoding="utf-8")


def write(directory: str | Path, *, version: str | None = None, seed: int = SEED,
          dtype: torch.dtype | None = None) -> Path:
    """Write a tiny random `version` checkpoint (None: ``s2-pro``) into `directory` (created);
    return it. `dtype`: the transformers' weights (None: float32; the releases ship bfloat16);
    the codec is float32 as released."""
    version = version_of(version, FishSpeechEngine.VERSIONS)
    dtype = torch.float32 if dtype is None else dtype
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    size, sem_begin = (write_s2_tokenizer if version == "s2-pro" else _s1_tokenizer)(folder)
    cfg = _config(size + 2, sem_begin, sem_begin + CODEBOOK_SIZE - 1, version)
    g = torch.Generator().manual_seed(seed)
    weights = {k: v.to(dtype) for k, v in _dual_ar(cfg, g).items()}
    (_write_s2 if version == "s2-pro" else _write_s1)(folder, weights, cfg)
    torch.save(_codec_state(g), folder / "codec.pth")
    return folder
