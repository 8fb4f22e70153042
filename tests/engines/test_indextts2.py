"""IndexTTS-2 under the memory runtime (issue 25) on a tiny random checkpoint in the published
layout: phases place only their components and a cached voice places no prompt encoder (M1, M4);
every placement equals the plain run with beams on (M57); an injected OOM reruns exactly (M40);
the GPT-2 `Conv1D` leaves stream only because they declare it (M13); the beams share one copy of
each streamed unit per step (M18); emotion inputs change the result and are cached, and follow
upstream's infer (the voice's own emotion, use_random, emotion text sampled before the decoding);
the GPT in bfloat16 keeps every placement exact (M57)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="IndexTTS-2 needs transformers (GPT-2 Conv1D, w2v-BERT)")
pytest.importorskip("sentencepiece", reason="IndexTTS-2's tokenizer is SentencePiece")
pytest.importorskip("yaml", reason="IndexTTS-2 reads config.yaml")
pytest.importorskip("torchaudio", reason="IndexTTS-2 resamples its reference audio")

from mizuoto_runtime import OomInjector, Runtime  # noqa: E402
from mizuoto_runtime.audio import Audio  # noqa: E402
from mizuoto_runtime.engines import Sampling  # noqa: E402

from conftest import require_engine  # noqa: E402
from support.oom import allocations_during  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REFERENCE = Audio(0.3 * torch.sin(torch.arange(22050) / 6.0).unsqueeze(0), 22050)
EMOTION_AUDIO = Audio(0.3 * torch.sin(torch.arange(16000) / 3.0).unsqueeze(0), 16000)
TEXT = "hello tiny model. this is a test!"
CODES = 12
SAMPLING = Sampling(seed=5, max_new_tokens=CODES, temperature=0.8, top_k=30, top_p=0.8, repetition_penalty=10.0)
PROMPT_ENCODERS = {"indextts2:w2v_bert", "indextts2:semantic_codec", "indextts2:campplus", "indextts2:conditioning"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_engine("indextts2")
    from mizuoto_runtime.engines.indextts2.tiny import write

    return write(tmp_path_factory.mktemp("indextts2"))


def runtime(placement: str) -> Runtime:
    if placement == "plain":
        return Runtime()
    return Runtime({"compute.simulate_vram_mb": 256, "compute.vram_mode": "none" if placement == "none" else "normal"})


def say(rt: Runtime, folder: Path, placement: str = "plain", sampling: Sampling = SAMPLING, dtype: str = "float32",
        weights: str | None = None, **emotion: object) -> tuple[torch.Tensor, torch.Tensor, dict]:
    engine = rt.engine("indextts2", folder, dtype=dtype, weights=weights)
    if placement == "half":
        for h in engine.handles():
            h.cap_bytes = (h.min_working_set + h.size_bytes) // 2
    ctx = rt.request(seed=sampling.seed)
    voice = engine.voice_prompt(ctx, REFERENCE)
    from mizuoto_runtime.engines.indextts2.emotion import Emotion

    codes = engine.generate(ctx, TEXT, voice, sampling, emotion=Emotion(**emotion) if emotion else None)
    audio = engine.decode(ctx, codes)
    return codes.tokens, audio.waveform, ctx.meta


_plain: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


def plain(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    if "run" not in _plain:
        _plain["run"] = say(Runtime(), folder)[:2]
    return _plain["run"]


@pytest.mark.parametrize("placement", ["none", "half", "whole"])
def test_every_placement_equals_the_plain_run(folder: Path, placement: str) -> None:
    """M57 with three beams: codes and audio torch.equal to the plain CPU run."""
    expected_codes, expected_wav = plain(folder)
    codes, wav, meta = say(runtime(placement), folder, placement)
    assert codes.shape[1] > 0 and wav.abs().max() > 0
    assert torch.equal(codes, expected_codes), f"{placement}: codes differ from the plain run"
    assert torch.equal(wav, expected_wav), f"{placement}: audio differs from the plain run"
    memory = meta["memory"]
    if placement == "whole":
        assert memory["partial"] == {} and memory["streamed_mb"] == 0
    else:
        assert memory["streamed_mb"] > 0
        assert "indextts2:talker" in memory["partial"] and "indextts2:flow" in memory["partial"]


@pytest.mark.parametrize("placement", ["none", "half", "whole"])
def test_bfloat16_placements_equal_the_plain_run(folder: Path, placement: str) -> None:
    """M57 with the GPT in bfloat16 (upstream's use_fp16 way: UnifiedVoice cast, its phases under
    autocast, the rest float32): every placement torch.equal to the plain bfloat16 run."""
    if "bf16" not in _plain:
        _plain["bf16"] = say(Runtime(), folder, dtype="bfloat16")[:2]
    expected_codes, expected_wav = _plain["bf16"]
    codes, wav, meta = say(runtime(placement), folder, placement, dtype="bfloat16")
    assert codes.shape[1] > 0 and wav.abs().max() > 0
    assert torch.equal(codes, expected_codes) and torch.equal(wav, expected_wav)
    assert (meta["memory"]["streamed_mb"] > 0) == (placement != "whole")


@pytest.mark.parametrize("placement", ["none", "half", "whole"])
@pytest.mark.parametrize("weights", ["fp8_e4m3fn", "int8"])
def test_gpt_stored_small_streams_exactly(folder: Path, weights: str, placement: str) -> None:
    """Issue 36 (M57 with the option on): the GPT talker (its `Conv1D` and Linear layers) stored in
    fp8 / int8, every placement equals the plain run with the same choice, streams, and says it."""
    if weights not in _plain:
        _plain[weights] = say(Runtime(), folder, weights=weights)[:2]
    expected_codes, expected_wav = _plain[weights]
    assert not torch.equal(expected_wav, plain(folder)[1])  # the choice changes the audio
    codes, wav, meta = say(runtime(placement), folder, placement, weights=weights)
    assert torch.equal(codes, expected_codes), f"{weights} ({placement}): codes differ from the plain run with it"
    assert torch.equal(wav, expected_wav), f"{weights} ({placement}): audio differs from the plain run with it"
    assert meta["applied"]["weights"] == {"generate": weights}
    if placement != "whole":
        assert meta["memory"]["streamed_mb"] > 0


def test_the_gpt_takes_the_engines_dtype(folder: Path) -> None:
    """float16 / bfloat16 cast UnifiedVoice (conditioning and GPT, as upstream halves it) and
    halve the talker's KV estimate (M45); w2v-BERT, CAM++, the codec, s2mel and BigVGAN stay
    float32; other dtypes are refused by name."""
    from mizuoto_runtime import MizuotoError

    rt = Runtime()
    full = rt.engine("indextts2", folder)
    half = rt.engine("indextts2", folder, dtype="bfloat16")
    assert {p.dtype for p in half.gpt.parameters()} == {torch.bfloat16}
    for module in (half.w2v, half.campplus.module, half.semantic_codec.module, half.s2mel, half.bigvgan):
        assert {p.dtype for p in module.parameters()} == {torch.float32}
    assert half.talker.size_bytes * 2 == full.talker.size_bytes
    assert half.talker_memory(9, 50)["kv_cache"] * 2 == full.talker_memory(9, 50)["kv_cache"]
    assert half.flow_memory(100) == full.flow_memory(100)
    with pytest.raises(MizuotoError, match="float32, float16 or bfloat16.*not torch.float64"):
        rt.engine("indextts2", folder, dtype=torch.float64)


def test_phases_and_a_cached_voice(folder: Path) -> None:
    """M1: each phase places its own components; M4: the same voice again places none of the
    prompt encoders (w2v-BERT, codec, CAM++, conditioning), and gives the same audio."""
    rt = runtime("none")
    engine = rt.engine("indextts2", folder)
    first, meta = rt.say(engine, TEXT, reference=REFERENCE, sampling=SAMPLING)
    phases = {k: v["phase"] for k, v in meta["memory"]["components"].items()}
    assert phases == {**{k: "voice prompt" for k in PROMPT_ENCODERS}, "indextts2:talker": "talker",
                      "indextts2:flow": "flow", "indextts2:vocoder": "vocoder"}
    rt.manager.events.clear()
    again, _ = rt.say(engine, TEXT, reference=REFERENCE, sampling=SAMPLING)
    placed = {name for action, name, _ in rt.manager.events if action == "place"}
    assert placed == {"indextts2:talker", "indextts2:flow", "indextts2:vocoder"}
    assert not placed & PROMPT_ENCODERS
    assert torch.equal(first.waveform, again.waveform)


def test_beams_share_one_copy_per_streamed_unit(folder: Path) -> None:
    """M18, M20: with every GPT block streamed, each GPT forward copies every streamed unit once —
    the three beams are rows of one batch, not three passes."""
    rt = runtime("none")
    engine = rt.engine("indextts2", folder)
    talker = engine.talker
    assert talker.kind == "sequence" and len(talker.units) == 3
    calls: list[int] = []
    hook = engine.gpt.gpt.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        ctx = rt.request(seed=5)
        voice = engine.voice_prompt(ctx, REFERENCE)
        before = talker.streamer.streamed_bytes_of(talker)
        codes = engine.generate(ctx, TEXT, voice, SAMPLING)
        streamed = talker.streamer.streamed_bytes_of(talker) - before
    finally:
        hook.remove()
    unit_bytes = sum(u.nbytes for u in talker.streamed_units)
    assert engine.num_beams == 3 and unit_bytes > 0
    # prefill + one step per code after the first + the latent forward
    assert len(calls) == codes.tokens.shape[1] + 1 or len(calls) == codes.tokens.shape[1] + 2
    assert streamed == len(calls) * unit_bytes  # not 3 x


def test_conv1d_streams_because_it_declares_it() -> None:
    """M13: transformers' GPT-2 `Conv1D` reads its weights only inside its forward, but the
    runtime streams only layers that say so: plain, a GPT-2 block is all fixed part; as the
    engine declares it (StreamingConv1D), the same block is a streamed unit."""
    from transformers.pytorch_utils import Conv1D

    from mizuoto_runtime.engines.indextts2.gpt2 import GPT2Stack, StreamingConv1D
    from mizuoto_runtime.memory.units import plan_units

    stack = GPT2Stack(256, 4, 2)  # blocks of 3 MB: list children the runtime takes as units (M12)
    declared = plan_units(stack)
    assert [u.name for u in declared.units] == ["h.0", "h.1"]
    for block in stack.h:
        for holder, name in ((block.attn, "c_attn"), (block.attn, "c_proj"), (block.mlp, "c_fc"),
                             (block.mlp, "c_proj")):
            old = getattr(holder, name)
            plain = Conv1D(old.nf, old.nx)
            plain.load_state_dict(old.state_dict())
            setattr(holder, name, plain)
    undeclared = plan_units(stack)
    assert undeclared.units == []
    reasons = dict(undeclared.why_fixed())
    assert any("Conv1D" in why and "STREAMABLE" in why for why in reasons)
    assert StreamingConv1D.STREAMABLE and not getattr(Conv1D, "STREAMABLE", False)


def test_oom_in_the_talker_reruns_exactly(folder: Path) -> None:
    """M40: an OOM mid-decoding (a streamed copy) reruns the talker phase with the same draws."""
    expected_codes, expected_wav = plain(folder)
    probe = runtime("none")
    engine = probe.engine("indextts2", folder)
    with allocations_during(probe, engine, "generate") as inside:
        ctx = probe.request(seed=5)
        voice = engine.voice_prompt(ctx, REFERENCE)
        engine.generate(ctx, TEXT, voice, SAMPLING)
    assert len(inside) > 10
    rt = runtime("none")
    engine = rt.engine("indextts2", folder)
    injector = OomInjector(at=inside[len(inside) // 2])  # counted from the voice prompt on, as the probe's
    rt.devices.fault_hook = injector
    try:
        ctx = rt.request(seed=5)
        voice = engine.voice_prompt(ctx, REFERENCE)
        codes = engine.generate(ctx, TEXT, voice, SAMPLING)
    finally:
        rt.devices.fault_hook = None
    audio = engine.decode(ctx, codes)
    assert injector.raised == 1 and ctx.meta["applied"]["oom_retries"] == 1
    assert torch.equal(codes.tokens, expected_codes) and torch.equal(audio.waveform, expected_wav)


def test_emotion_audio_and_vector(folder: Path) -> None:
    """An emotion reference audio (cached per voice and audio) and an emotion vector both change
    the result; alpha 0 of an emotion audio is the vector of the voice's prompt features (upstream's
    merge_emovec base: not the no-emotion vector, which reads the reference again at 16 kHz)."""
    from mizuoto_runtime.engines.indextts2.emotion import Emotion

    rt = Runtime()
    _, base, _ = say(rt, folder)
    _, with_audio, _ = say(rt, folder, audio=EMOTION_AUDIO, alpha=1.0)
    engine = rt.engine("indextts2", folder)
    cached = len(engine.emotions)
    rt.manager.events.clear()
    _, again, _ = say(rt, folder, audio=EMOTION_AUDIO, alpha=1.0)
    assert len(engine.emotions) == cached == 1 and torch.equal(again, with_audio)
    assert "indextts2:w2v_bert" not in {name for action, name, _ in rt.manager.events if action == "place"}
    _, with_vector, _ = say(rt, folder, vector=(0, 0, 0.8, 0, 0, 0, 0, 0), alpha=1.0)
    say(rt, folder, audio=EMOTION_AUDIO, alpha=0.0)
    assert not torch.equal(with_audio, base) and not torch.equal(with_vector, base)
    voice = next(v for v in engine.voices.values())
    zero = next(vec for key, vec in engine.emotions.items() if key.endswith(Emotion(EMOTION_AUDIO, alpha=0.0).key()))
    assert torch.equal(zero, voice.data["base_emotion"])
    # the same emotion carried by the voice (the Emotion node's way) gives the same audio
    ctx = rt.request(seed=SAMPLING.seed)
    voice = engine.voice_prompt(ctx, REFERENCE, emotion=Emotion(audio=EMOTION_AUDIO, alpha=1.0))
    assert torch.equal(engine.decode(ctx, engine.generate(ctx, TEXT, voice, SAMPLING)).waveform, with_audio)


def test_bad_inputs_name_the_problem(folder: Path, tmp_path: Path) -> None:
    from mizuoto_runtime import CheckpointError, MizuotoError

    rt = Runtime()
    engine = rt.engine("indextts2", folder)
    ctx = rt.request(seed=1)
    with pytest.raises(MizuotoError, match="give reference audio"):
        engine.voice_prompt(ctx, None)
    with pytest.raises(MizuotoError, match="emotion vector needs 8 weights"):
        say(rt, folder, vector=(1.0, 0.0))
    (tmp_path / "config.yaml").write_text("gpt: {}\n")
    with pytest.raises(CheckpointError, match="missing gpt.pth"):
        rt.engine("indextts2", tmp_path)


def test_the_catalog_lists_a_published_folder(folder: Path, tmp_path: Path) -> None:
    """Loader dropdowns: a folder in the published layout (config.yaml, no config.json) is listed
    for indextts2, and for no other engine."""
    from mizuoto_runtime.app.checkpoints import scan

    (tmp_path / "IndexTTS-2").symlink_to(folder, target_is_directory=True)
    catalog = scan([tmp_path], ["indextts2", "qwen3tts"])
    assert [(c.engine, c.value, c.info.label) for c in catalog.choices if c.path] == [
        ("indextts2", "IndexTTS-2", "IndexTTS-2")]


def test_w2v_bert_keeps_17_layers_and_their_output_is_upstreams(folder: Path) -> None:
    """Upstream runs all of w2v-BERT and takes hidden state 17; the engine keeps 17 layers: the
    same features (normalised by the stats file), without the later layers' weights."""
    from transformers import Wav2Vec2BertModel

    from mizuoto_runtime.engines.indextts2.w2v import W2VBert

    w2v_dir = folder / "hf_cache" / "w2v-bert-2.0"
    stats = torch.load(folder / "wav2vec2bert_stats.pt", weights_only=True)
    ours = W2VBert(w2v_dir, stats["mean"], stats["var"].sqrt()).eval()
    full = Wav2Vec2BertModel.from_pretrained(str(w2v_dir)).eval()
    wav = 0.3 * torch.sin(torch.arange(16000) / 5.0).unsqueeze(0)
    feats, mask = ours.inputs(wav)
    with torch.no_grad():
        hidden = full(input_features=feats, attention_mask=mask, output_hidden_states=True).hidden_states[17]
        assert torch.equal(ours(feats, mask), (hidden - stats["mean"]) / stats["var"].sqrt())
    assert len(ours.model.encoder.layers) == 17 < full.config.num_hidden_layers


