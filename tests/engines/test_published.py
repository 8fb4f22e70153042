"""Issue 35 item 1: each engine's published models as data, built on the meta device by the
engine's own loader (`engines.published`). A build costs no memory (every parameter is on
meta), reads no weight, and has the published size: the parameter counts the model cards give.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mizuoto_runtime.app.fit import fit_manager
from mizuoto_runtime.engines import ENGINES, engine_class
from mizuoto_runtime.engines.published import TYPICAL_SECONDS, PublishedModel, build, published_models, shapes
from mizuoto_runtime.nn.loading import reading_weights, shapes_only

from conftest import missing_requirement, require_qwen_tts

MODELS = [m for e in sorted(ENGINES) if engine_class(e).PUBLISHED is not None for m in published_models(e)]

# Parameters of the published models (millions) as their model cards and configs give them: per
# model, (the components counted (None: all), millions) checks.
PARAMETERS_M: dict[str, tuple[tuple[tuple[str, ...] | None, float], ...]] = {
    "Qwen3-TTS-12Hz-0.6B-Base": ((("talker", "speaker_encoder"), 915),),  # 0.6B: 915M besides the speech tokenizer
    "Qwen3-TTS-12Hz-1.7B-Base": ((("talker", "speaker_encoder"), 1929),),  # 1.7B: 1.93B
    "F5-TTS v1 Base": ((None, 337 + 13.5),),  # the DiT and Vocos
    "VoxCPM2": ((None, 2384),),  # ~2.38B
    "OmniVoice": ((("llm",), 613),),  # Qwen3-0.6B with the audio embeddings and heads
    "GPT-SoVITS v2 (pretrained)": ((("t2s", "hubert"), 77.6 + 94.4),),  # s1bert25hz (155 MB fp16), HuBERT base
    # The -hf checkpoints' counts: 2.70B and 9.34B, the LM, diffusion head, connectors and both
    # tokenizers (5.4 GB and 18.7 GB in bfloat16).
    "VibeVoice-1.5B": ((None, 2704),),
    "VibeVoice-7B": ((None, 9343),),
    # The generation model's card: 5.8B (the 3.6B Llama-3.2-3B backbone and 2.2B of DualFFN), of
    # which the text head (128256 x 3072 = 394M) is training-only and not loaded
    # (checkpoint.UNUSED_PREFIXES).
    # The audio tokenizer's card gives no count: 183M as its published config builds it, without
    # the semantic decoder that inference never runs (200M with it).
    "Higgs Audio v2 generation 3B base": ((("talker",), 5771 - 394),
                                          (("audio_encoder", "quantizer", "audio_decoder"), 183)),
    # Dia's card: 1.61B; DAC 44 kHz's: 76.6M (encoder, codebooks, decoder).
    "Dia-1.6B": ((("talker",), 1611), (("dac_encoder", "quantizer", "dac_decoder"), 76.6)),
    # CSM-1B with its Mimi codec: 1.63B (the 1B backbone, the depth decoder, Mimi's 79M).
    "CSM-1B": ((None, 1632),),
    # ResembleAI/chatterbox-hf's listing: 0.8B parameters, float32; of them T3 (the 0.5B Llama
    # backbone with its embeddings, heads and conditioning encoder) 532M as upstream's T3() builds it.
    "Chatterbox": ((None, 798), (("talker",), 532)),
    # The same S3Gen and voice encoder; its T3 as upstream's T3Config.multilingual() builds it (a
    # text vocabulary of 2454 for English's 704): 536M (no published count).
    "Chatterbox Multilingual": ((None, 801), (("talker",), 536)),
}


def require(engine_id: str) -> None:
    missing = missing_requirement(engine_id)
    if missing is not None:
        pytest.skip(f"{missing} is not installed (requirements/{engine_id}.txt)")
    if engine_id == "qwen3tts":
        require_qwen_tts()


@pytest.mark.parametrize("model", MODELS, ids=[m.name for m in MODELS])
def test_a_published_model_builds_on_meta_and_reports_its_shapes(model: PublishedModel) -> None:
    require(model.engine)
    engine = build(model, fit_manager())
    handles = engine.handles()
    assert handles and all(p.is_meta for h in handles for p in h.module.parameters())
    report = shapes(engine)
    assert [h.name for h in report.handles] == [h.name for h in handles]
    for h in report.handles:
        assert h.size_bytes > 0 and 0 < h.min_working_set and h.fixed_bytes <= h.min_working_set
    streaming = max(report.handles, key=lambda h: h.size_bytes)
    assert streaming.units >= 2 and streaming.min_working_set < streaming.size_bytes  # the largest streams
    assert {p.seconds for p in report.phases} == set(TYPICAL_SECONDS)
    assert all(p.estimate > 0 for p in report.phases)
    longer = {p.name + str(p.handles): p.estimate for p in report.phases if p.seconds == TYPICAL_SECONDS[1]}
    assert all(longer[p.name + str(p.handles)] >= p.estimate for p in report.phases if p.seconds == TYPICAL_SECONDS[0])
    for names, count in PARAMETERS_M.get(model.name, ()):
        params = sum(p.numel() for h in handles if names is None or h.name in names for p in h.module.parameters())
        assert params / 1e6 == pytest.approx(count, rel=0.01), names


def test_shapes_only_reads_no_weight_and_restores_loading() -> None:
    load_state_dict = nn.Module.load_state_dict
    with pytest.raises(RuntimeError, match="inside"), shapes_only():
        assert not reading_weights()
        layer = nn.Linear(4, 4)
        assert layer.weight.is_meta
        layer.load_state_dict({"weight": torch.ones(4, 4), "bias": torch.ones(4)})
        assert layer.weight.is_meta  # left as built
        raise RuntimeError("inside")
    assert reading_weights() and nn.Module.load_state_dict is load_state_dict
    assert not nn.Linear(4, 4).weight.is_meta
