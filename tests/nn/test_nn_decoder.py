"""mizuoto_runtime.nn decoder, rotary, RMSNorm and caches against transformers' Qwen2/Qwen3
(issue 22): same hidden states for a prefill and for cached single steps; the static
BufferCache (M53) gives the same numbers as the growing cache."""
from __future__ import annotations

import pytest
import torch

from mizuoto_runtime.nn.decoder import DecoderConfig, DecoderModel, KVCache, repeat_kv
from mizuoto_runtime.nn.kv_cache import BufferCache

transformers = pytest.importorskip("transformers")

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, vocab_size=50, rms_norm_eps=1e-6, max_position_embeddings=256)


def _pair(kind: str) -> tuple[torch.nn.Module, DecoderModel]:
    torch.manual_seed(0)
    if kind == "qwen2":
        config = transformers.Qwen2Config(**TINY, rope_theta=1e6)
        ref = transformers.Qwen2Model(config)
    else:
        config = transformers.Qwen3Config(**TINY, head_dim=16, rope_theta=1e6)
        ref = transformers.Qwen3Model(config)
    config._attn_implementation = "sdpa"
    with torch.no_grad():
        for p in ref.parameters():  # norms away from 1 so qk-norm and RMSNorm weights count
            p.add_(torch.randn_like(p) * 0.1)
    ref.eval()
    ours = DecoderModel(DecoderConfig.from_hf(config.to_dict()))
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref.eval(), ours.eval()


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_prefill_and_steps_match_transformers(kind: str) -> None:
    torch.set_num_threads(1)
    ref, ours = _pair(kind)
    x = torch.randn(1, 9, 64)
    steps = [torch.randn(1, 1, 64) for _ in range(3)]
    with torch.no_grad():
        out = ref(inputs_embeds=x, use_cache=True)
        cache_ref = out.past_key_values
        hidden_ref = [out.last_hidden_state]
        for s in steps:
            out = ref(inputs_embeds=s, past_key_values=cache_ref, use_cache=True)
            hidden_ref.append(out.last_hidden_state)
        for cache in (KVCache(), BufferCache(min_capacity=4)):
            hidden = [ours(x, cache)] + [ours(s, cache) for s in steps]
            for got, want in zip(hidden, hidden_ref):
                torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
            assert cache.get_seq_length(0) == 12


def test_buffer_cache_equals_growing_cache() -> None:
    _, ours = _pair("qwen2")
    x = torch.randn(1, 5, 64)
    steps = [torch.randn(1, 1, 64) for _ in range(6)]
    with torch.no_grad():
        a, b = KVCache(), BufferCache(min_capacity=2)
        outs_a = [ours(x, a)] + [ours(s, a) for s in steps]
        outs_b = [ours(x, b)] + [ours(s, b) for s in steps]
    for u, v in zip(outs_a, outs_b):
        assert torch.equal(u, v)
    assert b.capacity == 16


def test_chunk_after_cache_is_causal() -> None:
    """A chunk of several positions after cached ones equals feeding them one at a time."""
    _, ours = _pair("qwen2")
    x = torch.randn(1, 7, 64)
    with torch.no_grad():
        whole = ours(x, KVCache())
        cache = KVCache()
        first = ours(x[:, :4], cache)
        rest = ours(x[:, 4:], cache)
    torch.testing.assert_close(torch.cat([first, rest], 1), whole, rtol=0, atol=2e-6)


def test_config_errors_and_repeat_kv() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        DecoderConfig.from_hf({"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                               "intermediate_size": 8})
    x = torch.arange(2 * 3 * 2).float().view(1, 2, 3, 2)
    assert torch.equal(repeat_kv(x, 2), torch.repeat_interleave(x, 2, dim=1))
