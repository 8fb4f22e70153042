"""The lean Qwen3-TTS talker loop against the package's own loop (issue 13; M24, M53, M57).

The package's loop (``engine.talker_loop = "upstream"``) is the reference: the lean loop must
give `torch.equal` codes and audio in every voice mode with sampling on, under other sampling
settings, at the end of speech, with the static KV cache, and streamed on the simulated device.
Skipped where `qwen_tts` is not installed.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mizuoto_runtime import Runtime
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines import Sampling
from mizuoto_runtime.memory import graphs

from conftest import require_qwen_tts
from support.cuda_standin import CudaStandIn
from support.threads import another_request_holding

require_qwen_tts()  # the engine's import: a bare `import qwen_tts` fails on transformers 5.x

from mizuoto_runtime.engines.qwen3tts import loop as qwen3tts_loop  # noqa: E402  (imports transformers)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

Checkpoint = Callable[[str], Path]
REFERENCE = Audio(0.3 * torch.sin(torch.arange(16000) / 6.0).unsqueeze(0), 16000)
TEXT = "Hello from the tiny talker."
FRAMES = 6
MODES = {
    "base x-vector": ("base", {"reference": REFERENCE}),
    "base icl": ("base", {"reference": REFERENCE, "transcript": "a reference sentence"}),
    "custom voice": ("custom_voice", {"speaker": "bob", "instruct": "speak happily"}),
    "voice design": ("voice_design", {"instruct": "A calm low voice."}),
}


def sampling(**overrides: Any) -> Sampling:
    return Sampling(**{"seed": 5, "max_new_tokens": FRAMES + 1, "language": "english", **overrides})


def run(rt: Runtime, folder: Path, loop: str, how: Sampling, decode: bool = True,
        **voice: Any) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, Any]]:
    """Codes, audio and meta of one request, with `loop` as the talker loop."""
    engine = rt.engine("qwen3tts", folder)
    engine.talker_loop = loop
    ctx = rt.request(how.seed)
    codes = engine.generate(ctx, TEXT, engine.voice_prompt(ctx, **voice), how)
    audio = engine.decode(ctx, codes).waveform if decode else None
    return codes.tokens, audio, ctx.meta


@pytest.mark.parametrize("mode", sorted(MODES))
def test_lean_loop_equals_the_upstream_loop_in_every_voice_mode(qwen3tts_checkpoint: Checkpoint, mode: str) -> None:
    model_type, voice = MODES[mode]
    folder = qwen3tts_checkpoint(model_type)
    rt = Runtime()
    up_codes, up_audio, up_meta = run(rt, folder, "upstream", sampling(), **voice)
    codes, audio, meta = run(rt, folder, "lean", sampling(), **voice)
    assert codes.shape == (FRAMES, 16)
    assert torch.equal(codes, up_codes) and torch.equal(audio, up_audio), mode
    assert meta["applied"]["talker_loop"] == "lean" and up_meta["applied"]["talker_loop"] == "upstream"
    other, _, _ = run(rt, folder, "lean", sampling(seed=6), decode=False, **voice)
    assert not torch.equal(other, codes)  # sampling is on: the seed matters


@pytest.mark.parametrize("settings", [
    {"top_p": 0.8, "subtalker_top_p": 0.7},
    {"temperature": 1.3, "top_k": 5, "subtalker_temperature": 0.5, "subtalker_top_k": 3},
    {"repetition_penalty": 1.5},
    {"do_sample": False, "subtalker_do_sample": False},
])
def test_lean_loop_follows_every_sampling_setting(qwen3tts_checkpoint: Checkpoint, settings: dict[str, Any]) -> None:
    folder = qwen3tts_checkpoint("custom_voice")
    rt = Runtime()
    voice = {"speaker": "alice"}
    up, _, _ = run(rt, folder, "upstream", sampling(**settings), decode=False, **voice)
    lean, _, _ = run(rt, folder, "lean", sampling(**settings), decode=False, **voice)
    assert torch.equal(lean, up), settings


def _speaks_briefly(rt: Runtime, folder: Path) -> None:
    """Make the end token win whenever another logit is positive: speech ends after a few frames."""
    talker = rt.engine("qwen3tts", folder).tts.model.talker
    eos = talker.config.codec_eos_token_id
    with torch.no_grad():
        talker.codec_head.weight[eos] = 50 * talker.codec_head.weight[0]


@pytest.mark.parametrize("lagged", [False, True])
def test_end_of_speech_stops_where_upstream_stops(qwen3tts_checkpoint: Checkpoint, lagged: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The end token is read one frame late on accelerators (`lagged`, forced here on the CPU):
    the frames after it are dropped, the codes are upstream's."""
    if lagged:
        init = qwen3tts_loop._StopCheck.__init__

        def lagging(self: Any, device: torch.device) -> None:
            init(self, device)
            self.lagged = True

        monkeypatch.setattr(qwen3tts_loop._StopCheck, "__init__", lagging)
    folder = qwen3tts_checkpoint("voice_design")
    rt = Runtime()
    _speaks_briefly(rt, folder)
    how = sampling(max_new_tokens=40)
    up, up_audio, _ = run(rt, folder, "upstream", how, instruct="brief")
    lean, audio, _ = run(rt, folder, "lean", how, instruct="brief")
    assert 1 <= up.shape[0] < 39  # it stopped early
    assert torch.equal(lean, up) and torch.equal(audio, up_audio)


