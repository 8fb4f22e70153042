"""Tiny random VoxCPM 2 checkpoints in the official layout (`openbmb/VoxCPM2`), for tests.

`write(dir)` writes the files `VoxCPM2Model.from_local` and our engine read::

    config.json  model.safetensors  audiovae.pth
    tokenizer.json  tokenizer_config.json  special_tokens_map.json

The official folder also ships ``tokenization_voxcpm2.py`` (a tokenizer class for
``trust_remote_code``); the package never runs it (it loads ``LlamaTokenizerFast``), so the
tiny folder has none: no code is written or executed from a model folder.

The modules are the `voxcpm` package's own classes, built from a small config and filled
from a seeded generator, so every tensor name and shape is the package's and the files are
byte-identical on every run. No download and no upstream code copied.

Geometry. Every component has at least two streamable units (M12: a list child of at least
1 MB), so the M57 tests really stream: the text-semantic LM (``base_lm``, 3 layers of 2.8 MB;
real: 28 of ~90 MB in bf16), the residual acoustic LM (2 layers; real: 8), the local encoder
and the local DiT (2 layers of 1.6 MB each; real: 12 of ~30 MB), the audio VAE's encoder (its
last two downsampling blocks) and decoder (its first two upsampling blocks). The VAE keeps the
real rates (16 kHz in, 48 kHz out, 640 samples per latent frame in, 1920 out) with narrower
channels. About 17 MB of main weights and 24 MB of VAE (float32).

Traps of the package this handles:
* the stop head is set so generation never stops early: a request of ``max_new_tokens=N``
  gives exactly N patches (4 latent frames, 1920 samples at 48 kHz each);
* fresh weight-norm magnitudes would make the VAE's output a clamped square wave: the last
  decoder conv is scaled so random latents give a waveform of std ~0.1;
* ids 101–104 (audio and reference-audio start/end) are plain token ids to the package: the
  vocabulary is larger than 104.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...nn.dtypes import DTYPE_NAMES, parse_dtype
from ..tiny import fan_in_std, one_version, scale_output, word_merges, write_json

log = logging.getLogger(__name__)

LM_HIDDEN = 256  # real: 2048
LM_HEADS, LM_KV_HEADS, LM_HEAD_DIM = 4, 2, 64  # real: 16, 2, 128
LOCAL_HIDDEN = 192  # local encoder and DiT; real: 1024
ROPE_POSITIONS = 2048  # real: 32768 (the cos/sin tables are buffers of this length)
PATCH_SIZE, FEAT_DIM = 4, 64  # as the real model

SPECIAL = ("<unk>", "<s>", "</s>")
WORDS = ("▁Hello", "▁from", "▁the", "▁tiny", "▁model", "▁is", "你好")
HAN = "你好世界声音"


# ---- text tokenizer ------------------------------------------------------------------------
def _vocabulary() -> tuple[dict[str, int], list[str]]:
    """A Llama-style BPE (SentencePiece ``▁`` word marks, byte fallback): the special tokens,
    the 256 byte tokens, printable ASCII, a few Han characters, and merges that make a few
    whole words (one a two-character Han word, which the package splits into characters)."""
    vocab: dict[str, int] = {t: i for i, t in enumerate(SPECIAL)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in ["▁"] + [chr(c) for c in range(33, 127)] + list(HAN):
        vocab.setdefault(ch, len(vocab))
    return vocab, word_merges(WORDS, vocab)


def _tokenizer_json(vocab: dict[str, int], merges: list[str]) -> dict[str, Any]:
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], unk_token="<unk>",
                        fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1)])
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    return json.loads(tok.to_str())


def _tokenizer_config() -> dict[str, Any]:
    return {
        "add_bos_token": True, "add_eos_token": False, "legacy": False, "clean_up_tokenization_spaces": False,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None,
        "model_max_length": 1000000000000000019884624838656, "tokenizer_class": "LlamaTokenizer",
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": True}
            for i, t in enumerate(SPECIAL)
        },
    }


# ---- config --------------------------------------------------------------------------------
def model_config(vocab_size: int, dtype: str) -> dict[str, Any]:
    half = LM_HEAD_DIM // 2
    lm = dict(
        bos_token_id=1, eos_token_id=2, hidden_size=LM_HIDDEN, intermediate_size=640,
        max_position_embeddings=ROPE_POSITIONS, num_attention_heads=LM_HEADS, num_hidden_layers=3,
        num_key_value_heads=LM_KV_HEADS, rms_norm_eps=1e-5,
        rope_scaling=dict(type="longrope", long_factor=[1.0 + i / half for i in range(half)],
                          short_factor=[1.0] * half, original_max_position_embeddings=1024),
        vocab_size=vocab_size, use_mup=True, scale_emb=12, dim_model_base=LM_HIDDEN // 4, scale_depth=1.4,
        rope_theta=10000.0, kv_channels=LM_HEAD_DIM,
    )
    # The local modules share the LM's rotary factors, so their head width must be the LM's.
    local = dict(hidden_dim=LOCAL_HIDDEN, ffn_dim=512, num_heads=4, num_layers=2, kv_channels=LM_HEAD_DIM)
    return dict(
        architecture="voxcpm2", lm_config=lm, patch_size=PATCH_SIZE, feat_dim=FEAT_DIM,
        residual_lm_num_layers=2, residual_lm_no_rope=False,
        scalar_quantization_latent_dim=64, scalar_quantization_scale=9,
        encoder_config=local,
        dit_config=dict(local, dit_mean_mode=False, cfm_config=dict(
            sigma_min=1e-6, solver="euler", t_scheduler="log-norm", training_cfg_rate=0.1,
            inference_cfg_rate=1.0, reg_loss_type="l1")),
        audio_vae_config=dict(
            encoder_dim=32, encoder_rates=[2, 5, 8, 8], latent_dim=FEAT_DIM, decoder_dim=512,
            decoder_rates=[8, 6, 5, 2, 2, 2], depthwise=True, sample_rate=16000, out_sample_rate=48000,
            use_noise_block=False, sr_bin_boundaries=[20000, 30000, 40000], cond_type="scale_bias",
            cond_dim=128, cond_out_layer=False),
        max_length=8192, device="cuda", dtype=dtype,
    )


# ---- weights -------------------------------------------------------------------------------
@torch.no_grad()
def randomize(model: nn.Module, gen: torch.Generator) -> None:
    """Seeded weights of a plausible scale; weight-norm magnitudes equal the directions' norms."""
    for name, p in model.named_parameters():
        if name.endswith(("norm.weight", "layernorm.weight")):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif name.endswith(".bias"):
            p.copy_(0.02 * torch.randn(p.shape, generator=gen))
        elif name.endswith(".alpha"):  # Snake
            p.copy_(0.5 + torch.rand(p.shape, generator=gen))
        elif name.endswith("weight_g"):
            continue  # set from weight_v below
        elif "embed" in name or name.endswith("special_token"):
            p.copy_(torch.randn(p.shape, generator=gen))
        else:
            p.copy_(fan_in_std(p) * torch.randn(p.shape, generator=gen))
    for module in model.modules():
        v = getattr(module, "weight_v", None)
        if isinstance(v, nn.Parameter):
            dims = [d for d in range(v.dim()) if d != 0]
            module.weight_g.copy_(torch.linalg.vector_norm(v, dim=dims, keepdim=True))
    # Never stop early: the stop head sees SiLU(1) everywhere and always prefers "go on".
    model.stop_proj.weight.zero_()
    model.stop_proj.bias.fill_(1.0)
    model.stop_head.weight[0].fill_(1.0)
    model.stop_head.weight[1].fill_(-1.0)


