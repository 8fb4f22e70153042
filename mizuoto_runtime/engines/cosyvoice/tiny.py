"""A tiny random CosyVoice 2 / 3 folder in the published layout (tests and demos; no download):

    cosyvoice2.yaml | cosyvoice3.yaml   llm.pt  flow.pt  hift.pt  spk2info.pt
    campplus.onnx  speech_tokenizer_v2.onnx | speech_tokenizer_v3.onnx
    CosyVoice-BlankEN/  config.json  generation_config.json  model.safetensors
                        vocab.json  merges.txt  tokenizer_config.json

The yaml has the published files' tags and keys (llm, flow, hift, feat_extractor,
get_tokenizer, the seeding ``!apply:`` lines) with small sizes. State dicts carry upstream's key
names, weight norm as ``parametrizations.weight.original0/1`` pairs; the Qwen2 backbone is in
``llm.pt`` (as upstream saves it) and in BlankEN's safetensors. The tokenizer is byte-level BPE
without merges (one token per byte) and Qwen2's three specials. ``spk2info.pt`` holds one
speaker, ``tiny``, saved as upstream's ``add_zero_shot_spk`` saves a voice (its embedding,
prompt text ids, prompt speech tokens and prompt mel). The two ONNX files are small graphs with
the published files' inputs and outputs (`write_voice_models`), so cloning runs too.
The LM's stop ids are made unlikely, so tests bound the length with ``max_new_tokens``.
"""
from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path

import torch

from ...nn import weight_norm
from ...nn.decoder import DecoderConfig
from ..tiny import byte_alphabet, fan_in_std, version_of, write_json
from .checkpoint import BLANK_EN, YAMLS, load_model
from .engine import SPK2INFO, CosyVoiceEngine
from .tokenizer import special_tokens

log = logging.getLogger(__name__)

EMBED_TOKENS, LM_HEAD = "llm.model.model.embed_tokens.weight", "llm.model.lm_head.weight"
SPEECH_TOKENS = 128
HIDDEN = 64
TEXT_VOCAB = {2: 320, 3: 832}
WEIGHT_NORMED = re.compile(r"^(conv_pre|conv_post|ups\.\d+|(source_)?resblocks\.\d+\.convs[12]\.\d+|"
                           r"f0_predictor\.condnet\.\d+)\.weight$")

_HEAD = """# {title}
__set_seed1: !apply:random.seed [1986]
__set_seed2: !apply:numpy.random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]
sample_rate: 24000
llm_input_size: {hidden}
llm_output_size: {hidden}
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: 25
num_decoding_left_chunks: -1
llm: !new:cosyvoice.llm.llm.{lm_class}
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: {speech}
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1
"""
_FLOW2 = """flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    input_size: {flow_width}
{common}    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
        output_size: {flow_width}
        attention_heads: {encoder_heads}
        linear_units: {encoder_units}
        num_blocks: {encoder_blocks}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: 'linear'
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        input_size: {flow_width}
        use_cnn_module: False
        macaron_style: False
        static_chunk_size: !ref <chunk_size>
{cfm}        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: 320
            out_channels: 80
            channels: [{unet_channels}]
            dropout: 0.0
            attention_head_dim: {unet_head_dim}
            n_blocks: {unet_blocks}
            num_mid_blocks: {unet_mid_blocks}
            num_heads: {unet_heads}
            act_fn: 'gelu'
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>
"""
_FLOW3 = """flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
{common}    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: {lookahead_channels}
        pre_lookahead_len: 3
{cfm}        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: {dit_dim}
            depth: {dit_depth}
            heads: {dit_heads}
            dim_head: {dit_head_dim}
            ff_mult: 2
            mel_dim: 80
            mu_dim: 80
            spk_dim: 80
            out_channels: 80
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>
"""
_FLOW_COMMON = """    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {speech}
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
"""
_CFM = """    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
"""
_TAIL = """hift: !new:cosyvoice.hifigan.generator.{hift_class}
    in_channels: 80
    base_channels: {hift_channels}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99{look_right}
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.{f0_class}
        num_class: 1
        in_channels: 80
        cond_channels: {f0_channels}
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: {fmax}
    center: False
get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>
    skip_special_tokens: True{tok_version}
allowed_special: 'all'
"""


# The sizes of the yaml's models (`model_yaml`): the tiny checkpoint's; `published` has the
# published ones.
TINY_SIZES: dict[str, int] = dict(
    hidden=HIDDEN, speech=SPEECH_TOKENS, flow_width=64, encoder_heads=4, encoder_units=96, encoder_blocks=2,
    unet_channels=64, unet_head_dim=16, unet_blocks=1, unet_mid_blocks=2, unet_heads=4, lookahead_channels=64,
    dit_dim=64, dit_depth=4, dit_heads=4, dit_head_dim=16, hift_channels=64, f0_channels=32,
)