@pytest.mark.parametrize("placement", ["plain", "none", "half"])
@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_every_placement_and_kv_cache_is_exact(qwen3tts_checkpoint: Checkpoint, placement: str,
                                               kv_cache: str) -> None:
    """M57 + M53: the lean loop, all units streamed (`none`) or half placed on the simulated
    strict device, with either KV cache, gives the upstream loop's plain codes and audio;
    the static cache is named in `meta.applied`."""
    folder = qwen3tts_checkpoint("base")
    voice = {"reference": REFERENCE, "transcript": "a reference sentence"}
    expected, expected_audio, _ = run(Runtime(), folder, "upstream", sampling(), **voice)
    settings: dict[str, Any] = {"compute.kv_cache": kv_cache}
    if placement != "plain":
        settings.update({"compute.simulate_vram_mb": 256,
                         "compute.vram_mode": "none" if placement == "none" else "normal"})
    rt = Runtime(settings)
    if placement == "half":
        talker = rt.engine("qwen3tts", folder).talker
        talker.cap_bytes = (talker.min_working_set + talker.size_bytes) // 2
    codes, audio, meta = run(rt, folder, "lean", sampling(), **voice)
    assert torch.equal(codes, expected) and torch.equal(audio, expected_audio), (placement, kv_cache)
    assert meta["applied"]["kv_cache"] == kv_cache
    if placement != "plain":
        assert meta["memory"]["partial"]["qwen3tts:talker"] and meta["memory"]["streamed_mb"] > 0


def test_settings_the_lean_loop_does_not_reproduce_run_the_upstream_loop(qwen3tts_checkpoint: Checkpoint) -> None:
    """A generation config asking for another logits processor: the package's loop runs (same
    codes as asking for it), progress still moves per step, and `meta.applied` says why."""
    folder = qwen3tts_checkpoint("custom_voice")
    rt = Runtime()
    engine = rt.engine("qwen3tts", folder)
    engine.tts.model.talker.generation_config.no_repeat_ngram_size = 2
    up, _, _ = run(rt, folder, "upstream", sampling(), decode=False, speaker="bob")
    steps: list[int] = []
    ctx = rt.manager.request(generator=torch.Generator().manual_seed(5), on_progress=lambda d, _t: steps.append(d))
    engine.talker_loop = "lean"
    codes = engine.generate(ctx, TEXT, engine.voice_prompt(ctx, speaker="bob"), sampling())
    assert torch.equal(codes.tokens, up)
    applied = ctx.meta["applied"]
    assert applied["talker_loop"].startswith("upstream (") and "no_repeat_ngram_size" in applied["talker_loop"]
    assert applied["kv_cache"] == "dynamic" and applied["cuda_graphs"].startswith("off")
    assert steps[:FRAMES + 1] == list(range(FRAMES + 1))


