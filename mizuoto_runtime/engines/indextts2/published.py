"""IndexTTS-2's published checkpoint as data (issue 35, `engines.published`): ``IndexTeam/IndexTTS-2``'s
``config.yaml`` (a GPT-2 of 24 layers, 1280 wide, 20 heads; conformer-perceiver conditioning;
the MaskGCT semantic codec; s2mel's 13-layer DiT and WaveNet, 512 wide) and its auxiliary
models as upstream's downloader lays them out: w2v-BERT 2.0 (``facebook/w2v-bert-2.0``'s config:
transformers' defaults, 1024 wide, 24 layers), CAM++ (``funasr/campplus``), BigVGAN
(``nvidia/bigvgan_v2_22khz_80band_256x``'s config.json, the keys the generator reads).

Files whose shapes the loader reads off their tensors are written as stand-ins holding those
tensors' names and shapes and no data (each a zero-stride view of one element): CAM++'s state
(the model card's sizes, `CAMPPlusSizes`' defaults), s2mel's GPT projection (1280 -> 256 -> 128
-> 1024), the w2v-BERT feature statistics (1024 wide) and the speaker and emotion tables (73
rows: ``emo_num``). The other weight files are empty (the build reads none of them). The emotion text model
(``qwen0.6bemo4-merge``) is optional and not in this build.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ...nn.loading import build_on_meta
from ..published import FileContent, PublishedModel
from .campplus import CAMPPlus
from .checkpoint import AUX, AUX_FILES
from .config import CAMPPlusSizes

EMO_NUM = [3, 17, 2, 8, 4, 5, 10, 24]
GPT_DIM = 1280
CONFIG: dict[str, Any] = {
    "dataset": {"bpe_model": "bpe.model", "sample_rate": 24000, "squeeze": False,
                "mel": {"sample_rate": 24000, "n_fft": 1024, "hop_length": 256, "win_length": 1024, "n_mels": 100,
                        "mel_fmin": 0, "normalize": False}},
    "gpt": {"model_dim": GPT_DIM, "max_mel_tokens": 1815, "max_text_tokens": 600, "heads": 20,
            "use_mel_codes_as_input": True, "mel_length_compression": 1024, "layers": 24,
            "number_text_tokens": 12000, "number_mel_codes": 8194, "start_mel_token": 8192, "stop_mel_token": 8193,
            "start_text_token": 0, "stop_text_token": 1, "train_solo_embeddings": False,
            "condition_type": "conformer_perceiver",
            "condition_module": {"output_size": 512, "linear_units": 2048, "attention_heads": 8, "num_blocks": 6,
                                 "input_layer": "conv2d2", "perceiver_mult": 2},
            "emo_condition_module": {"output_size": 512, "linear_units": 1024, "attention_heads": 4, "num_blocks": 4,
                                     "input_layer": "conv2d2", "perceiver_mult": 2}},
    "semantic_codec": {"codebook_size": 8192, "hidden_size": 1024, "codebook_dim": 8, "vocos_dim": 384,
                       "vocos_intermediate_dim": 2048, "vocos_num_layers": 12},
    "s2mel": {
        "preprocess_params": {"sr": 22050, "spect_params": {"n_fft": 1024, "win_length": 1024, "hop_length": 256,
                                                            "n_mels": 80, "fmin": 0, "fmax": "None"}},
        "dit_type": "DiT", "reg_loss_type": "l1", "style_encoder": {"dim": 192},
        "length_regulator": {"channels": 512, "is_discrete": False, "in_channels": 1024, "content_codebook_size": 2048,
                             "sampling_ratios": [1, 1, 1, 1], "vector_quantize": False, "n_codebooks": 1,
                             "quantizer_dropout": 0.0, "f0_condition": False, "n_f0_bins": 512},
        "DiT": {"hidden_dim": 512, "num_heads": 8, "depth": 13, "class_dropout_prob": 0.1, "block_size": 8192,
                "in_channels": 80, "style_condition": True, "final_layer_type": "wavenet", "target": "mel",
                "content_dim": 512, "content_codebook_size": 1024, "content_type": "discrete", "f0_condition": False,
                "n_f0_bins": 512, "content_codebooks": 1, "is_causal": False, "long_skip_connection": True,
                "zero_prompt_speech_token": False, "time_as_token": False, "style_as_token": False,
                "uvit_skip_connection": True, "add_resblock_in_transformer": False},
        "wavenet": {"hidden_dim": 512, "num_layers": 8, "kernel_size": 5, "dilation_rate": 1, "p_dropout": 0.2,
                    "style_condition": True},
    },
    "gpt_checkpoint": "gpt.pth", "w2v_stat": "wav2vec2bert_stats.pt", "s2mel_checkpoint": "s2mel.pth",
    "emo_matrix": "feat2.pt", "spk_matrix": "feat1.pt", "emo_num": EMO_NUM, "qwen_emo_path": "qwen0.6bemo4-merge/",
    "vocoder": {"type": "bigvgan", "name": "nvidia/bigvgan_v2_22khz_80band_256x"}, "version": 2.0,
}
BIGVGAN: dict[str, Any] = {
    "resblock": "1", "upsample_rates": [4, 4, 2, 2, 2, 2], "upsample_kernel_sizes": [8, 8, 4, 4, 4, 4],
    "upsample_initial_channel": 1536, "resblock_kernel_sizes": [3, 7, 11],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]], "use_tanh_at_final": False,
    "use_bias_at_final": False, "activation": "snakebeta", "snake_logscale": True, "num_mels": 80, "num_freq": 1025,
    "n_fft": 1024, "hop_size": 256, "win_size": 1024, "sampling_rate": 22050, "fmin": 0, "fmax": None,
}
W2V_BERT: dict[str, Any] = {"model_type": "wav2vec2-bert", "architectures": ["Wav2Vec2BertModel"]}
W2V_WIDTH, STYLE_DIM = 1024, 192
GPT_PROJECTION = ((256, GPT_DIM), (128, 256), (1024, 128))  # s2mel's gpt_layer: three Linears


def _shape_only(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A tensor of `shape` holding one element (what the loader reads of it is its shape)."""
    return torch.zeros((), dtype=dtype).expand(shape)


