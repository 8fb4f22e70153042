"""CosyVoice stages for ``mizuoto check-reference`` (issue 22): each recorded stage of a
reference folder (``../shared/fixtures/cosyvoice/<model>/``) is fed its recorded inputs and
compared with what upstream recorded. Nothing here depends on one fixture's sizes: shapes,
seeds and lengths come from the folder."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import torch

from ...nn.decoder import KVCache
from ...nn.features import mel_spectrogram
from ..reference import Check, Reference, Stage
from .checkpoint import CosyVoiceModel, load_model
from .flow import cosine_t_span
from .hift import HiFT
from .lm import RasParams
from .pipeline import SILENT_TOKENS, drop_silent, prompt_mel, speech_tokens, token2wav


# ---- the checkpoint, loaded once per folder by the engine's own loader --------------------------
def _model(ref: Reference) -> CosyVoiceModel:
    return ref.shared("model", lambda: load_model(ref.ckpt))


def _ids(ref: Reference, name: str) -> torch.Tensor:
    return ref.tensor(name).to(torch.int64)


# ---- the stages ---------------------------------------------------------------------------------
def _ulp(x: torch.Tensor) -> torch.Tensor:
    """`x` with every element moved by about one float32 ulp (fixed pattern)."""
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return (x.double() * (1 + 1.2e-7 * noise)).to(x.dtype)


def _spread(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> float:
    """How far `f`'s output moves when `x` moves by one ulp: the output's own conditioning."""
    return float((f(_ulp(x)) - f(x)).abs().max())


def _features(ref: Reference) -> list[Check]:
    spec = _model(ref).mel
    wav = ref.tensor("features.in.wav")

    def mel(w: torch.Tensor) -> torch.Tensor:
        return mel_spectrogram(w, n_fft=spec.n_fft, num_mels=spec.num_mels, sampling_rate=spec.sampling_rate,
                               hop_size=spec.hop_size, win_size=spec.win_size, fmin=spec.fmin, fmax=spec.fmax,
                               center=spec.center)

    prompt = ref.tensor("features.out.prompt_feat")
    samples = prompt.shape[1] * spec.hop_size
    spread = _spread(mel, wav)  # log of near-floor bins: FFT rounding dominates them
    return [Check("features.out.mel", mel(wav), conditioning=spread),
            Check("features.out.prompt_feat", prompt_mel(wav[:, :samples], spec), conditioning=spread)]


@torch.inference_mode()
def _prefill(ref: Reference) -> list[Check]:
    lm = _model(ref).lm
    built = lm.prefill_input(_ids(ref, "inputs.text"), _ids(ref, "inputs.prompt_text"),
                             _ids(ref, "inputs.prompt_speech_token"))
    cache = KVCache()
    hidden, logits = lm.logits(ref.tensor("llm.in.lm_input"), cache)
    checks = [Check("llm.in.lm_input", built), Check("llm.out.prefill_hidden", hidden),
              Check("llm.out.prefill_logits_last", logits), Check("llm.out.prefill_logp_last", logits.log_softmax(-1))]
    for i, (k, v) in enumerate(zip(cache.keys, cache.values)):
        checks += [Check(f"llm.out.prefill_cache_key.{i}", k), Check(f"llm.out.prefill_cache_value.{i}", v)]
    return checks


@torch.inference_mode()
def _step1(ref: Reference) -> list[Check]:
    lm = _model(ref).lm
    cache = KVCache()
    lm.logits(ref.tensor("llm.in.lm_input"), cache)
    first = int(ref.meta["llm"]["tokens"][0])
    step_input = lm.embed(lm.speech_embedding, first, torch.device("cpu"))
    hidden, logits = lm.logits(ref.tensor("llm.in.step1_input"), cache)
    return [Check("llm.in.step1_input", step_input), Check("llm.out.step1_hidden", hidden),
            Check("llm.out.step1_logits", logits)]


@torch.inference_mode()
def _teacher_forced(ref: Reference) -> list[Check]:
    lm = _model(ref).lm
    hidden = lm.backbone(ref.tensor("llm.in.tf_input"), None)
    return [Check("llm.out.tf_hidden", hidden), Check("llm.out.tf_logits", lm.llm_decoder(hidden))]


def _generation(ref: Reference, key: str, sampling: RasParams | None = None):  # noqa: ANN202
    model = _model(ref)
    torch.manual_seed(int(ref.meta[key]["seed"]))
    with torch.inference_mode():
        return speech_tokens(model, _ids(ref, "inputs.text"), _ids(ref, "inputs.prompt_text"),
                             _ids(ref, "inputs.prompt_speech_token"), sampling=sampling, keep_logits=True)


def _sampled(ref: Reference) -> list[Check]:
    meta = ref.meta["llm"]
    gen = ref.shared("generation", lambda: _generation(ref, "llm"))
    checks = [Check("llm.out.tokens", gen.tokens, "exact"),
              Check("llm.sampled_ids_per_step", gen.tokens + ([gen.stop_token] if gen.stop_token is not None else []),
                    "exact", want=meta["sampled_ids_per_step"]),
              Check("llm.ras_fallback_per_step", [int(f) for f in gen.fallbacks], "exact",
                    want=[int(f) for f in meta["ras_fallback_per_step"]])]
    if ref.has("llm.out.step_logits"):
        checks.append(Check("llm.out.step_logits", torch.stack(gen.step_logits), "chain"))
    return checks


def _top_k_1(ref: Reference) -> list[Check]:
    meta = ref.meta["llm_topk1"]
    base = _model(ref).lm.spec.sampling
    gen = _generation(ref, "llm_topk1", dataclasses.replace(base, top_k=1))
    stop = meta.get("stop_token")
    return [Check("llm_topk1.tokens", gen.tokens, "exact", want=meta["tokens"]),
            Check("llm_topk1.stop_token", -1 if gen.stop_token is None else gen.stop_token, "exact",
                  want=-1 if stop is None else stop),
            Check("llm_topk1.ras_fallback_per_step", [int(f) for f in gen.fallbacks], "exact",
                  want=[int(f) for f in meta["ras_fallback_per_step"]])]


@torch.inference_mode()
def _flow_conditions(ref: Reference) -> list[Check]:
    flow = _model(ref).flow
    token, prompt = _ids(ref, "flow.in.token"), _ids(ref, "flow.in.prompt_token")
    embedding, prompt_feat = ref.tensor("flow.in.embedding"), ref.tensor("flow.in.prompt_feat")
    emb = flow.token_embedding(torch.cat([prompt, token], dim=1))
    mu, mask, spks, cond = flow.conditions(token, prompt, prompt_feat, embedding)
    checks = [Check("flow.out.spks", spks), Check("flow.out.token_emb", emb), Check("flow.out.mu", mu),
              Check("flow.out.mask", mask), Check("flow.out.cond", cond),
              Check("flow.in.noise", flow.decoder.rand_noise[:, :, : mu.shape[2]]),
              Check("flow.in.t_span", cosine_t_span(flow.decoder.n_timesteps)[:-1])]
    if flow.encoder is not None and flow.encoder_proj is not None:
        encoder_in = ref.tensor("flow.out.encoder_in")
        h = flow.encoder(encoder_in)
        checks += [Check("flow.out.encoder_in", emb), Check("flow.out.encoder_h", h),
                   Check("flow.out.encoder_proj", flow.encoder_proj(ref.tensor("flow.out.encoder_h")))]
    else:
        assert flow.pre_lookahead_layer is not None
        checks += [Check("flow.out.prelookahead_in", emb),
                   Check("flow.out.prelookahead_h", flow.pre_lookahead_layer(ref.tensor("flow.out.prelookahead_in")))]
    return checks


@torch.inference_mode()
def _estimator(ref: Reference) -> list[Check]:
    est = _model(ref).flow.decoder.estimator
    noise = ref.tensor("flow.in.noise")
    x = noise.expand(2, -1, -1).contiguous()
    args = [ref.tensor(f"flow.in.est_t05_{n}") for n in ("mask", "mu", "t", "spks", "cond")]
    mask, mu, t, spks, cond = args
    step1_t = ref.tensor("flow.in.est_step1_t")
    return [Check("flow.out.est_t05", est(x, mask, mu, t, spks, cond)),
            Check("flow.out.est_step1", est(x, mask, mu, step1_t, spks, cond))]


@torch.inference_mode()
def _flow_solve(ref: Reference) -> list[Check]:
    flow = _model(ref).flow
    token, prompt = _ids(ref, "flow.in.token"), _ids(ref, "flow.in.prompt_token")
    mu, mask, spks, cond = flow.conditions(token, prompt, ref.tensor("flow.in.prompt_feat"),
                                           ref.tensor("flow.in.embedding"))
    full = flow.decoder(mu, mask, spks, cond)
    prompt_frames = ref.tensor("flow.in.prompt_feat").shape[1]
    return [Check("flow.out.cfm_full", full, "chain"), Check("flow.out.mel", full[:, :, prompt_frames:], "chain")]


@torch.inference_mode()
def _vocoder(ref: Reference) -> list[Check]:
    hift: HiFT = _model(ref).hift
    mel = ref.tensor("vocoder.in.mel")
    checks: list[Check] = []
    fixed = hift.m_source.fixed
    if fixed is not None:
        sine = ref.tensor("vocoder.in.fixed_sine_waves_prefix")
        uv = ref.tensor("vocoder.in.fixed_uv_prefix")
        checks += [Check("vocoder.in.fixed_rand_ini", fixed.rand_ini),
                   Check("vocoder.in.fixed_sine_waves_prefix", fixed.sine_waves(sine.shape[1])),
                   Check("vocoder.in.fixed_uv_prefix", fixed.uv(uv.shape[1]))]
    seed = ref.meta["vocoder"].get("seed")

    def run(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if seed is not None:
            torch.manual_seed(int(seed))
        return hift(m)

    wav, source, f0 = run(mel)
    # The source's phase is a running sum of F0 over every sample: rounding in F0 grows with time.
    moved = run(_ulp(mel))
    checks += [Check("vocoder.out.f0", f0, conditioning=float((moved[2] - f0).abs().max())),
               Check("vocoder.out.source", source, conditioning=float((moved[1] - source).abs().max())),
               Check("vocoder.out.wav", wav, conditioning=float((moved[0] - wav).abs().max())),
               Check("vocoder.decode_recorded_source", hift.decode(mel, ref.tensor("vocoder.out.source")),
                     want=ref.tensor("vocoder.out.wav"))]
    return checks


@torch.inference_mode()
def _e2e(ref: Reference) -> list[Check]:
    model = _model(ref)
    torch.manual_seed(int(ref.meta["e2e"]["seed"]))
    gen = speech_tokens(model, _ids(ref, "inputs.text"), _ids(ref, "inputs.prompt_text"),
                        _ids(ref, "inputs.prompt_speech_token"))
    tokens = drop_silent(gen.tokens, SILENT_TOKENS[model.version])
    mel, wav = token2wav(model, tokens, _ids(ref, "inputs.prompt_speech_token"),
                         ref.tensor("inputs.prompt_speech_feat"), ref.tensor("inputs.embedding"))
    return [Check("e2e.out.tokens", tokens, "exact"), Check("e2e.out.mel", mel, "chain"),
            Check("e2e.out.wav", wav, "chain")]


def stages(ref: Reference) -> Iterator[Stage]:
    """The stages `ref` recorded, in order."""
    yield Stage("features", lambda: _features(ref))
    yield Stage("llm.prefill", lambda: _prefill(ref))
    yield Stage("llm.step1", lambda: _step1(ref))
    yield Stage("llm.teacher_forced", lambda: _teacher_forced(ref))
    yield Stage("llm.sampled", lambda: _sampled(ref))
    if "llm_topk1" in ref.meta:
        yield Stage("llm.top_k_1", lambda: _top_k_1(ref))
    yield Stage("flow.conditions", lambda: _flow_conditions(ref))
    yield Stage("flow.estimator", lambda: _estimator(ref))
    yield Stage("flow.solve", lambda: _flow_solve(ref))
    yield Stage("vocoder", lambda: _vocoder(ref))
    yield Stage("e2e", lambda: _e2e(ref))