def test_segments_follow_upstreams_rules() -> None:
    """The text splits as upstream's front end does: at sentence ends (a following quote goes with
    the sentence and, as upstream, starts the next one too), commas re-split a long segment, and
    neighbours that fit are merged."""
    from mizuoto_runtime.engines.indextts2.text import SENTENCE_END, split_cjk, split_segments

    tokens = ["▁A", "B", "C", ".", "'", "▁D", "E", "F", "?"]
    assert split_segments(tokens, SENTENCE_END, 4) == [["▁A", "B", "C", ".", "'"], ["'", "▁D", "E", "F"], ["?"]]
    assert split_segments(tokens, SENTENCE_END, 120) == [tokens[:5] + ["'"] + tokens[5:]]
    assert split_segments(["▁A", ",", "B", "C", ",", "D"], SENTENCE_END, 3) == [["▁A", ","], ["B", "C", ","], ["D"]]
    assert split_cjk("你好world 测试") == "你 好 WORLD 测 试"


def test_cfg_halves_share_one_copy_per_step(folder: Path) -> None:
    """M18: the flow's classifier-free guidance is one batch-2 estimator call per Euler step, so
    each streamed DiT block is copied once per step (25 steps), not twice."""
    from mizuoto_runtime.engines.indextts2.pipeline import DIFFUSION_STEPS

    rt = runtime("none")
    engine = rt.engine("indextts2", folder)
    ctx = rt.request(seed=5)
    voice = engine.voice_prompt(ctx, REFERENCE)
    codes = engine.generate(ctx, TEXT, voice, SAMPLING)
    flow = engine.flow
    before = flow.streamer.streamed_bytes_of(flow)
    engine.decode(ctx, codes)
    streamed = flow.streamer.streamed_bytes_of(flow) - before
    assert len(flow.units) == 3 and len(flow.streamed_units) == 3
    per_step = sum(u.nbytes for u in flow.streamed_units)
    # once per step; a `oneshot` handle may copy the next block ahead once more at the end
    assert DIFFUSION_STEPS * per_step <= streamed <= DIFFUSION_STEPS * per_step + max(u.nbytes for u in flow.units)