def _calibrate_output(vae: nn.Module, gen: torch.Generator) -> None:
    """Scale the last decoder conv so random latents give std ~0.1 (the decoder ends in tanh)."""
    last = [m for m in vae.decoder.modules() if isinstance(m, nn.Conv1d)][-1]
    latents = torch.randn(1, vae.latent_dim, 8, generator=gen)
    scale_output(last, lambda: vae.decode(latents), (last.weight_g, last.bias))


# ---- files ---------------------------------------------------------------------------------
def write(directory: str | Path, *, version: str | None = None, seed: int = 0,
          dtype: str | torch.dtype | None = None) -> Path:
    """Write a tiny random VoxCPM 2 checkpoint into `directory`. `dtype` is that of
    ``model.safetensors`` and the config's run precision (None: float32); the audio VAE is
    always float32, as the official checkpoint ships it and the package runs it."""
    from .checkpoint import import_upstream

    one_version(version)

    import_upstream()
    from safetensors.torch import save_file
    from transformers import LlamaTokenizerFast
    from voxcpm.model.voxcpm2 import VoxCPM2Model, VoxCPMConfig
    from voxcpm.modules.audiovae import AudioVAEConfigV2, AudioVAEV2

    run_dtype = parse_dtype(torch.float32 if dtype is None else dtype, "tiny checkpoint dtype")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)

    vocab, merges = _vocabulary()
    write_json(out / "tokenizer.json", _tokenizer_json(vocab, merges))
    write_json(out / "tokenizer_config.json", _tokenizer_config())
    write_json(out / "special_tokens_map.json", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    config = model_config(len(vocab), DTYPE_NAMES[run_dtype])
    write_json(out / "config.json", config)

    cfg = VoxCPMConfig.model_validate(config)
    cfg.max_length = 1  # the package preallocates its KV caches at construction; not needed here
    vae = AudioVAEV2(config=AudioVAEConfigV2.model_validate(config["audio_vae_config"]))
    tokenizer = LlamaTokenizerFast.from_pretrained(str(out))
    model = VoxCPM2Model(cfg, tokenizer, vae, device="cpu")
    randomize(model, gen)
    _calibrate_output(model.audio_vae, gen)

    state = {}
    for key, value in model.state_dict().items():
        if key.startswith("audio_vae."):
            continue
        value = value.detach().contiguous().clone()
        state[key] = value.to(run_dtype) if value.is_floating_point() else value
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    torch.save({k: v.detach().clone() for k, v in model.audio_vae.state_dict().items()}, out / "audiovae.pth")
    for name in ("model.safetensors", "audiovae.pth"):
        os.chmod(out / name, 0o644)
    log.info("wrote tiny VoxCPM 2 checkpoint to %s (%d parameters, %d of them the audio VAE)", out,
             sum(p.numel() for p in model.parameters()), sum(p.numel() for p in model.audio_vae.parameters()))
    return out
