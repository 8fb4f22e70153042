"""qwen-tts 0.1.1 (written for transformers 4.57.3) on the transformers installed (issue 11 item
3, issue 14 item 1): each adaptation of `qwen3tts.compat`, and the published tensor names.

The proof that nothing changes a result is the Qwen3-TTS suite itself, run on transformers 5.x
(tests/engines/test_qwen3tts.py: every mode equals the package's own one-call API, and the M57
placements). Checked by hand against transformers 4.57.3 with the same tiny checkpoints: codes
and audio bit-identical in all four voice modes, plain and streamed.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from mizuoto_runtime.engines.qwen3tts import compat

from conftest import require_qwen_tts

require_qwen_tts()

# Published Qwen3-TTS speech-tokenizer names (Qwen/Qwen3-TTS-Tokenizer-12Hz, saved by 4.57).
PUBLISHED = ("encoder.encoder.layers.0.conv.weight", "encoder.encoder_transformer.layers.0.mlp.fc1.weight",
             "encoder.downsample.conv.weight",
             "encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codebook.embed_sum",
             "decoder.pre_transformer.layers.0.self_attn.q_proj.weight")


def test_the_speech_tokenizer_file_uses_the_published_names(qwen3tts_checkpoint: Callable[[str], Path]) -> None:
    from safetensors import safe_open

    with safe_open(str(qwen3tts_checkpoint("base") / "speech_tokenizer" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert set(PUBLISHED) <= keys
    assert not any(".encoder_seanet." in k or k.startswith("encoder.encoder.encoder_") for k in keys)


def test_codec_names_map_both_ways() -> None:
    for name in PUBLISHED:
        assert compat.codec_key(compat.codec_module_name(name)) == name
    if compat.needed():
        assert compat.codec_module_name("encoder.encoder.layers.0.conv.weight") == \
            "encoder.encoder.encoder_seanet.layers.0.conv.weight"
        assert compat.codec_module_name("encoder.downsample.conv.weight") == "encoder.encoder.downsample.conv.weight"
    else:
        assert all(compat.codec_module_name(n) == n for n in PUBLISHED)


def test_a_loaded_engine_holds_no_uninitialized_buffer(qwen3tts_checkpoint: Callable[[str], Path]) -> None:
    """Rotary frequencies are computed, never left as memory: ours and the package's own
    `from_pretrained` (5.x leaves non-persistent buffers to `_init_weights`) agree."""
    from qwen_tts import Qwen3TTSModel

    from mizuoto_runtime import Runtime

    folder = qwen3tts_checkpoint("base")
    ours = Runtime().engine("qwen3tts", folder).tts.model
    theirs = Qwen3TTSModel.from_pretrained(str(folder)).model
    for a, b in ((ours, theirs), (ours.speech_tokenizer.model, theirs.speech_tokenizer.model)):
        mine, upstream = dict(a.named_buffers()), dict(b.named_buffers())
        for name, value in mine.items():
            if name.endswith("inv_freq"):
                assert torch.isfinite(value).all() and value.max() == 1.0, name  # 1 / theta^0 first
                assert torch.equal(value, upstream[name]), name


@pytest.mark.skipif(not compat.needed(), reason="transformers 4.x: qwen-tts runs as published")
def test_the_adaptations_stay_inside_the_package() -> None:
    """transformers itself is left as it was: the 4.57 APIs are given to qwen_tts's modules only."""
    import transformers.utils.generic as generic
    from qwen_tts.core.models import modeling_qwen3_tts
    from transformers import modeling_rope_utils

    compat.install()  # idempotent
    assert generic.check_model_inputs is not compat.check_model_inputs
    assert "default" not in modeling_rope_utils.ROPE_INIT_FUNCTIONS
    assert modeling_qwen3_tts.ROPE_INIT_FUNCTIONS["default"] is compat.default_rope_parameters
    assert modeling_qwen3_tts.create_causal_mask.__wrapped__ is not None  # the 4.57 keywords, translated


def test_default_rope_is_the_4_57_formula() -> None:
    class Config:
        rope_theta = 10000.0
        head_dim = 8
        hidden_size = 32
        num_attention_heads = 4

    inv_freq, scale = compat.default_rope_parameters(Config())
    assert scale == 1.0
    assert torch.equal(inv_freq, 1.0 / (10000.0 ** (torch.tensor([0, 2, 4, 6], dtype=torch.float) / 8)))


def test_check_model_inputs_works_as_factory_and_as_decorator() -> None:
    if not compat.needed():
        pytest.skip("transformers 4.x has its own")

    class Model(torch.nn.Module):
        class config:  # noqa: N801 - what transformers' decorators read
            use_cache = False
            return_dict = True

        def forward(self, x: torch.Tensor, use_cache: bool | None = None) -> tuple[torch.Tensor, bool | None]:
            return x + 1, use_cache

    for decorate in (compat.check_model_inputs(), compat.check_model_inputs):
        forward = decorate(Model.forward)
        out, use_cache = forward(Model(), torch.zeros(1))
        assert out.item() == 1 and use_cache is False  # the config's default filled in