def test_kv_estimate_follows_the_text_and_max_new_tokens(folder: Path) -> None:
    """M46: the talker reserves 24 codes per text token for every beam, capped by max_new_tokens."""
    engine = Runtime().engine("indextts2", folder)
    short, long_ = engine.talker_memory(2, 1000)["kv_cache"], engine.talker_memory(4, 1000)["kv_cache"]
    assert long_ > short
    capped = engine.talker_memory(4, 10)["kv_cache"]
    assert capped < long_
    cfg = engine.gpt.cfg
    assert capped == 2 * cfg.layers * (32 + 2 + 4 + 2 + 1 + 10) * cfg.model_dim * 4 * 3


def test_say_takes_the_emotion_as_a_voice_option(folder: Path) -> None:
    """The one-node path (`Runtime.say`, the Text to Speech node, `mizuoto say --emotion`): the
    emotion is a voice option; the same emotion gives the step-by-step path's audio, an engine
    without emotion control refuses it by name, and a bad weight names the problem."""
    from mizuoto_runtime import ArgumentError
    from mizuoto_runtime.engines.indextts2.emotion import Emotion, parse_weights

    rt = Runtime()
    engine = rt.engine("indextts2", folder)
    emotion = Emotion.from_inputs(None, "sad=0.8", 1.0)
    assert emotion is not None and emotion.vector == (0, 0, 0.8, 0, 0, 0, 0, 0)
    audio, _ = rt.say(engine, TEXT, reference=REFERENCE, sampling=SAMPLING, voice_options={"emotion": emotion})
    _, stepwise, _ = say(rt, folder, vector=emotion.vector, alpha=1.0)
    assert torch.equal(audio.waveform, stepwise)
    with pytest.raises(ArgumentError, match="engine 'demo' takes no emotion"):
        rt.say(rt.engine("demo"), TEXT, voice_options={"emotion": emotion})
    with pytest.raises(ArgumentError, match="from 0 to 1.2"):
        parse_weights("happy=3")
    assert parse_weights(" ") is None


