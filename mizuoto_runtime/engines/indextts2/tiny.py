"""A tiny random IndexTTS-2 checkpoint in the published layout (tests, demos; no download):
config.yaml, gpt.pth, s2mel.pth ({"net": ...}), bpe.model, feat1.pt, feat2.pt,
wav2vec2bert_stats.pt, qwen0.6bemo4-merge/ (a tiny Qwen3 emotion model) and hf_cache/ with
w2v-BERT (18 layers of width 32: one more than the engine keeps), the semantic codec, CAM++ and
BigVGAN. Weight-normed layers are stored as weight_g / weight_v, as the real files.
Every GPT-2 block and DiT block is above the runtime's 64 KB unit floor, so they stream.
"""
from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from ...nn import weight_norm
from ..tiny import fan_in_std, one_version, write_json
from .bigvgan import BigVGAN
from .campplus import CAMPPlus
from .config import BigVGANConfig, CAMPPlusSizes, CodecConfig, GPTConfig
from .s2mel import S2Mel
from .semantic_codec import SemanticCodec
from .unified_voice import UnifiedVoice

WIDTH = 32  # w2v-BERT's width here (1024 in the real model)
EMO_NUM = [1, 2, 1, 1, 1, 1, 2, 1]
WORDS = ("hello tiny model this is a test of the voice streaming exact every step and one two three "
         "reference sentence speak quickly now today we go home")
WEIGHT_NORMED = {
    "s2mel": re.compile(r"^cfm\.estimator\.(x_embedder|final_layer\.linear|wavenet\..*\.conv\.conv)\.weight$"),
    "codec": re.compile(r"^quantizer\.quantizers\.0\.(in_project|out_project)\.weight$"),
    "bigvgan": re.compile(r"^(conv_pre|conv_post|ups\.\d+\.0|resblocks\.\d+\.convs[12]\.\d+)\.weight$"),
}


def config(vocab: int) -> dict[str, Any]:
    return {
        "dataset": {"bpe_model": "bpe.model", "sample_rate": 24000, "squeeze": False},
        "gpt": {"model_dim": 64, "max_mel_tokens": 100, "max_text_tokens": 40, "heads": 4,
                "use_mel_codes_as_input": True, "mel_length_compression": 1024, "layers": 3,
                "number_text_tokens": vocab, "number_mel_codes": 66, "start_mel_token": 64, "stop_mel_token": 65,
                "start_text_token": 0, "stop_text_token": 1, "train_solo_embeddings": False,
                "condition_type": "conformer_perceiver",
                "condition_module": {"output_size": 16, "linear_units": 48, "attention_heads": 2, "num_blocks": 2,
                                     "input_layer": "conv2d2", "perceiver_mult": 2},
                "emo_condition_module": {"output_size": 8, "linear_units": 32, "attention_heads": 1, "num_blocks": 2,
                                         "input_layer": "conv2d2", "perceiver_mult": 0.03125}},
        "semantic_codec": {"codebook_size": 64, "hidden_size": WIDTH, "codebook_dim": 8, "vocos_dim": 16,
                           "vocos_intermediate_dim": 32, "vocos_num_layers": 2},
        "s2mel": {
            "preprocess_params": {"sr": 22050, "spect_params": {"n_fft": 1024, "win_length": 1024, "hop_length": 256,
                                                                "n_mels": 80, "fmin": 0, "fmax": "None"}},
            "dit_type": "DiT", "reg_loss_type": "l1", "style_encoder": {"dim": 192},
            "length_regulator": {"channels": 64, "is_discrete": False, "in_channels": WIDTH,
                                 "content_codebook_size": 16, "sampling_ratios": [1, 1, 1, 1],
                                 "vector_quantize": False, "n_codebooks": 1,
                                 "quantizer_dropout": 0.0, "f0_condition": False, "n_f0_bins": 512},
            "DiT": {"hidden_dim": 64, "num_heads": 4, "depth": 3, "class_dropout_prob": 0.1, "block_size": 8192,
                    "in_channels": 80, "style_condition": True, "final_layer_type": "wavenet", "target": "mel",
                    "content_dim": 64, "content_codebook_size": 16, "content_type": "discrete", "f0_condition": False,
                    "n_f0_bins": 512, "content_codebooks": 1, "is_causal": False, "long_skip_connection": True,
                    "zero_prompt_speech_token": False, "time_as_token": False, "style_as_token": False,
                    "uvit_skip_connection": True, "add_resblock_in_transformer": False},
            "wavenet": {"hidden_dim": 64, "num_layers": 2, "kernel_size": 5, "dilation_rate": 1, "p_dropout": 0.2,
                        "style_condition": True}},
        "gpt_checkpoint": "gpt.pth", "w2v_stat": "wav2vec2bert_stats.pt", "s2mel_checkpoint": "s2mel.pth",
        "emo_matrix": "feat2.pt", "spk_matrix": "feat1.pt", "emo_num": EMO_NUM,
        "qwen_emo_path": "qwen0.6bemo4-merge/",
        "vocoder": {"type": "bigvgan", "name": "nvidia/bigvgan_v2_22khz_80band_256x"}, "version": 2.0,
    }


