"""Tiny random Qwen3-TTS (12 Hz) checkpoints in the official Hugging Face layout, for tests.

`write(dir, version=model_type)` writes the same files as `Qwen/Qwen3-TTS-12Hz-*`::

    config.json  generation_config.json  model.safetensors
    vocab.json  merges.txt  tokenizer_config.json  preprocessor_config.json
    speech_tokenizer/{config.json, model.safetensors, preprocessor_config.json}

The modules are the official `qwen_tts` classes (so every tensor name and shape is the
package's), with weights drawn from a seeded generator: the files are byte-identical on
every run. No download, no upstream code copied: only its classes are instantiated.

Geometry. Small enough that a request runs in about a second on one CPU core, large enough
that every component has at least two streamable units (M12: a list child of at least 1 MB),
so the M57 tests really stream: the talker's 2 layers (2.4 MB each) and the code predictor's
2 (1.8 MB each), the speaker encoder's 3 SE-Res2Net blocks (1.1 MB each), the codec encoder's
2 transformer layers and last downsampling conv, the codec decoder's 2 transformer layers and
first upsampling block. About 23 MB of main weights (Base) and 20 MB of speech tokenizer.

Traps of the package this handles (see the study notes of issue 6):
* the speaker encoder's config class has no ``**kwargs``: write only its keys by hand;
* ``generation_config.json`` and ``speech_tokenizer/preprocessor_config.json`` are required;
* ``<|im_start|>assistant\\n`` must tokenize to exactly 3 tokens (the package slices ``[:3]``);
* the talker vocabulary must be codebook + 1024, every control id in the top 1024;
* fresh codebooks are zeros (decoder ``embedding_sum`` parameters, Mimi ``embed_sum``
  buffers): randomized;
* the ``codec_eos`` row of ``codec_head`` is zeroed and the rest scaled up, so sampling
  practically never stops early: a request with ``max_new_tokens=N`` gives N-1 frames;
* the last decoder conv is scaled so random codes give a waveform of std ~0.1, not a
  clamped square wave.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...nn.dtypes import DTYPE_NAMES, parse_dtype
from ..tiny import byte_alphabet, fan_in_std, scale_output, version_of, word_merges, write_json
from . import compat
from .checkpoint import import_upstream
from .engine import Qwen3TTSEngine

log = logging.getLogger(__name__)


CODEBOOK = 64  # real: 2048 (Mimi needs a power of two)
NUM_GROUPS = 16  # real: 16 (1 talker codebook + 15 code-predictor codebooks)
TALKER_HIDDEN = 256  # real: 1024 (0.6B) / 2048 (1.7B)
CP_HIDDEN = 128  # != talker hidden: small_to_mtp_projection is a Linear, as in 1.7B
TEXT_VOCAB_SIZE = 384  # embedding rows >= tokenizer size, like 151936 vs ~151700

MERGE_WORDS = ("assistant", "user", "system")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>")
SPEAKERS = {"alice": 900, "bob": 901, "dylan": 902}  # offsets above the codebook
DIALECTS = {"alice": False, "bob": False, "dylan": "beijing_dialect"}
LANGUAGES = {"english": 2, "chinese": 7, "german": 3, "beijing_dialect": 10}

# The official generation_config.json's keys and values (max_new_tokens 8192 there too).
GENERATION_CONFIG: dict[str, Any] = {
    "do_sample": True, "temperature": 0.9, "top_p": 1.0, "top_k": 50, "repetition_penalty": 1.05,
    "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0, "subtalker_top_k": 50,
    "max_new_tokens": 8192,
}
SPEECH_PREPROCESSOR: dict[str, Any] = {
    "chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1,
    "overlap": None, "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
    "sampling_rate": 24000,
}
PREPROCESSOR: dict[str, Any] = {"processor_class": "Qwen3TTSProcessor"}


# ---- text tokenizer ------------------------------------------------------------------------
def text_tokenizer() -> tuple[dict[str, int], list[str], dict[str, Any], dict[str, int]]:
    """Vocabulary, merges, tokenizer_config.json and special-token ids of a byte-level BPE
    whose merges make ``assistant``, ``user`` and ``system`` single tokens."""
    alphabet = byte_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    merges = word_merges(MERGE_WORDS, vocab)
    special = {token: len(vocab) + i for i, token in enumerate(SPECIAL_TOKENS)}
    if len(vocab) + len(special) > TEXT_VOCAB_SIZE:
        raise ValueError("tiny tokenizer does not fit the text embedding")
    config = {
        "add_bos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for t, i in special.items()
        },
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 32768, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }
    return vocab, merges, config, special


# ---- configs -------------------------------------------------------------------------------
def _talker_ids(model_type: str) -> dict[str, Any]:
    # `generate` suppresses ids [vocab-1024, vocab) except codec_eos: every control id must
    # sit in that range, and the vocabulary must be codebook + 1024 (3072 in the real model).
    base = CODEBOOK
    named = model_type == "custom_voice"  # only CustomVoice checkpoints have named speakers
    return dict(
        vocab_size=CODEBOOK + 1024,
        codec_pad_id=base + 100, codec_bos_id=base + 101, codec_eos_token_id=base + 102,
        codec_think_id=base + 106, codec_nothink_id=base + 107,
        codec_think_bos_id=base + 108, codec_think_eos_id=base + 109,
        codec_language_id={k: base + v for k, v in LANGUAGES.items()},
        spk_id={k: base + v for k, v in SPEAKERS.items()} if named else {},
        spk_is_dialect=dict(DIALECTS) if named else {},
    )


def main_config(model_type: str, special: dict[str, int], dtype: str) -> dict[str, Any]:
    code_predictor = dict(
        vocab_size=CODEBOOK, hidden_size=CP_HIDDEN, intermediate_size=1024, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, hidden_act="silu",
        max_position_embeddings=65536, rms_norm_eps=1e-6, rope_theta=1000000, rope_scaling=None,
        attention_bias=False, use_sliding_window=False, sliding_window=None, max_window_layers=28,
        attention_dropout=0.0, num_code_groups=NUM_GROUPS, tie_word_embeddings=False,
        initializer_range=0.02, use_cache=True, model_type="qwen3_tts_talker_code_predictor",
    )
    talker = dict(
        code_predictor_config=code_predictor,
        hidden_size=TALKER_HIDDEN, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000,
        # mrope sections sum to head_dim / 2 (real: [24, 20, 20] for head_dim 128)
        rope_scaling={"interleaved": True, "mrope_section": [12, 10, 10], "rope_type": "default", "type": "default"},
        attention_bias=False, use_sliding_window=False, sliding_window=None, attention_dropout=0.0,
        num_code_groups=NUM_GROUPS, text_hidden_size=64, text_vocab_size=TEXT_VOCAB_SIZE,
        position_id_per_seconds=13, initializer_range=0.02, use_cache=True, tie_word_embeddings=False,
        model_type="qwen3_tts_talker", **_talker_ids(model_type),
    )
    config: dict[str, Any] = dict(
        architectures=["Qwen3TTSForConditionalGeneration"], model_type="qwen3_tts",
        tokenizer_type="qwen3_tts_tokenizer_12hz",
        # "0b6" makes CustomVoice drop `instruct` (the package tests it as a substring)
        tts_model_size="0b6" if model_type == "base" else "1b7",
        tts_model_type=model_type,
        im_start_token_id=special["<|im_start|>"], im_end_token_id=special["<|im_end|>"],
        tts_pad_token_id=special["<tts_pad>"], tts_bos_token_id=special["<tts_text_bos>"],
        tts_eos_token_id=special["<tts_text_eod>"],
        talker_config=talker, dtype=dtype, transformers_version="4.57.3",
    )
    if model_type == "base":
        # Only the keys its __init__ accepts (it has no **kwargs). enc_dim must equal the talker's
        # hidden size (the x-vector is a talker input position); mel_dim is hard-coded to 128;
        # the last channel count is 3x the others (the aggregation concatenates three blocks).
        config["speaker_encoder_config"] = dict(
            mel_dim=128, enc_dim=TALKER_HIDDEN, enc_channels=[320, 320, 320, 320, 960],
            enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1],
            enc_attention_channels=64, enc_res2net_scale=8, enc_se_channels=64, sample_rate=24000,
        )
    return config


def speech_tokenizer_config() -> dict[str, Any]:
    encoder = dict(
        model_type="mimi", sampling_rate=24000, frame_rate=12.5, audio_channels=1,
        hidden_size=256, num_filters=16, num_residual_layers=1, upsampling_ratios=[8, 6, 5, 4],
        kernel_size=7, last_kernel_size=3, residual_kernel_size=3, dilation_growth_rate=2,
        use_causal_conv=True, pad_mode="constant", compress=2, trim_right_ratio=1.0,
        codebook_size=CODEBOOK, codebook_dim=16, num_quantizers=32, use_conv_shortcut=False,
        vector_quantization_hidden_dimension=16, num_semantic_quantizers=1, upsample_groups=256,
        num_hidden_layers=2, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=4,
        head_dim=64, hidden_act="gelu", max_position_embeddings=8000, norm_eps=1e-5, use_cache=False,
        use_streaming=False, rope_theta=10000.0, sliding_window=250, attention_dropout=0.0,
        layer_scale_initial_scale=0.01, attention_bias=False,
    )
    decoder = dict(
        codebook_size=CODEBOOK, codebook_dim=32, hidden_size=256, latent_dim=64,
        max_position_embeddings=8000, rope_theta=10000, num_attention_heads=4, num_key_value_heads=4,
        head_dim=64, attention_bias=False, sliding_window=72, intermediate_size=512, hidden_act="silu",
        layer_scale_initial_scale=0.01, rms_norm_eps=1e-5, num_hidden_layers=2,
        num_quantizers=NUM_GROUPS, num_semantic_quantizers=1, semantic_codebook_size=CODEBOOK,
        vector_quantization_hidden_dimension=16, upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2],
        decoder_dim=256, attention_dropout=0.0,
    )
    return dict(
        architectures=["Qwen3TTSTokenizerV2Model"], model_type="qwen3_tts_tokenizer_12hz",
        encoder_config=encoder, decoder_config=decoder, encoder_valid_num_quantizers=NUM_GROUPS,
        input_sample_rate=24000, output_sample_rate=24000, decode_upsample_rate=1920,
        encode_downsample_rate=1920, dtype="float32", transformers_version="4.57.3",
    )


# ---- weights -------------------------------------------------------------------------------
@torch.no_grad()
def randomize_main(model: nn.Module, eos_id: int, gen: torch.Generator) -> None:
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):  # includes q_norm / k_norm
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif name.endswith(".bias"):
            p.copy_(0.02 * torch.randn(p.shape, generator=gen))
        elif "embedding" in name:
            p.copy_(torch.randn(p.shape, generator=gen))
        else:
            p.copy_(fan_in_std(p) * torch.randn(p.shape, generator=gen))
    # Peaked logits with a zero EOS logit: random sampling practically never stops early.
    head = model.talker.codec_head.weight
    head.mul_(3.0)
    head[eos_id].zero_()


@torch.no_grad()
def randomize_codec(model: nn.Module, gen: torch.Generator) -> None:
    for name, p in model.named_parameters():
        if name.endswith("embedding_sum"):  # decoder codebooks (zeros when fresh)
            p.copy_(torch.randn(p.shape, generator=gen))
        elif name.endswith("cluster_usage"):
            p.copy_(1.0 + torch.rand(p.shape, generator=gen))
        elif name.endswith((".alpha", ".beta")):  # SnakeBeta (zeros when fresh)
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        elif "norm" in name and name.endswith("weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif name.endswith(".bias"):
            p.copy_(0.02 * torch.randn(p.shape, generator=gen))
        elif name.endswith((".scale", ".gamma")):
            p.copy_(0.1 + 0.05 * torch.rand(p.shape, generator=gen))
        else:
            p.copy_(fan_in_std(p) * torch.randn(p.shape, generator=gen))
    _calibrate_output(model, gen)
    for name, b in model.named_buffers():
        if name.endswith("embed_sum"):  # Mimi encoder codebooks (buffers, zeros when fresh)
            b.copy_(0.3 * torch.randn(b.shape, generator=gen))
        elif name.endswith("cluster_usage"):
            b.copy_(1.0 + torch.rand(b.shape, generator=gen))


def _calibrate_output(model: nn.Module, gen: torch.Generator) -> None:
    """Scale the last decoder conv so random codes give std ~0.1 (the decoder ends in a clamp)."""
    last = model.decoder.decoder[-1].conv
    cfg = model.config.decoder_config
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, 12), generator=gen)
    scale_output(last, lambda: model.decoder(codes), (last.weight, last.bias))


# ---- files ---------------------------------------------------------------------------------
def _save(model: nn.Module, path: Path, dtype: torch.dtype | None = None,
          key: Callable[[str], str] = str) -> None:
    """`model`'s tensors under the names the published checkpoints use (`key`)."""
    from safetensors.torch import save_file

    state = {}
    for name, value in model.state_dict().items():
        value = value.detach().contiguous().clone()
        state[key(name)] = value.to(dtype) if dtype is not None and value.is_floating_point() else value
    save_file(state, str(path), metadata={"format": "pt"})
    os.chmod(path, 0o644)


