"""Qwen3-TTS's published checkpoints as data (issue 35, `engines.published`): the config files
of ``Qwen/Qwen3-TTS-12Hz-{0.6B,1.7B}-{Base,CustomVoice,VoiceDesign}`` as the model cards ship
them, the keys the package's config classes read (token ids, speaker and language tables do
not change a shape and are left at what the files say or out)."""
from __future__ import annotations

from typing import Any

from ..published import FileContent, PublishedModel
from .checkpoint import REQUIRED_FILES
from .tiny import GENERATION_CONFIG

_CODE_PREDICTOR = dict(
    vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, hidden_act="silu", max_position_embeddings=65536, rms_norm_eps=1e-6,
    rope_theta=1000000, num_code_groups=16, model_type="qwen3_tts_talker_code_predictor",
)
_TALKER_IDS = dict(
    vocab_size=3072, codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_think_id=2154,
    codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157,
    codec_language_id={"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
                       "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069},
)
# (size label, talker hidden, talker intermediate): the two published sizes.
_SIZES = {"0.6B": ("0b6", 1024, 3072), "1.7B": ("1b7", 2048, 6144)}
_TYPES = {"Base": "base", "CustomVoice": "custom_voice", "VoiceDesign": "voice_design"}

SPEECH_TOKENIZER: dict[str, Any] = dict(
    architectures=["Qwen3TTSTokenizerV2Model"], model_type="qwen3_tts_tokenizer_12hz",
    encoder_valid_num_quantizers=16, input_sample_rate=24000, output_sample_rate=24000,
    decode_upsample_rate=1920, encode_downsample_rate=1920,
    encoder_config=dict(
        model_type="mimi", sampling_rate=24000, frame_rate=12.5, audio_channels=1, hidden_size=512,
        num_filters=64, num_residual_layers=1, upsampling_ratios=[8, 6, 5, 4], kernel_size=7, last_kernel_size=3,
        residual_kernel_size=3, dilation_growth_rate=2, use_causal_conv=True, pad_mode="constant", compress=2,
        trim_right_ratio=1.0, codebook_size=2048, codebook_dim=256, num_quantizers=32, use_conv_shortcut=False,
        vector_quantization_hidden_dimension=256, num_semantic_quantizers=1, upsample_groups=512,
        num_hidden_layers=8, intermediate_size=2048, num_attention_heads=8, num_key_value_heads=8, head_dim=64,
        hidden_act="gelu", max_position_embeddings=8000, norm_eps=1e-5, use_cache=False, use_streaming=False,
        rope_theta=10000.0, sliding_window=250, attention_dropout=0.0, layer_scale_initial_scale=0.01,
        attention_bias=False,
    ),
    decoder_config=dict(
        codebook_size=2048, codebook_dim=512, hidden_size=512, latent_dim=1024, max_position_embeddings=8000,
        rope_theta=10000, num_attention_heads=16, num_key_value_heads=16, head_dim=64, attention_bias=False,
        sliding_window=72, intermediate_size=1024, hidden_act="silu", layer_scale_initial_scale=0.01,
        rms_norm_eps=1e-5, num_hidden_layers=8, num_quantizers=16, num_semantic_quantizers=1,
        semantic_codebook_size=4096, vector_quantization_hidden_dimension=512, upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2], decoder_dim=1536, attention_dropout=0.0,
    ),
)


def main_config(size: str, model_type: str) -> dict[str, Any]:
    label, hidden, intermediate = _SIZES[size]
    talker = dict(
        code_predictor_config=_CODE_PREDICTOR, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000,
        rope_scaling={"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default", "type": "default"},
        num_code_groups=16, text_hidden_size=2048, text_vocab_size=151936, position_id_per_seconds=13,
        model_type="qwen3_tts_talker", spk_id={}, spk_is_dialect={}, **_TALKER_IDS,
    )
    config: dict[str, Any] = dict(
        architectures=["Qwen3TTSForConditionalGeneration"], model_type="qwen3_tts",
        tokenizer_type="qwen3_tts_tokenizer_12hz", tts_model_size=label, tts_model_type=model_type,
        im_start_token_id=151644, im_end_token_id=151645, tts_pad_token_id=151671, tts_bos_token_id=151672,
        tts_eos_token_id=151673, talker_config=talker,
    )
    if model_type == "base":
        config["speaker_encoder_config"] = dict(
            mel_dim=128, enc_dim=hidden, enc_channels=[512, 512, 512, 512, 1536], enc_kernel_sizes=[5, 3, 3, 3, 1],
            enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=128, enc_res2net_scale=8, enc_se_channels=128,
            sample_rate=24000,
        )
    return config


def _model(size: str, kind: str) -> PublishedModel:
    name = f"Qwen3-TTS-12Hz-{size}-{kind}"
    files: dict[str, FileContent] = {path: None for path in REQUIRED_FILES}
    files.update({"config.json": main_config(size, _TYPES[kind]), "generation_config.json": GENERATION_CONFIG,
                  "speech_tokenizer/config.json": SPEECH_TOKENIZER})
    return PublishedModel("qwen3tts", name, f"Qwen/{name}", files, version=_TYPES[kind])


MODELS = (
    _model("0.6B", "Base"), _model("0.6B", "CustomVoice"),
    _model("1.7B", "Base"), _model("1.7B", "CustomVoice"), _model("1.7B", "VoiceDesign"),
)