BIGVGAN = {"resblock": "1", "upsample_rates": [4, 4, 2, 2, 2, 2], "upsample_kernel_sizes": [8, 8, 4, 4, 4, 4],
           "upsample_initial_channel": 64, "resblock_kernel_sizes": [3, 7, 11],
           "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]], "use_tanh_at_final": False,
           "use_bias_at_final": False, "activation": "snakebeta", "snake_logscale": True, "num_mels": 80,
           "n_fft": 1024, "hop_size": 256, "win_size": 1024, "sampling_rate": 22050, "fmin": 0, "fmax": None}


KEPT_AS_BUILT = ("norm.weight", "norm.bias", "norm_final.weight", "ln_1.weight", "ln_2.weight", "ln_f.weight", "gamma")


def kept_as_built(module: nn.Module, name: str) -> bool:
    """Whether parameter `name` keeps the constant it is built with (a norm's ones and zeros):
    the names above, and the parameters of a LayerNorm named `norm...` (the GPT-2 blocks' ln_1 /
    ln_2 biases are drawn). Decided by the layer that owns it, not by a `.norm` anywhere in its
    path: the DiT's `transformer.norm.project_layer` is a Linear, whose bias nn.Linear would
    otherwise leave as drawn from the unseeded global RNG."""
    owner = module.get_submodule(name.rpartition(".")[0])
    return name.endswith(KEPT_AS_BUILT) or ".norm" in name and isinstance(owner, nn.LayerNorm)


@torch.no_grad()
def randomize(module: nn.Module, gen: torch.Generator) -> None:
    """Seeded weights at fan-in scale; norms stay at one and zero, as built."""
    for name, p in module.named_parameters():
        if kept_as_built(module, name):
            continue
        std = fan_in_std(p) if p.ndim >= 2 else 0.02
        p.copy_(torch.randn(p.shape, generator=gen) * std)


def lowpass(taps: int = 12, cutoff: float = 0.25, half_width: float = 0.3) -> torch.Tensor:
    """The Kaiser-windowed sinc of BigVGAN's 2x resamplers (its stored `filter` buffers)."""
    half = taps // 2
    a = 2.285 * (half - 1) * math.pi * 4 * half_width + 7.95
    beta = 0.1102 * (a - 8.7) if a > 50 else (0.5842 * (a - 21) ** 0.4 + 0.07886 * (a - 21) if a >= 21 else 0.0)
    window = torch.kaiser_window(taps, beta=beta, periodic=False)
    time = torch.arange(-half, half) + 0.5
    f = 2 * cutoff * window * torch.sinc(2 * cutoff * time)
    return (f / f.sum()).view(1, 1, taps)