def test_emotion_text_runs_the_emotion_model_once_per_text_and_seed(folder: Path) -> None:
    """Emotion from text (`instruct`): the checkpoint's Qwen3 emotion model runs under its own
    handle, once per text and seed (cached; the voice itself stays cached, M4), and its weights
    drive the emotion-vector path."""
    rt = runtime("none")
    engine = rt.engine("indextts2", folder)
    assert engine.emotion_text is not None and engine.emotion_text.kind == "sequence"
    assert engine.emotion_model is not None and engine.emotion_model.model.dtype == torch.float16  # as upstream
    first, meta = rt.say(engine, TEXT, reference=REFERENCE, instruct="I am so sad today", sampling=SAMPLING)
    assert "indextts2:emotion_text" in meta["memory"]["components"]
    weights, _ = engine.text_emotions[("I am so sad today", SAMPLING.seed)]
    assert len(weights) == 8 and max(weights) > 0
    rt.manager.events.clear()
    again, _ = rt.say(engine, TEXT, reference=REFERENCE, instruct="I am so sad today", sampling=SAMPLING)
    placed = {name for action, name, _ in rt.manager.events if action == "place"}
    assert "indextts2:emotion_text" not in placed and not placed & PROMPT_ENCODERS
    assert torch.equal(first.waveform, again.waveform)
    rt.say(engine, TEXT, reference=REFERENCE, instruct="I am so sad today",
           sampling=dataclasses.replace(SAMPLING, seed=SAMPLING.seed + 1))
    assert ("I am so sad today", SAMPLING.seed + 1) in engine.text_emotions