def model_yaml(version: int, sizes: dict[str, int] | None = None,
               title: str = "tiny random CosyVoice {version} (Mizuoto tests); the published file's tags and keys, "
                            "small sizes") -> str:
    """The model yaml of CosyVoice `version` with the models of `sizes` (None: `TINY_SIZES`)."""
    v3 = version == 3
    sizes = TINY_SIZES if sizes is None else sizes
    return (_HEAD.format(title=title.format(version=version), lm_class="CosyVoice3LM" if v3 else "Qwen2LM", **sizes)
            + (_FLOW3 if v3 else _FLOW2).format(common=_FLOW_COMMON.format(**sizes), cfm=_CFM, **sizes)
            + _TAIL.format(hift_class="CausalHiFTGenerator" if v3 else "HiFTGenerator",
                           f0_class="CausalConvRNNF0Predictor" if v3 else "ConvRNNF0Predictor",
                           look_right="\n    conv_pre_look_right: 4" if v3 else "",
                           fmax="null" if v3 else 8000, tok_version="\n    version: cosyvoice3" if v3 else "",
                           **sizes))


def write_text_tokenizer(folder: Path) -> int:
    """BlankEN's byte-level tokenizer files (one token per byte, Qwen2's three specials after
    them); returns how many ids it has before CosyVoice's own special tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    alphabet = byte_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    specials = {t: len(vocab) + i for i, t in enumerate(("<|endoftext|>", "<|im_start|>", "<|im_end|>"))}
    write_json(folder / "vocab.json", vocab)
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    write_json(folder / "tokenizer_config.json", {
        "add_prefix_space": False,
        "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for t, i in specials.items()},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>", "errors": "replace",
        "model_max_length": 32768, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})
    return len(vocab) + len(specials)


def blank_en_config(version: int) -> dict[str, object]:
    """The tiny backbone's ``CosyVoice-BlankEN/config.json`` (Qwen2's keys, small sizes)."""
    return {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 256, "eos_token_id": 256,
        "hidden_act": "silu", "hidden_size": HIDDEN, "initializer_range": 0.02, "intermediate_size": 128,
        "max_position_embeddings": 32768, "max_window_layers": 2, "model_type": "qwen2", "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "use_cache": True, "use_sliding_window": False, "vocab_size": TEXT_VOCAB[version]}


def write_blank_en(folder: Path, version: int, state: dict[str, torch.Tensor]) -> None:
    """Config, byte-level tokenizer and the backbone weights (bf16, as published)."""
    from safetensors.torch import save_file

    if write_text_tokenizer(folder) + len(special_tokens(version)) > TEXT_VOCAB[version]:
        raise ValueError("tiny tokenizer does not fit the text embedding")
    write_json(folder / "config.json", blank_en_config(version))
    write_json(folder / "generation_config.json", {"bos_token_id": 256, "eos_token_id": 256})
    backbone = {k[len("llm.model."):]: v.to(torch.bfloat16).contiguous() for k, v in state.items()
                if k.startswith("llm.model.model.")}
    backbone["lm_head.weight"] = backbone["model.embed_tokens.weight"].clone()
    save_file(backbone, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _randomize(module: torch.nn.Module, generator: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight") or "norm" in name and p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=generator))
            elif p.dim() == 1:
                p.copy_(0.05 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(fan_in_std(p) * torch.randn(p.shape, generator=generator))


def hift_stored(key: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
    """How ``hift.pt`` stores HiFT's tensor `key`: a weight-normed conv's weight as upstream's
    parametrization pair (g = per-row norm, v = weight), any other tensor as it is."""
    return weight_norm.unfold(key, value) if WEIGHT_NORMED.match(key) else {key: value}


def write_voice_models(folder: Path, version: int, generator: torch.Generator) -> None:
    """Small ``campplus.onnx`` and speech tokenizer ONNX files with random initializers, the
    published files' inputs and outputs: CAM++ (fbank ``(1, T, 80)`` -> mean over time ->
    linear -> ``(1, 192)``) and a tokenizer (128-bin mel ``(1, 128, T)`` and its length -> a
    stride-4 conv -> argmax -> ``(1, T / 4)`` ids, 25 Hz like the real one)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def save(nodes: list, inputs: list, outputs: list, inits: dict[str, torch.Tensor], name: str) -> None:
        graph = helper.make_graph(nodes, name, inputs, outputs,
                                  [numpy_helper.from_array(t.numpy(), k) for k, t in inits.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        onnx.checker.check_model(model)
        onnx.save(model, str(folder / name))

    save([helper.make_node("ReduceMean", ["input"], ["pooled"], axes=[1], keepdims=0),
          helper.make_node("MatMul", ["pooled", "w"], ["proj"]), helper.make_node("Add", ["proj", "b"], ["output"])],
         [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "T", 80])],
         [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 192])],
         {"w": torch.randn(80, 192, generator=generator) * 0.1, "b": torch.randn(192, generator=generator) * 0.1},
         "campplus.onnx")
    save([helper.make_node("Conv", ["feats", "w"], ["scores"], kernel_shape=[4], strides=[4]),
          helper.make_node("ArgMax", ["scores"], ["indices"], axis=1, keepdims=0)],
         [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "T"]),
          helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1])],
         [helper.make_tensor_value_info("indices", TensorProto.INT64, [1, "N"])],
         {"w": torch.randn(SPEECH_TOKENS, 128, 4, generator=generator) * 0.1},
         f"speech_tokenizer_v{version}.onnx")


