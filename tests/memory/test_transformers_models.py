"""Model code nobody here wrote (M13, M17, M23, M57): Hugging Face Llama and Qwen3 causal LMs, GPT-2,
T5 and Whisper, and weight-normed vocoders (HiFi-GAN, Encodec) from tiny configs with random
weights, streamed none / half / whole on the strict simulated device — logits, greedy `generate`
and audio `torch.equal` to the plain run, with a user's hook on a streamed leaf, and under
`torch.compile`. Skipped where transformers is not installed."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from mizuoto_runtime import DeviceService, ModelHandle

from support.placement import check_three_sizes

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


# ---- weight-normed vocoders as transformers ships them (issue 10, item 2; M13, M57) -------------
def hifigan(legacy: bool = False) -> nn.Module:
    """SpeechT5's HiFi-GAN with weight norm on every conv: transformers' own `apply_weight_norm`
    (`parametrizations.weight_norm`, `original0/1`), or the legacy `nn.utils.weight_norm`
    (`weight_g`/`weight_v` and a pre-hook computing the weight) as older vocoders apply it."""
    config = transformers.SpeechT5HifiGanConfig(model_in_dim=80, upsample_initial_channel=512, upsample_rates=[4, 4],
                                                upsample_kernel_sizes=[8, 8], resblock_kernel_sizes=[3, 5],
                                                resblock_dilation_sizes=[[1, 3], [1, 3]])
    model = transformers.SpeechT5HifiGan(config)
    if not legacy:
        model.apply_weight_norm()
        return model
    for layer in model.modules():
        if isinstance(layer, (nn.Conv1d, nn.ConvTranspose1d)):
            nn.utils.weight_norm(layer)
    return model


def encodec() -> nn.Module:
    """Encodec's convs are weight-normed by default (`norm_type = "weight_norm"`)."""
    config = transformers.EncodecConfig(num_filters=128, upsampling_ratios=[4, 4], codebook_size=64, codebook_dim=128,
                                        hidden_size=128, num_lstm_layers=1)
    return transformers.EncodecModel(config)


def _vocode(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.randn(2, 12, 80, generator=torch.Generator().manual_seed(4)))


def _encodec_round_trip(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        audio = torch.randn(1, 1, 1600, generator=torch.Generator().manual_seed(5))
        codes = model.encode(audio).audio_codes
        return codes, model.decode(codes, [None]).audio_values


VOCODERS: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], object], str]] = {
    "hifigan": (hifigan, _vocode, "upsampler.0.parametrizations.weight.original1"),
    "hifigan_legacy": (lambda: hifigan(legacy=True), _vocode, "upsampler.0.weight_v"),
    "encodec": (encodec, _encodec_round_trip, "encoder.layers.6.conv.parametrizations.weight.original1"),
}


