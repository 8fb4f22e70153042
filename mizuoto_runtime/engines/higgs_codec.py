"""Higgs Audio v2's audio tokenizer (transformers' `HiggsAudioV2TokenizerModel`), shared by the
engines that run on it: Higgs Audio v2 itself and OmniVoice (its codec). Loading it from its
folder, built on meta and filled from the memory-mapped safetensors in float32 as published
(`load_codec`, M27), its parts as the components the phases place (`register_codec`, M1), its
DAC decoder's working memory (`decoder_memory`, M45), and its published config
(``bosonai/higgs-audio-v2-tokenizer``'s, `TOKENIZER`)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..nn.loading import build_on_meta, load_safetensors
from .checkpoint_files import config_from

if TYPE_CHECKING:
    from ..memory.handle import ModelHandle
    from .base import Engine

# The DAC decoder's widest stage (output channels x samples), counted this many times: the
# stage's output, and the Snake activations, dilated-conv inputs and residual sums of its three
# residual units alive together (fitted to CPU peaks on the tiny checkpoints, bench/engines.py
# --peaks: 1.0-1.3x).
DECODER_COPIES_PER_SAMPLE = 5

#: ``config.json`` of the audio tokenizer: 24 kHz, hop 960 (25 frames/s), 8 codebooks of 1024
#: (2 kbps); a DAC acoustic branch and a HuBERT-base semantic branch (16 kHz). The class
#: defaults differ: DAC ratios [8, 5, 4, 2] and a 4 kbps top bandwidth.
TOKENIZER: dict[str, Any] = {
    "architectures": ["HiggsAudioV2TokenizerModel"],
    "model_type": "higgs_audio_v2_tokenizer",
    "sample_rate": 24000,
    "semantic_sample_rate": 16000,
    "downsample_factor": 320,
    "codebook_size": 1024,
    "codebook_dim": 64,
    "kernel_size": 3,
    "unit_kernel_size": 3,
    "strides": [1, 1],
    "channel_ratios": [1, 1],
    "block_dilations": [1, 1],
    "target_bandwidths": [0.5, 1, 1.5, 2],
    "dtype": "float32",
    "acoustic_model_config": {
        "model_type": "dac", "encoder_hidden_size": 64, "decoder_hidden_size": 1024, "hidden_size": 256,
        "downsampling_ratios": [8, 5, 4, 2, 3], "upsampling_ratios": [8, 5, 4, 2, 3],
        "n_codebooks": 9, "codebook_size": 1024, "codebook_dim": 8,
    },
    "semantic_model_config": {
        "model_type": "hubert", "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
        "num_attention_heads": 12, "conv_dim": [512] * 7, "conv_kernel": [10, 3, 3, 3, 3, 2, 2],
        "conv_stride": [5, 2, 2, 2, 2, 2, 2], "mask_time_prob": 0.0,
    },
}


def load_codec(folder: Path) -> nn.Module:
    """The audio tokenizer of `folder` (``config.json``, ``model.safetensors``), in eval mode."""
    from transformers import HiggsAudioV2TokenizerConfig, HiggsAudioV2TokenizerModel

    config = config_from(HiggsAudioV2TokenizerConfig, folder)
    codec = build_on_meta(lambda: HiggsAudioV2TokenizerModel(config), torch.float32)
    load_safetensors(codec, folder / "model.safetensors")
    return codec.eval()


@dataclasses.dataclass
class CodecHandles:
    """The tokenizer's components: encoding takes `encoder` and `quantizer`, decoding
    `quantizer` and `decoder`. Its semantic decoder is never run at inference: not registered."""

    encoder: ModelHandle
    quantizer: ModelHandle
    decoder: ModelHandle


def register_codec(engine: Engine, codec: Any) -> CodecHandles:
    """Register the tokenizer's parts with `engine`'s manager, each `oneshot`."""
    # The acoustic encoder first: `codec.device` reads the codec's first parameter, which is then
    # the encoder component's (its anchor, resident whenever it is placed).
    encoder = engine.register(nn.ModuleDict({
        "acoustic_encoder": codec.acoustic_encoder, "semantic_model": codec.semantic_model,
        "encoder_semantic": codec.encoder_semantic, "fc": codec.fc,
    }), "audio_encoder")
    quantizer = engine.register(codec.quantizer, "quantizer")
    decoder = engine.register(nn.ModuleDict({"fc2": codec.fc2, "acoustic_decoder": codec.acoustic_decoder}),
                              "audio_decoder")
    return CodecHandles(encoder, quantizer, decoder)


def decoder_memory(codec: Any, frames: int) -> int:
    """M45: the DAC decoder's working memory for `frames` token frames (float32): its widest
    upsampling stage, and the waveform."""
    config = codec.config
    samples = frames * config.hop_length
    acoustic = config.acoustic_model_config
    widest, length, channels = 0, frames, acoustic.decoder_hidden_size
    for rate in acoustic.upsampling_ratios:
        channels //= 2
        length *= rate
        widest = max(widest, channels * length)
    return 4 * (DECODER_COPIES_PER_SAMPLE * widest + 4 * samples)