def write(directory: str | Path, *, version: str | None = None, seed: int = 0,
          dtype: torch.dtype | None = None) -> Path:
    """Write the folder of CosyVoice `version` (``2`` or ``3``; None: ``2``); `dtype` must be
    float32 or None (upstream's state_dicts are float32)."""
    if dtype not in (None, torch.float32):
        raise ValueError("cosyvoice tiny checkpoint: the published state_dicts are float32")
    return _write(Path(directory), int(version_of(version, CosyVoiceEngine.VERSIONS)), seed)


def _write(out: Path, version: int, seed: int) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / YAMLS[version]).write_text(model_yaml(version), encoding="utf-8")
    generator = torch.Generator().manual_seed(seed)
    # Build the modules from the yaml with our own loader's builders, then fill them at random.
    from .checkpoint import _hift_factory, build_flow, lm_spec
    from .config import ModelConfig
    from .lm import CosyVoiceLM

    blank = out / BLANK_EN
    config = DecoderConfig(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=128, vocab_size=TEXT_VOCAB[version], rope_theta=1e6)
    write_blank_en(blank, version, {EMBED_TOKENS: torch.zeros(TEXT_VOCAB[version], HIDDEN)})
    cfg = ModelConfig.read(out / YAMLS[version], {"qwen_pretrain_path": str(blank)})
    lm = CosyVoiceLM(lm_spec(cfg, blank))
    assert lm.spec.decoder == config
    flow, hift = build_flow(cfg), _hift_factory(cfg)()
    for module in (lm, flow, hift):
        _randomize(module, generator)
    with torch.no_grad():  # stop ids unlikely: tests bound the length with max_new_tokens
        lm.llm_decoder.weight[SPEECH_TOKENS:].mul_(0.0)
        if lm.llm_decoder.bias is not None:
            lm.llm_decoder.bias[SPEECH_TOKENS:].fill_(-4.0)
            lm.llm_decoder.bias[SPEECH_TOKENS].fill_(1.0)
        else:  # CosyVoice 3: no bias; sharper speech rows, so a stop id is rarely drawn
            lm.llm_decoder.weight[:SPEECH_TOKENS].mul_(3.0)
    llm_state = {k: v.contiguous() for k, v in lm.state_dict().items()}
    llm_state[LM_HEAD] = llm_state[EMBED_TOKENS]  # upstream saves the tied head too (one storage)
    torch.save(llm_state, out / "llm.pt")
    torch.save(flow.state_dict(), out / "flow.pt")
    torch.save({k: v for key, value in hift.state_dict().items() for k, v in hift_stored(key, value).items()},
               out / "hift.pt")
    write_blank_en(blank, version, llm_state)
    tokens = torch.randint(0, SPEECH_TOKENS, (1, 12), generator=generator, dtype=torch.int32)
    torch.save({"tiny": {
        "flow_embedding": torch.randn(1, 192, generator=generator),
        "prompt_text": torch.tensor([list(b"a tiny voice.")], dtype=torch.int32),
        "llm_prompt_speech_token": tokens, "flow_prompt_speech_token": tokens,
        "prompt_speech_feat": torch.randn(1, 24, 80, generator=generator) - 4.0,
    }}, out / SPK2INFO)
    if importlib.util.find_spec("onnx") is not None:
        write_voice_models(out, version, generator)
    else:
        log.warning("cosyvoice tiny checkpoint: onnx is not installed, so no campplus/speech tokenizer files "
                    "(its speakers work; cloning from audio does not)")
    load_model(out)  # the folder loads with the engine's own loader
    return out