def test_cuda_graph_refusals_are_named(qwen3tts_checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """M24, M54: off a CUDA device, while a host (ComfyUI's dynamic VRAM, with the reason the
    bridge sets) forbids capture, and under the cudaMallocAsync allocator, no graph is captured
    and `meta.applied.cuda_graphs` says why, in plain words."""
    from mizuoto_runtime.app.comfy_bridge import AIMDO_GRAPH_REFUSAL
    from mizuoto_runtime.memory.cuda_allocator import ALLOC_CONF

    folder = qwen3tts_checkpoint("custom_voice")
    rt = Runtime()
    _, _, meta = run(rt, folder, "lean", sampling(), decode=False, speaker="bob")
    assert meta["applied"]["cuda_graphs"] == "off: cpu is not a CUDA device"
    graphs.refuse_capture(AIMDO_GRAPH_REFUSAL)
    try:
        _, _, meta = run(rt, folder, "lean", sampling(), decode=False, speaker="bob")
    finally:
        graphs.refuse_capture(None)
    assert meta["applied"]["cuda_graphs"] == f"off: {AIMDO_GRAPH_REFUSAL}"
    monkeypatch.setenv(ALLOC_CONF, "")
    monkeypatch.delenv(ALLOC_CONF)  # restored after the test
    asynchronous = Runtime({"compute.cuda_allocator": "async"})
    _, _, meta = run(asynchronous, folder, "lean", sampling(), decode=False, speaker="bob")
    reason = meta["applied"]["cuda_graphs"]
    assert reason.startswith("off: the CUDA allocator is cudaMallocAsync") and "compute.cuda_allocator" in reason
    assert not re.search(r"\bM\d+\b", reason)  # what a user reads names no requirement


def test_graph_path_replays_exactly_on_a_cpu_stand_in(qwen3tts_checkpoint: Checkpoint,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's CUDA Graph plumbing, with a stand-in for capture (no CUDA here): warm-up runs
    draw random numbers that `keep_rng` gives back, each replay reruns the captured function on
    the static inputs the loop fills, and the codes stay the upstream loop's."""
    captured: list[dict[str, Any]] = []

    class StandIn:
        def __init__(self, fn: Callable[[], Any]) -> None:
            self.fn = fn
            self.replays = 0

        def replay(self) -> Any:
            self.replays += 1
            return self.fn()

    def capture(handle: Any, fn: Callable[[], Any], *, keep_rng: bool = False, **_kw: Any) -> StandIn:
        state = torch.get_rng_state()
        fn(), fn()  # the warm-up runs
        if keep_rng:
            torch.set_rng_state(state)
        graph = StandIn(fn)
        captured.append({"keep_rng": keep_rng, "graph": graph})
        return graph

    monkeypatch.setattr(graphs, "eligible", lambda handle: (True, "eligible"))
    monkeypatch.setattr(graphs, "capture", capture)
    folder = qwen3tts_checkpoint("voice_design")
    rt = Runtime()
    up, _, _ = run(rt, folder, "upstream", sampling(), decode=False, instruct="calm")
    lean, _, meta = run(rt, folder, "lean", sampling(), decode=False, instruct="calm")
    assert torch.equal(lean, up)
    assert meta["applied"]["cuda_graphs"] == "on: the code predictor's steps"
    assert len(captured) == 1 and captured[0]["keep_rng"] and captured[0]["graph"].replays == FRAMES


def test_a_failed_capture_finishes_eagerly_with_the_same_codes(qwen3tts_checkpoint: Checkpoint,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """Issue 27: the capture fails inside CUDA after the warm-up drew two frames of random
    numbers (CUDA's calls stood in for on the CPU, `CudaStandIn`; the capture code is ours).
    The device generator goes back, the request finishes eagerly with the upstream loop's codes,
    `meta.applied.cuda_graphs` gives the reason, and the failure is logged once."""
    folder = qwen3tts_checkpoint("custom_voice")
    rt = Runtime()
    up, _, _ = run(rt, folder, "upstream", sampling(), decode=False, speaker="bob")
    cuda = CudaStandIn(monkeypatch, fail_at_end=True)
    monkeypatch.setattr(graphs, "eligible", lambda handle: (True, "eligible"))
    with caplog.at_level("WARNING", logger="mizuoto_runtime.memory.graphs"):
        for _ in range(2):
            lean, _, meta = run(rt, folder, "lean", sampling(), decode=False, speaker="bob")
            assert torch.equal(lean, up)
            assert meta["applied"]["cuda_graphs"].startswith("off: capture failed (CUDA error")
    assert cuda.names().count("release_pool") == 2  # each request tried, and let its pool go
    assert len([r for r in caplog.records if "capture failed" in r.getMessage()]) == 1


def test_no_capture_while_another_request_holds_the_device(qwen3tts_checkpoint: Checkpoint,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27, `compute.gpu_jobs` = 2: another request holds the simulated device, so the
    talker runs eagerly (no CUDA call made), exact, and `meta.applied` says why."""
    folder = qwen3tts_checkpoint("custom_voice")
    up, _, _ = run(Runtime(), folder, "upstream", sampling(), decode=False, speaker="bob")
    rt = Runtime({"compute.simulate_vram_mb": 256, "compute.gpu_jobs": 2})
    cuda = CudaStandIn(monkeypatch)
    monkeypatch.setattr(graphs, "eligible", lambda handle: (True, "eligible"))
    with another_request_holding(rt.manager.slots(torch.device("cpu"))):
        lean, _, meta = run(rt, folder, "lean", sampling(), decode=False, speaker="bob")
    assert torch.equal(lean, up)
    assert meta["applied"]["cuda_graphs"] == f"off: {graphs.BUSY}"
    assert cuda.calls == []


def test_sampler_draws_what_generate_draws() -> None:
    """`Sampler` against transformers' processors and `torch.multinomial`, step by step: the
    same tokens and the same generator state after every draw."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinLengthLogitsProcessor,
        MinNewTokensLengthLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SuppressTokensLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    vocab, eos, suppress = 96, 90, list(range(80, 96))
    suppress.remove(eos)
    processors = LogitsProcessorList([
        RepetitionPenaltyLogitsProcessor(1.3), MinLengthLogitsProcessor(2, eos, device="cpu"),
        MinNewTokensLengthLogitsProcessor(0, 2, eos, device="cpu"),
        SuppressTokensLogitsProcessor(suppress, device="cpu"),
        TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.9),
    ])
    sampler = qwen3tts_loop.Sampler(vocab, torch.device("cpu"), do_sample=True, temperature=0.7, top_k=20,
                                    top_p=0.9, repetition_penalty=1.3, eos=eos, min_tokens=2, suppress=suppress)
    g = torch.Generator().manual_seed(1)
    history = torch.zeros(1, 0, dtype=torch.long)
    for step in range(40):
        logits = 4 * torch.randn(1, vocab, generator=g)
        torch.manual_seed(100 + step)
        expected = torch.multinomial(torch.softmax(processors(history, logits.clone()), dim=-1), 1)
        state = torch.get_rng_state()
        torch.manual_seed(100 + step)
        got = sampler(logits, step)
        assert torch.equal(got, expected), step
        assert torch.equal(torch.get_rng_state(), state)
        history = torch.cat([history, got], dim=1)
    assert len(set(history[0].tolist())) > 5


def test_the_estimate_follows_the_loop_and_the_kv_cache(qwen3tts_checkpoint: Checkpoint) -> None:
    """M46: the lean loop keeps one hidden state per step, not every layer's; the static cache
    is estimated as the `BufferCache` it allocates (`peak_bytes(kind="static")`)."""
    from mizuoto_runtime.nn.kv_cache import peak_bytes

    rt = Runtime({"compute.kv_cache": "static"})
    engine = rt.engine("qwen3tts", qwen3tts_checkpoint("custom_voice"))
    tc = engine.tts.model.config.talker_config
    cp = tc.code_predictor_config
    prompt, frames = 30, 100
    lean = engine.talker_memory(prompt, frames, loop="lean", kv_cache="dynamic")
    upstream = engine.talker_memory(prompt, frames, loop="upstream", kv_cache="dynamic")
    assert upstream - lean == tc.num_hidden_layers * (prompt + frames) * tc.hidden_size * 4
    static = engine.talker_memory(prompt, frames)  # the engine's loop (lean) and the policy's cache
    expected = sum(peak_bytes(2 * 4 * c.head_dim * c.num_key_value_heads, c.num_hidden_layers, n, "static")
                   - peak_bytes(2 * 4 * c.head_dim * c.num_key_value_heads, c.num_hidden_layers, n, "dynamic")
                   for c, n in ((tc, prompt + frames), (cp, tc.num_code_groups)))  # keys + values, float32
    assert static - lean == expected
    engine.tts.model.talker.generation_config.no_repeat_ngram_size = 3  # the lean loop would hand over
    assert engine.talker_memory(prompt, frames) == engine.talker_memory(prompt, frames, loop="upstream")
