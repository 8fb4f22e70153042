"""Model code nobody here wrote (M17, M23, M57): Hugging Face Llama and Qwen3 causal LMs from tiny
configs with random weights, streamed none / half / whole on the strict simulated device —
logits and greedy `generate` `torch.equal` to the plain run, with a user's hook on a streamed
leaf, and under `torch.compile`. Skipped where transformers is not installed."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from mizuoto_runtime import DeviceService, ModelHandle

transformers = pytest.importorskip("transformers")

MB = 1 << 20
PLACEMENTS = ("none", "half", "whole")
PROMPT = torch.tensor([[3, 17, 42, 7, 99, 5]])

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def llama() -> nn.Module:
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


def qwen3() -> nn.Module:
    config = transformers.Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                      max_position_embeddings=64)
    return transformers.Qwen3ForCausalLM(config)


MODELS: dict[str, Callable[[], nn.Module]] = {"llama": llama, "qwen3": qwen3}


def twins(factory: Callable[[], nn.Module]) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    plain = factory().eval()
    torch.manual_seed(0)
    return plain, factory().eval()


def place(model: nn.Module, placement: str) -> ModelHandle:
    h = ModelHandle(model, devices=DeviceService(simulate={"cpu": 256 * MB}, strict=True), kind="sequence", name="lm")
    assert len(h.units) == 4  # the decoder layers (M12)
    h.load({"none": 0, "half": (h.min_working_set + h.size_bytes) // 2, "whole": None}[placement])
    streamed = len(h.streamed_units)
    assert streamed == {"none": 4, "whole": 0}.get(placement, streamed) and (placement != "half" or 0 < streamed < 4)
    return h


def run(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        logits = model(PROMPT).logits
        tokens = model.generate(PROMPT, max_new_tokens=6, do_sample=False, pad_token_id=0)
    return logits, tokens


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_lm_streams_exactly_with_a_user_hook(name: str, placement: str) -> None:
    plain, placed = twins(MODELS[name])
    seen: dict[str, list[torch.Tensor]] = {"plain": [], "placed": []}

    def hook(key: str) -> Callable[..., None]:
        def record(module: nn.Module, args: object, output: torch.Tensor) -> None:
            seen[key].append(output.clone() + module.weight.sum())  # reads the streamed weight too

        return record

    plain.model.layers[1].mlp.down_proj.register_forward_hook(hook("plain"))
    expected = run(plain)
    h = place(placed, placement)
    placed.model.layers[1].mlp.down_proj.register_forward_hook(hook("placed"))  # after our hooks
    got = run(placed)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), f"{name} {placement}"
    assert len(seen["placed"]) == len(seen["plain"]) > 0
    assert all(torch.equal(a, b) for a, b in zip(seen["placed"], seen["plain"]))
    if placement != "whole":
        assert h.streamer.streamed_bytes_of(h) > 0


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_transformers_lm_under_torch_compile(placement: str) -> None:
    """M23: a compiled model runs compiled when whole and eagerly while units stream; both equal
    the plain run (`aot_eager` runs the same ATen ops as eager, so equality is exact)."""
    plain, placed = twins(llama)
    expected = run(plain)
    torch._dynamo.reset()
    compiled = torch.compile(placed, backend="aot_eager")
    h = ModelHandle(compiled, devices=DeviceService(simulate={"cpu": 256 * MB}, strict=True), kind="sequence",
                    name="lm")
    h.load({"none": 0, "half": (h.min_working_set + h.size_bytes) // 2, "whole": None}[placement])
    from torch._dynamo.utils import counters

    counters.clear()
    with torch.no_grad():
        logits = compiled(PROMPT).logits
    assert torch.equal(logits, expected[0])
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0 if placement == "whole" else graphs == 0  # compiled only when nothing streams
    torch._dynamo.reset()


def gpt2() -> nn.Module:
    config = transformers.GPT2Config(vocab_size=512, n_positions=64, n_embd=256, n_layer=4, n_head=4)
    return transformers.GPT2LMHeadModel(config)


def test_gpt2_conv1d_is_fixed_and_the_plan_says_why() -> None:
    """transformers' GPT-2 `Conv1D` does not declare STREAMABLE: nothing streams, and the plan
    says which layers and what they would need (issue 10, item 2)."""
    h = ModelHandle(gpt2(), devices=DeviceService(simulate={"cpu": 256 * MB}, strict=True), name="gpt2")
    assert h.units == []
    top_reason, nbytes = h.plan.why_fixed()[0]
    assert "Conv1D" in top_reason and "STREAMABLE = True" in top_reason and nbytes > h.size_bytes // 2


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_gpt2_streams_exactly_once_conv1d_declares_itself_streamable(placement: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """M13: `Conv1D` reads its weight only inside its forward, so declaring it streamable is all
    it takes; then GPT-2 streams none / half / whole, exactly."""
    from transformers.pytorch_utils import Conv1D

    monkeypatch.setattr(Conv1D, "STREAMABLE", True, raising=False)
    plain, placed = twins(gpt2)
    expected = run(plain)
    place(placed, placement)
    got = run(placed)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