def test_emotion_caches_keep_the_most_recent(folder: Path) -> None:
    """The emotion text's readings (per text and seed) and the emotion audios' vectors are kept
    for the last `EMOTIONS_KEPT` only: a reading past the limit drops the least recently used,
    and a dropped one runs the emotion model again when asked for."""
    from mizuoto_runtime.engines.indextts2.engine import EMOTIONS_KEPT

    rt = Runtime()
    engine = rt.engine("indextts2", folder)
    assert engine.text_emotions.kept == engine.emotions.kept == EMOTIONS_KEPT
    engine.text_emotions.kept = 2

    def read(text: str) -> tuple[tuple[float, ...], bool]:
        """The weights of `text` (seed 1), and whether the emotion model ran for them."""
        ctx = rt.request(seed=1)
        weights, _ = engine.emotion_from_text(ctx, text, 1)
        return weights, "emotion text" in ctx.report.phases

    first, ran = read("one")
    assert ran and read("two")[1]
    assert read("one") == (first, False)  # read again from the cache: now the newest
    assert read("three")[1]
    assert list(engine.text_emotions) == [("one", 1), ("three", 1)]  # "two" was the least recently used
    weights, ran = read("two")
    assert ran and list(engine.text_emotions) == [("three", 1), ("two", 1)]


