"""Tiny random CSM checkpoints in the published layout, for tests and demos (issue 34).

`write(dir)` writes the files of ``sesame/csm-1b`` (transformers layout)::

    config.json  generation_config.json  model.safetensors.index.json  model-0000{1,2}-of-00002.safetensors
    tokenizer.json  tokenizer_config.json  chat_template.jinja  processor_config.json

Built through transformers' own classes (`CsmForConditionalGeneration` with its Mimi codec,
`CsmProcessor`, `EncodecFeatureExtractor`), saved by their own ``save_pretrained``, weights drawn
from a seeded generator: byte-identical files on every run, at any thread count. Geometry: the
real frame rate and ids (2051 audio ids, Mimi's 24 kHz at 12.5 Hz) with 8 codebooks (real: 32;
the depth decoder then runs 7 steps a frame, not 31) and tiny widths; each backbone layer (4)
and each depth-decoder layer (2) is a 1.2 MB unit in float32: the M57 placements really stream,
and the units outweigh the fixed part (the 8 x 2051 audio embeddings and the depth decoder's
heads), as in the real model.
The tiny Mimi has 4096 codebook entries (real: 2048; it takes only powers of two) so that every
audio id the random talker samples (up to 2050) decodes. The text tokenizer is byte-level with CSM's
special tokens; the chat template renders a turn as CSM's does:
``<|begin_of_text|>[speaker]text<|end_of_text|>`` and, for a turn with audio,
``<|AUDIO|><|audio_eos|>`` (the processor expands the audio token to the audio's frames).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from ...nn.dtypes import DTYPE_NAMES, parse_dtype
from ..tiny import one_version, randomize_normed, save_shards, scale_output
from .config import SAMPLE_RATE

log = logging.getLogger(__name__)

SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>", "<|AUDIO|>", "<|audio_eos|>")  # ids 256..259 after the bytes
BOS, EOS, AUDIO, AUDIO_EOS = 256, 257, 258, 259
CODEBOOKS = 8  # real: 32; every CSM and Mimi part reads the count from the config
MIMI: dict[str, Any] = {  # real: 512 wide, 64 filters, 8 transformer layers, codebooks 2048 x 256
    "hidden_size": 64, "num_filters": 8, "upsampling_ratios": [8, 6, 5, 4], "codebook_size": 4096,
    "codebook_dim": 8, "num_quantizers": CODEBOOKS, "vector_quantization_hidden_dimension": 8, "upsample_groups": 64,
    "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
    "head_dim": 32, "sliding_window": 250, "max_position_embeddings": 8000, "sampling_rate": SAMPLE_RATE,
}
DEPTH: dict[str, Any] = {  # real: 4 layers, 1024 wide
    "num_codebooks": CODEBOOKS, "backbone_hidden_size": 64, "vocab_size": 2051, "hidden_size": 32,
    "intermediate_size": 3072, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 16, "max_position_embeddings": CODEBOOKS + 1,
}
BACKBONE: dict[str, Any] = {  # real: Llama 1B (2048 wide, 16 layers, 128256 text tokens)
    "num_codebooks": CODEBOOKS, "vocab_size": 2051, "text_vocab_size": 264, "hidden_size": 64,
    "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048, "pad_token_id": AUDIO, "bos_token_id": BOS, "audio_token_id": AUDIO,
    "audio_eos_token_id": AUDIO_EOS, "codebook_pad_token_id": 2050, "codebook_eos_token_id": 0,
}
# sesame/csm-1b's generation_config.json: sampling for the backbone and the depth decoder.
GENERATION: dict[str, Any] = {"do_sample": True, "temperature": 0.9, "top_k": 50,
                              "depth_decoder_do_sample": True, "depth_decoder_temperature": 0.9,
                              "depth_decoder_top_k": 50}
CHAT_TEMPLATE = ("{%- for message in messages %}{{- bos_token }}{{- '[' + message['role'] + ']' }}"
                 "{{- message['content'][0]['text'] }}{{- eos_token }}"
                 "{%- if message['content']|length > 1 %}{{- '<|AUDIO|><|audio_eos|>' }}{%- endif %}{%- endfor %}")


def text_tokenizer() -> Any:
    """A byte-level BPE (no merges: one token per byte) with CSM's special tokens at 256..259."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    core = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(sorted(alphabet))}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=SPECIAL[0], eos_token=SPECIAL[1])
    fast.add_special_tokens({"additional_special_tokens": list(SPECIAL[2:])})
    fast.pad_token = SPECIAL[2]  # as in sesame/csm-1b: the audio token pads
    if fast.convert_tokens_to_ids(list(SPECIAL)) != [BOS, EOS, AUDIO, AUDIO_EOS]:
        raise ValueError("tiny CSM tokenizer: special tokens are not at the ids the config names")
    return fast


def processor() -> Any:
    """`CsmProcessor` over the byte-level tokenizer, CSM's feature extractor and chat template."""
    from transformers import CsmProcessor, EncodecFeatureExtractor

    return CsmProcessor(EncodecFeatureExtractor(feature_size=1, sampling_rate=SAMPLE_RATE), text_tokenizer(),
                        chat_template=CHAT_TEMPLATE)


def write(directory: str | Path, *, version: str | None = None, seed: int = 0,
          dtype: torch.dtype | None = None) -> Path:
    """Write a tiny random CSM folder; `dtype` is that of the backbone and depth decoder (None:
    float32; the codec is float32, as published)."""
    one_version(version)
    dtype = parse_dtype(torch.float32 if dtype is None else dtype, "tiny checkpoint dtype")
    from transformers import CsmConfig, CsmForConditionalGeneration, GenerationConfig

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    config = CsmConfig(**BACKBONE, depth_decoder_config=dict(DEPTH), codec_config=dict(MIMI))
    config.architectures = ["CsmForConditionalGeneration"]
    config.dtype = DTYPE_NAMES[dtype]
    config.save_pretrained(str(out))
    GenerationConfig(**GENERATION).save_pretrained(str(out))
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # upstream's own init draws from the global RNG; overwritten below
        model = CsmForConditionalGeneration(config).eval()
    randomize_normed(model, gen)
    codec = model.codec_model
    codes = torch.randint(0, 2048, (1, CODEBOOKS, 6), generator=gen)
    last = codec.decoder.decoder_seanet.layers[-1].conv
    scale_output(last, lambda: codec.decode(codes), tuple(last.parameters()))
    state = {k: (v.to(dtype) if v.is_floating_point() and not k.startswith("codec_model.") else v).contiguous().clone()
             for k, v in model.state_dict().items()}
    for name in save_shards(state, out, shards=2):
        os.chmod(out / name, 0o644)
    processor().save_pretrained(str(out))
    log.info("wrote tiny CSM checkpoint to %s (%d parameters, the codec's among them)", out,
             sum(p.numel() for p in model.parameters()))
    return out