def weight_normed(state: dict[str, torch.Tensor], pattern: re.Pattern[str]) -> dict[str, torch.Tensor]:
    """Plain weights of the layers `pattern` names as the weight_g / weight_v pairs they are stored as."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        pairs = weight_norm.unfold(key, value, legacy=True) if pattern.match(key) else {key: value}
        out.update({k: v.clone() for k, v in pairs.items()})
    return out


def write_tokenizer(out: Path, vocab: int) -> None:
    """bpe.model, the same bytes wherever it is written: SentencePiece records its training
    options in the model, the corpus file's and the output's paths among them, so the corpus
    goes in as an iterator and the model comes back as bytes; one thread, which it records too."""
    import sentencepiece as spm

    lines = [w.upper() for w in WORDS.split()] + [WORDS.upper()] * 3 + [". , ! ? ' -"]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab,
                                   model_type="bpe", character_coverage=1.0, bos_id=-1, eos_id=-1, unk_id=2,
                                   user_defined_symbols=[], hard_vocab_limit=False, minloglevel=2, num_threads=1)
    (out / "bpe.model").write_bytes(model.getvalue())


def write_w2v_bert(folder: Path, seed: int) -> None:
    from transformers import SeamlessM4TFeatureExtractor, Wav2Vec2BertConfig, Wav2Vec2BertModel

    torch.manual_seed(seed)
    cfg = Wav2Vec2BertConfig(hidden_size=WIDTH, num_hidden_layers=18, num_attention_heads=2, intermediate_size=64,
                             output_hidden_size=WIDTH, conv_depthwise_kernel_size=3, left_max_position_embeddings=16,
                             right_max_position_embeddings=4)
    Wav2Vec2BertModel(cfg).eval().save_pretrained(str(folder), safe_serialization=True)
    SeamlessM4TFeatureExtractor().save_pretrained(str(folder))


def write(directory: str | Path, *, version: str | None = None, seed: int = 0,
          dtype: str | torch.dtype | None = None) -> Path:
    """Write a tiny random IndexTTS-2 folder; `dtype` must be float32 or None, as the published
    files are."""
    one_version(version)
    if dtype not in (None, "float32", torch.float32):
        raise ValueError("the tiny IndexTTS-2 checkpoint is float32, as the published files")
    out = Path(directory)
    (out / "hf_cache" / "bigvgan").mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    vocab = 100
    write_tokenizer(out, vocab)
    cfg = config(vocab)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")

    gpt = UnifiedVoice(GPTConfig.from_yaml(cfg["gpt"]), WIDTH)
    randomize(gpt, gen)
    with torch.no_grad():
        gpt.mel_head.bias[cfg["gpt"]["stop_mel_token"]] -= 2.0  # sampled codes run for a while
        gpt.mel_head.bias[cfg["gpt"]["start_mel_token"]] -= 30.0  # as a trained model, never predicts start
    torch.save(gpt.state_dict(), out / "gpt.pth")

    gpt_layer = nn.Sequential(nn.Linear(64, 256), nn.Linear(256, 128), nn.Linear(128, WIDTH))
    s2mel = S2Mel(cfg["s2mel"], gpt_layer)
    randomize(s2mel, gen)
    state = weight_normed(s2mel.state_dict(), WEIGHT_NORMED["s2mel"])
    net = {part: {k[len(part) + 1:]: v for k, v in state.items() if k.startswith(part + ".")}
           for part in ("cfm", "length_regulator", "gpt_layer")}
    torch.save({"net": net}, out / "s2mel.pth")

    from safetensors.torch import save_file

    codec = SemanticCodec(CodecConfig.from_yaml(cfg["semantic_codec"]))
    randomize(codec, gen)
    save_file(weight_normed(codec.state_dict(), WEIGHT_NORMED["codec"]),
              str(out / "hf_cache" / "semantic_codec_model.safetensors"))

    campplus = CAMPPlus(CAMPPlusSizes(growth_rate=8, bn_size=2, init_channels=32))
    randomize(campplus, gen)
    torch.save(campplus.state_dict(), out / "hf_cache" / "campplus_cn_common.bin")

    write_json(out / "hf_cache" / "bigvgan" / "config.json", BIGVGAN)
    bigvgan = BigVGAN(BigVGANConfig.read(out / "hf_cache" / "bigvgan" / "config.json"))
    randomize(bigvgan, gen)
    with torch.no_grad():
        for name, buf in bigvgan.named_buffers():
            if name.endswith("filter"):
                buf.copy_(lowpass())
        bigvgan.conv_post.weight.mul_(0.1)
    torch.save({"generator": weight_normed(bigvgan.state_dict(), WEIGHT_NORMED["bigvgan"])},
               out / "hf_cache" / "bigvgan" / "bigvgan_generator.pt")

    rows = sum(EMO_NUM)
    torch.save(torch.randn(rows, 192, generator=gen), out / "feat1.pt")
    torch.save(torch.randn(rows, 64, generator=gen), out / "feat2.pt")
    torch.save({"mean": torch.randn(WIDTH, generator=gen) * 0.1, "var": torch.rand(WIDTH, generator=gen) + 0.5},
               out / "wav2vec2bert_stats.pt")
    write_w2v_bert(out / "hf_cache" / "w2v-bert-2.0", seed)
    write_emotion_model(out / "qwen0.6bemo4-merge", seed)
    return out


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
                 "not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


def write_emotion_model(folder: Path, seed: int) -> None:
    """A tiny Qwen3 causal LM with a byte-level BPE tokenizer and a Qwen-style chat template (its
    answers are random; the engine's parser then falls back to calm)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ['{"高兴": 0.5, "悲伤": 0.2, "自然": 1.0}', "文本情感分类", WORDS, "system user assistant"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(cfg).eval()
    # sampling as Qwen3's published generation config; the tokenizer class named as Qwen's
    model.generation_config.update(do_sample=True, temperature=0.6, top_k=20, top_p=0.95)
    model.save_pretrained(str(folder), safe_serialization=True)
    settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    settings.pop("backend", None)
    write_json(folder / "tokenizer_config.json", {**settings, "tokenizer_class": "Qwen2Tokenizer"})