def _without_architectures(config: dict[str, Any]) -> dict[str, Any]:
    """A config.json's keys as config-class arguments (`architectures` is metadata, not one)."""
    return {k: v for k, v in config.items() if k != "architectures"}


def write(directory: str | Path, *, version: str | None = None, seed: int = 0,
          dtype: str | torch.dtype | None = None) -> Path:
    """Write a tiny random checkpoint of the model type `version` (``base``, ``custom_voice`` or
    ``voice_design``; None: ``base``) into `directory`. `dtype` is that of ``model.safetensors``
    (None: float32); the speech tokenizer is always float32, as the official checkpoints ship it."""
    import_upstream()
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from transformers import Qwen2TokenizerFast

    model_type = version_of(version, Qwen3TTSEngine.VERSIONS)
    run_dtype = parse_dtype(torch.float32 if dtype is None else dtype, "tiny checkpoint dtype")
    out = Path(directory)
    (out / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)

    vocab, merges, tokenizer_config, special = text_tokenizer()
    write_json(out / "vocab.json", vocab)
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges), encoding="utf-8")
    write_json(out / "tokenizer_config.json", tokenizer_config)
    write_json(out / "preprocessor_config.json", PREPROCESSOR)
    write_json(out / "generation_config.json", GENERATION_CONFIG)

    config = main_config(model_type, special, DTYPE_NAMES[run_dtype])
    write_json(out / "config.json", config)
    model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**_without_architectures(config)))
    randomize_main(model, config["talker_config"]["codec_eos_token_id"], gen)
    _save(model, out / "model.safetensors", None if run_dtype == torch.float32 else run_dtype)

    st_config = speech_tokenizer_config()
    write_json(out / "speech_tokenizer" / "config.json", st_config)
    write_json(out / "speech_tokenizer" / "preprocessor_config.json", SPEECH_PREPROCESSOR)
    codec = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**_without_architectures(st_config)))
    randomize_codec(codec, gen)
    _save(codec, out / "speech_tokenizer" / "model.safetensors", key=compat.codec_key)

    # The package slices the chat template at 3 tokens: check the trap is handled.
    ids = Qwen2TokenizerFast.from_pretrained(str(out))("<|im_start|>assistant\n")["input_ids"]
    if len(ids) != 3:
        raise AssertionError(f"tiny tokenizer: '<|im_start|>assistant\\n' is {len(ids)} tokens, must be 3")
    log.info("wrote tiny Qwen3-TTS %s checkpoint to %s (%d + %d parameters)", model_type, out,
             sum(p.numel() for p in model.parameters()), sum(p.numel() for p in codec.parameters()))
    return out