def _same(a: object, b: object) -> bool:
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b))  # type: ignore[arg-type]
    return torch.equal(a, b)  # type: ignore[arg-type]


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("name", sorted(VOCODERS))
def test_weight_normed_vocoders_stream_exactly(name: str, placement: str) -> None:
    """Their weight-normed convs are streamable leaves (the original tensors stream), so the
    vocoders have units and stream none / half / whole, `torch.equal` to the plain run."""
    factory, call, streamed_tensor = VOCODERS[name]
    plain, placed = twins(factory)
    expected = call(plain)
    h = ModelHandle(placed, devices=DeviceService(simulate={"cpu": 256 * MB}, strict=True), kind="oneshot",
                    name=name)
    assert streamed_tensor in {s.name for u in h.units for s in u.slots}
    assert h.min_working_set < h.size_bytes  # no longer the whole model
    h.load({"none": 0, "half": (h.min_working_set + h.size_bytes) // 2, "whole": None}[placement])
    streamed = len(h.streamed_units)
    assert streamed == {"none": len(h.units), "whole": 0}.get(placement, streamed)
    assert placement != "half" or 0 < streamed < len(h.units)
    assert _same(call(placed), expected), f"{name} ({placement}) differs from the plain run"
    assert _same(call(placed), expected), f"{name} ({placement}): a second call differs"
    if streamed:
        assert h.streamer.streamed_bytes_of(h) > 0
    h.offload()
    assert h.device_bytes == 0 and h.devices.counted_bytes(torch.device("cpu")) == 0


# ---- encoder-decoder models (issue 10; M12, M57): T5 and Whisper --------------------------------
def t5() -> nn.Module:
    config = transformers.T5Config(vocab_size=512, d_model=256, d_kv=32, d_ff=1024, num_layers=3, num_decoder_layers=3,
                                   num_heads=8, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return transformers.T5ForConditionalGeneration(config)


def whisper() -> nn.Module:
    config = transformers.WhisperConfig(vocab_size=512, num_mel_bins=80, encoder_layers=2, decoder_layers=2,
                                        d_model=256, encoder_attention_heads=4, decoder_attention_heads=4,
                                        encoder_ffn_dim=1024, decoder_ffn_dim=1024, max_source_positions=32,
                                        max_target_positions=32, decoder_start_token_id=1, pad_token_id=0,
                                        eos_token_id=2, bos_token_id=1)
    return transformers.WhisperForConditionalGeneration(config)


def _t5_run(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        logits = model(input_ids=PROMPT, decoder_input_ids=PROMPT[:, :3]).logits
        tokens = model.generate(PROMPT, max_new_tokens=5, do_sample=False)
    return logits, tokens


def _whisper_run(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    mel = torch.randn(1, 80, 64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        first = model(input_features=mel, decoder_input_ids=torch.tensor([[1, 5, 9]])).logits
        again = model(input_features=mel, decoder_input_ids=torch.tensor([[1, 5, 9, 13]])).logits
    return first, again


SEQ2SEQ: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], tuple[torch.Tensor, torch.Tensor]]]] = {
    "t5": (t5, _t5_run),
    "whisper": (whisper, _whisper_run),
}


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("name", sorted(SEQ2SEQ))
def test_encoder_decoder_models_stream_exactly(name: str, placement: str) -> None:
    """The encoder's and the decoder's layers are units of one component; streamed none / half /
    whole, logits (and T5's greedy `generate`) equal the plain run."""
    factory, call = SEQ2SEQ[name]
    plain, placed = twins(factory)
    expected = call(plain)
    h = ModelHandle(placed, devices=DeviceService(simulate={"cpu": 256 * MB}, strict=True), kind="oneshot", name=name)
    assert any(".encoder." in f".{u.name}" for u in h.units) and any(".decoder." in f".{u.name}" for u in h.units)
    h.load({"none": 0, "half": (h.min_working_set + h.size_bytes) // 2, "whole": None}[placement])
    streamed = len(h.streamed_units)
    assert streamed == {"none": len(h.units), "whole": 0}.get(placement, streamed)
    assert placement != "half" or 0 < streamed < len(h.units)
    got = call(placed)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), f"{name} ({placement})"


THREE_SIZES: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], object], str]] = {
    **{name: (factory, run, "sequence") for name, factory in MODELS.items()},
    "gpt2": (gpt2, run, "sequence"),
    **{name: (factory, call, "oneshot") for name, (factory, call, _) in VOCODERS.items()},
    **{name: (factory, call, "oneshot") for name, (factory, call) in SEQ2SEQ.items()},
}


@pytest.mark.parametrize("name", sorted(THREE_SIZES))
def test_placement_invariants_at_three_sizes(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21, item 4: at the minimum working set, the midpoint and one unit short of whole,
    exact, within the device and the placement's account, monotone in the device's size, never
    streaming more than `vram_mode = none` (tests/support/placement.py)."""
    from transformers.pytorch_utils import Conv1D

    monkeypatch.setattr(Conv1D, "STREAMABLE", True, raising=False)  # GPT-2's layers stream
    factory, call, kind = THREE_SIZES[name]
    check_three_sizes(factory, call, kind)  # type: ignore[arg-type]