def test_the_emotion_models_answer_is_capped_with_a_warning(folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The emotion model's answer stops at `max_answer_tokens` (256, upstream 32768) and its KV
    estimate follows that cap, a growing cache's peak (M46); a warning tells when an answer was cut there, none when the
    answer ended before it."""
    import logging

    from mizuoto_runtime.engines.indextts2.emotion_text import MAX_ANSWER_TOKENS

    rt = Runtime()
    engine = rt.engine("indextts2", folder)
    model = engine.emotion_model
    assert model is not None and model.max_answer_tokens == MAX_ANSWER_TOKENS == 256
    prompt = model.prompt("so sad").shape[1]

    def cut() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "mizuoto_runtime.engines.indextts2.emotion_text"]

    model.max_answer_tokens = 5
    config = model.model.generation_config
    end, sampled = config.eos_token_id, config.do_sample
    try:
        with caplog.at_level(logging.WARNING, logger="mizuoto_runtime.engines.indextts2.emotion_text"):
            ctx = rt.request(seed=1)
            engine.emotion_from_text(ctx, "so sad", 1)
            assert ctx.report.phases["emotion text"]["kv_positions"] == prompt + 5
            # the tiny model's cache: 2 layers and one layer's concatenation, 2 KV heads of 16, float16
            assert model.kv_bytes(prompt + 5) == (2 + 1) * (prompt + 5) * 2 * 2 * 16 * 2
            assert cut() == [
                "indextts2: the emotion model's answer was cut at 5 tokens (the original IndexTTS-2 lets it run to "
                "32768); the emotion is read from the part before the cut, so it and the speech may differ from "
                "the original's"]
            caplog.clear()
            config.do_sample = False  # greedy: its first token is known, and made the end of the answer
            with torch.inference_mode():
                ids = model.prompt("so happy")
                first = model.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=1,
                                             pad_token_id=model.tokenizer.eos_token_id)[0, -1].item()
            config.eos_token_id = first
            model.max_answer_tokens = 1  # an answer that ends right at the cap is not cut
            engine.emotion_from_text(rt.request(seed=1), "so happy", 1)
            assert cut() == []
    finally:
        model.max_answer_tokens, config.eos_token_id, config.do_sample = MAX_ANSWER_TOKENS, end, sampled
        engine.text_emotions.clear()


def test_the_decoding_draws_after_the_emotion_model(folder: Path) -> None:
    """Upstream seeds once, lets the emotion model sample, then decodes from the same random
    stream: with a greedy emotion model, text gives the codes of its weights given as a vector;
    with a sampling one (Qwen3's generation config) the decoding's draws come after its own."""
    from mizuoto_runtime.engines.indextts2.emotion import Emotion

    rt = Runtime()
    engine = rt.engine("indextts2", folder)
    model = engine.emotion_model
    assert model is not None and model.model.generation_config.do_sample
    sampled, _, _ = say(rt, folder, from_text=True)
    weights, _ = engine.text_emotions[(TEXT, SAMPLING.seed)]  # the spoken text, read by the emotion model
    by_vector, _, _ = say(rt, folder, vector=weights)
    assert not torch.equal(sampled, by_vector)
    engine.text_emotions.clear()
    model.model.generation_config.do_sample = False
    try:
        greedy, _, _ = say(rt, folder, from_text=True)
        greedy_weights, _ = engine.text_emotions[(TEXT, SAMPLING.seed)]
    finally:
        model.model.generation_config.do_sample = True
        engine.text_emotions.clear()
    assert torch.equal(greedy, say(rt, folder, vector=greedy_weights)[0])
    assert Emotion(text="x", from_text=True).key() != Emotion(text="y", from_text=True).key()


def test_the_decoding_starts_after_upstreams_w2v_bert_draws(folder: Path) -> None:
    """Upstream's w2v-BERT (transformers 4.52) draws one number per layer on each of its two calls
    of a request (the voice, the emotion reference) between the seed and the decoding: the codes
    are those of a decoding seeded, then advanced by those draws."""
    from mizuoto_runtime.engines.indextts2 import pipeline

    rt = Runtime()
    engine = rt.engine("indextts2", folder)
    assert engine.w2v.upstream_draws == 18  # the tiny w2v-BERT's layers, though only 17 are kept
    ctx = rt.request(seed=SAMPLING.seed)
    voice = engine.voice_prompt(ctx, REFERENCE)
    codes = engine.generate(ctx, TEXT, voice, SAMPLING).tokens
    text = torch.tensor([engine.tokenizer.segments(TEXT)[0]], dtype=torch.int32)
    with torch.inference_mode(), engine.seeded(SAMPLING.seed):
        for _ in range(2 * 18):
            torch.rand([])
        raw = pipeline.decode_codes(engine.gpt, voice.data["spk_latent"], text, voice.data["own_emotion"],
                                    engine.decode_settings(SAMPLING), CODES)
    assert torch.equal(pipeline.cut_at_stop(raw, engine.gpt.cfg.stop_mel_token), codes)


def test_no_emotion_is_the_reference_as_emotion_audio(folder: Path) -> None:
    """Upstream without an emotion audio takes the reference itself as one (loaded at 16 kHz
    directly): the same audio as with the reference given as the emotion audio, at strength 1."""
    rt = Runtime()
    _, base, _ = say(rt, folder)
    _, same, _ = say(rt, folder, audio=REFERENCE, alpha=1.0)
    assert torch.equal(base, same)
    engine = rt.engine("indextts2", folder)
    voice = next(iter(engine.voices.values()))
    assert not torch.equal(voice.data["own_emotion"], voice.data["base_emotion"])


def test_random_emotion_rows_follow_the_seed(folder: Path) -> None:
    """`random`: each emotion's matrix row drawn by Python's randint from the request's seed, in
    order (upstream's use_random after random.seed); otherwise the row nearest the voice."""
    import random

    from mizuoto_runtime.engines.indextts2 import pipeline

    rt = Runtime()
    engine = rt.engine("indextts2", folder)
    tables, style = engine.tables, torch.randn(1, 192, generator=torch.Generator().manual_seed(0))
    rng = random.Random(7)
    expected = [rng.randint(0, len(block) - 1) for block in tables.emo_matrix]
    assert pipeline.emotion_rows(tables, style, random.Random(7)) == expected
    nearest = pipeline.emotion_rows(tables, style)
    for i, block in zip(nearest, tables.spk_matrix):
        sims = torch.nn.functional.cosine_similarity(style, block, dim=1)
        assert sims[i] == sims.max()
    vector = (0.3, 0.6, 0, 0, 0, 0, 0.1, 0)  # the tiny matrix has two rows for angry and surprised
    first = say(rt, folder, vector=vector, random=True)[1]
    assert torch.equal(first, say(rt, folder, vector=vector, random=True)[1])
    seeds = [s for s in range(20) if pipeline.emotion_rows(tables, style, random.Random(s)) != nearest]
    assert seeds, "some seed picks another row than the nearest"


def test_the_console_flags_make_the_emotion() -> None:
    """`mizuoto say`'s emotion flags: text for the emotion model, or the spoken text, with a random
    variant; weights toned down with --emotion-balance; nothing set, no emotion."""
    from mizuoto_runtime.app import cli
    from mizuoto_runtime.engines.indextts2.emotion import Emotion

    def options(*flags: str) -> dict:
        return cli._voice_options(cli._parser().parse_args(["say", "--engine", "indextts2", *flags, "hi"]))

    assert options() == {}
    assert options("--emotion-text", "so sad", "--emotion-strength", "0.5") == {
        "emotion": Emotion(alpha=0.5, text="so sad", from_text=True)}
    assert options("--emotion-from-text", "--emotion-random") == {
        "emotion": Emotion(from_text=True, random=True)}
    assert options("--emotion", "calm=1", "--emotion-balance") == {"emotion": Emotion(vector=(0,) * 7 + (0.5625,))}


def test_balanced_weights_as_upstreams_web_ui() -> None:
    """normalize_emo_vec: biased per emotion, then scaled to a sum of at most 0.8."""
    from mizuoto_runtime.engines.indextts2.emotion import Emotion, balanced

    assert balanced((0, 0, 0.5, 0, 0, 0, 0, 0)) == (0, 0, 0.5, 0, 0, 0, 0, 0)  # sad's bias is 1, sum under 0.8
    assert balanced((0,) * 7 + (1.0,)) == (0,) * 7 + (0.5625,)
    loud = balanced((1.0,) * 8)
    assert sum(loud) == pytest.approx(0.8) and loud[0] / loud[7] == pytest.approx(0.9375 / 0.5625)
    emotion = Emotion.from_inputs(None, "calm=1", 1.0, balance=True)
    assert emotion is not None and emotion.vector == (0,) * 7 + (0.5625,)
    by_text = Emotion.from_inputs(None, "", 0.5, from_text=True)
    assert by_text == Emotion(alpha=0.5, from_text=True) and by_text.by_weights


def test_emotion_answers_parse_as_upstream() -> None:
    """The emotion model's answer -> eight weights (upstream's QwenEmotion rules)."""
    from mizuoto_runtime.engines.indextts2.emotion_text import parse

    assert parse('{"高兴": 0.5, "悲伤": 2.0}', "x") == (0.5, 0.0, 1.2, 0.0, 0.0, 0.0, 0.0, 0.0)
    assert parse('高兴": 0.7, 自然: 0.3 trailing', "x") == (0.7, 0, 0, 0, 0, 0, 0, 0.3)  # not JSON: pairs
    assert parse('{"悲伤": 0.9}', "so gloomy") == (0, 0, 0, 0, 0, 0.9, 0, 0)  # melancholic words swap
    assert parse('{"emotion": "angry"}', "x") == (0, 1.0, 0, 0, 0, 0, 0, 0)
    assert parse('"surprised"', "x") == (0, 0, 0, 0, 0, 0, 1.0, 0)
    assert parse("nothing here", "x") == (0, 0, 0, 0, 0, 0, 0, 1.0)  # none detected: calm


@pytest.mark.parametrize("step", [3, 20])  # in the talker (at most 13 calls here), in the flow (25 steps)
def test_progress_per_code_and_step_and_interrupt(folder: Path, step: int) -> None:
    """Progress and interrupt once per GPT call (talker) and per Euler step (flow): an interrupt
    stops the request there, with one clear error."""
    from mizuoto_runtime import CancelledError

    from support.interrupt import interrupt_at

    rt = Runtime()
    engine = rt.engine("indextts2", folder)
    cancel_check, on_progress = interrupt_at(step)
    seen: list[tuple[int, int]] = []
    with pytest.raises(CancelledError):
        rt.say(engine, TEXT, reference=REFERENCE, sampling=SAMPLING, cancel_check=cancel_check,
               on_progress=lambda d, t: (seen.append((d, t)), on_progress(d, t)))
    assert seen and seen[-1][0] >= step
    assert seen[-1][1] == (CODES + 1 if step == 3 else 25)  # stopped in the talker, or in the flow


def test_reference_audio_is_resampled_as_upstream_loads_it(folder: Path) -> None:
    """Upstream loads the reference with librosa at 22.05 kHz (soxr_hq), cuts 15 s, and makes the
    16 kHz copy with torchaudio's resampler: the same numbers here."""
    import librosa
    import torchaudio

    engine = Runtime().engine("indextts2", folder)
    wav = 0.3 * torch.sin(torch.arange(48000 * 16) / 7.0).unsqueeze(0)
    wav_22k, wav_16k = engine.prompt_audio(Audio(wav, 48000))
    expected = torch.from_numpy(librosa.resample(wav.numpy(), orig_sr=48000, target_sr=22050, res_type="soxr_hq"))
    assert torch.equal(wav_22k, expected[:, :15 * 22050])
    assert torch.equal(wav_16k, torchaudio.transforms.Resample(22050, 16000)(wav_22k))
