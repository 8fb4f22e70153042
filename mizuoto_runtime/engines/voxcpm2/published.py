"""VoxCPM 2's published checkpoint as data (issue 35, `engines.published`): ``openbmb/VoxCPM2``'s
config.json — a MiniCPM-4 text-semantic LM (2048 wide, 28 layers, 2 KV heads of 128), an
8-layer residual acoustic LM, a 12-layer local encoder and local DiT (1024 wide), and the
audio VAE V2 (16 kHz in, 48 kHz out). Its LongRoPE factors change no shape: they are written
as 1.0 here (the published lists differ); everything else is the published value."""
from __future__ import annotations

from typing import Any

import torch

from ..published import PublishedModel
from .checkpoint import REQUIRED_FILES, VAE_FILES

HEAD_DIM = 128
LOCAL: dict[str, Any] = dict(hidden_dim=1024, ffn_dim=4096, num_heads=16, num_layers=12, kv_channels=HEAD_DIM)
CONFIG: dict[str, Any] = dict(
    architecture="voxcpm2",
    lm_config=dict(
        bos_token_id=1, eos_token_id=2, hidden_size=2048, intermediate_size=6144, max_position_embeddings=32768,
        num_attention_heads=16, num_hidden_layers=28, num_key_value_heads=2, rms_norm_eps=1e-5,
        rope_scaling=dict(type="longrope", long_factor=[1.0] * (HEAD_DIM // 2), short_factor=[1.0] * (HEAD_DIM // 2),
                          original_max_position_embeddings=32768),
        vocab_size=73448, use_mup=True, scale_emb=12, dim_model_base=256, scale_depth=1.4, rope_theta=10000.0,
        kv_channels=HEAD_DIM,
    ),
    patch_size=4, feat_dim=64, residual_lm_num_layers=8, residual_lm_no_rope=False,
    scalar_quantization_latent_dim=512, scalar_quantization_scale=9,
    encoder_config=LOCAL,
    dit_config=dict(LOCAL, dit_mean_mode=False, cfm_config=dict(
        sigma_min=1e-6, solver="euler", t_scheduler="log-norm", training_cfg_rate=0.1, inference_cfg_rate=2.0,
        reg_loss_type="l1")),
    audio_vae_config=dict(
        encoder_dim=128, encoder_rates=[2, 5, 8, 8], latent_dim=64, decoder_dim=2048, decoder_rates=[8, 6, 5, 2, 2, 2],
        depthwise=True, sample_rate=16000, out_sample_rate=48000, use_noise_block=False,
        sr_bin_boundaries=[20000, 30000, 40000], cond_type="scale_bias", cond_dim=128, cond_out_layer=False),
    max_length=8192, dtype="bfloat16",
)

MODELS = (PublishedModel("voxcpm2", "VoxCPM2", "openbmb/VoxCPM2", {
    **{path: None for path in (*REQUIRED_FILES, VAE_FILES[1])}, "config.json": CONFIG}, dtype=torch.bfloat16),)