def _saved(make: Callable[[], Any]) -> Callable[[Path], None]:
    return lambda path: torch.save(make(), path)


def _campplus() -> dict[str, torch.Tensor]:
    model = build_on_meta(lambda: CAMPPlus(CAMPPlusSizes()))
    return {k: _shape_only(tuple(t.shape), t.dtype) for k, t in model.state_dict().items()}


def _s2mel() -> dict[str, Any]:
    layer = {}
    for i, (out, inp) in enumerate(GPT_PROJECTION):
        layer[f"{i}.weight"], layer[f"{i}.bias"] = _shape_only((out, inp)), _shape_only((out,))
    return {"net": {"cfm": {}, "length_regulator": {}, "gpt_layer": layer}}


_FILES: dict[str, FileContent] = {
    "config.yaml": CONFIG, "bpe.model": None,
    "gpt.pth": None, "s2mel.pth": _saved(_s2mel),
    "wav2vec2bert_stats.pt": _saved(lambda: {"mean": _shape_only((W2V_WIDTH,)), "var": _shape_only((W2V_WIDTH,))}),
    "feat1.pt": _saved(lambda: _shape_only((sum(EMO_NUM), STYLE_DIM))),
    "feat2.pt": _saved(lambda: _shape_only((sum(EMO_NUM), GPT_DIM))),
    f"{AUX}/{AUX_FILES['codec']}": None,
    f"{AUX}/{AUX_FILES['campplus']}": _saved(_campplus),
    f"{AUX}/{AUX_FILES['bigvgan']}/config.json": BIGVGAN,
    f"{AUX}/{AUX_FILES['bigvgan']}/bigvgan_generator.pt": None,
    f"{AUX}/{AUX_FILES['w2v_bert']}/config.json": W2V_BERT,
}

MODELS = (PublishedModel("indextts2", "IndexTTS-2", "IndexTeam/IndexTTS-2", _FILES, dtype=torch.float16),)
