"""`BufferCache`, the static KV cache of `compute.kv_cache = static` (M46, M53), against
transformers' `DynamicCache` under real attention layers built from small configs."""
from __future__ import annotations

import pytest
import torch

from mizuoto_runtime.nn.kv_cache import BufferCache, capacity_for, peak_bytes

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def kv(n: int, heads: int = 2, dim: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, heads, n, dim, generator=g), torch.randn(1, heads, n, dim, generator=g)


def test_update_writes_in_place_and_doubles_when_full() -> None:
    cache = BufferCache(min_capacity=4)
    keys, values = [], []
    for step, n in enumerate((3, 1, 1, 5, 1)):
        k, v = kv(n, seed=step)
        keys.append(k)
        values.append(v)
        before = cache.keys[0].data_ptr() if cache.keys else None
        got_k, got_v = cache.update(k, v, 0)
        assert torch.equal(got_k, torch.cat(keys, dim=-2)) and torch.equal(got_v, torch.cat(values, dim=-2))
        if step == 1:  # fits: written in place, no new buffer
            assert cache.keys[0].data_ptr() == before
    assert cache.get_seq_length() == 11 and cache.capacity == 16  # 4 -> 8 -> 16
    assert cache.allocated_bytes == 2 * 16 * 2 * 8 * 4


def test_reset_keeps_the_buffers() -> None:
    cache = BufferCache(min_capacity=16)
    cache.update(*kv(5), 0)
    ptr = cache.keys[0].data_ptr()
    cache.reset()
    k, v = kv(2, seed=1)
    got_k, _ = cache.update(k, v, 0)
    assert cache.get_seq_length() == 2 and cache.keys[0].data_ptr() == ptr and torch.equal(got_k, k)


def test_layers_are_added_in_order_and_bad_input_is_refused() -> None:
    cache = BufferCache()
    with pytest.raises(ValueError, match="layer 1 updated before layer 0"):
        cache.update(*kv(1), 1)
    with pytest.raises(ValueError, match="min_capacity"):
        BufferCache(min_capacity=0)
    cache.update(*kv(1), 0)
    with pytest.raises(ValueError, match="already holds"):
        cache.adopt([kv(1)[0]], [kv(1)[1]])


def test_adopt_moves_a_prefilled_cache_layer_by_layer() -> None:
    layers = [kv(7, seed=i) for i in range(3)]
    keys, values = [k for k, _ in layers], [v for _, v in layers]
    cache = BufferCache()
    cache.adopt(keys, values)
    assert keys == [] and values == []  # the caller's references are dropped
    assert cache.capacity == capacity_for(7) == 8
    for i, (k, v) in enumerate(layers):
        assert torch.equal(cache.keys[i][:, :, :7], k) and torch.equal(cache.values[i][:, :, :7], v)


def test_peak_bytes_static_covers_what_the_cache_allocates() -> None:
    """M46: the estimate is the cache's real size at the end plus one layer's transient."""
    position_bytes = 2 * 2 * 8 * 4  # keys + values, 2 heads of 8 floats
    cache = BufferCache()
    cache.adopt([kv(5)[0] for _ in range(4)], [kv(5)[1] for _ in range(4)])
    for step in range(20):
        for layer in range(4):
            cache.update(*kv(1, seed=step), layer)
    positions = 25
    assert cache.allocated_bytes == 4 * position_bytes * capacity_for(positions)
    assert peak_bytes(position_bytes, 4, positions, "static") == cache.allocated_bytes + cache.allocated_bytes // 4


def test_attention_over_buffer_views_equals_the_dynamic_cache() -> None:
    """M53 on CPU: a Qwen3 decoder (transformers, small config, random weights) decoding token
    by token gives identical outputs over `BufferCache` and `DynamicCache`."""
    pytest.importorskip("transformers")  # the core environment has none
    from transformers import Qwen3Config
    from transformers.cache_utils import DynamicCache
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Model

    config = Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = Qwen3Model(config).eval()
    tokens = torch.randint(0, 64, (1, 40))
    outputs = {}
    for name, cache in (("dynamic", DynamicCache()), ("static", BufferCache(min_capacity=4))):
        layers_out = []
        with torch.no_grad():
            rotary = model.rotary_emb
            hidden = model.embed_tokens(tokens[:, :6])
            pos = torch.arange(6).unsqueeze(0)
            for layer in model.layers:
                hidden = layer(hidden, attention_mask=None, position_ids=pos, past_key_values=cache,
                               use_cache=True, position_embeddings=rotary(hidden, pos))
                hidden = hidden[0] if isinstance(hidden, tuple) else hidden
            for t in range(6, 40):
                h = model.embed_tokens(tokens[:, t:t + 1])
                pos = torch.tensor([[t]])
                for layer in model.layers:
                    h = layer(h, attention_mask=None, position_ids=pos, past_key_values=cache,
                              use_cache=True, position_embeddings=rotary(h, pos))
                    h = h[0] if isinstance(h, tuple) else h
                layers_out.append(h)
        outputs[name] = torch.cat(layers_out, dim=1)
    assert torch.equal(outputs["dynamic"], outputs["static"])
