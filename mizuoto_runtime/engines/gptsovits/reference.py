"""GPT-SoVITS's reference stages: each recorded stage of a fixture folder (``ckpt/``,
``reference.safetensors``, ``reference.json``) run with the engine's own loader and model code
on its recorded inputs, compared with its recorded outputs.

A stage runs when the tensors it needs are in the file (a v2 folder has no ``sv.*`` or
``vits.out.ge512``); nothing depends on one folder's sizes. Tolerances (the fixture README):
one module or one step ``1e-4 * max(1, max|ref|)``, a chained run to the waveform ``1e-3``,
integers identical.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from ...errors import CheckpointError
from ...nn.features import kaldi_fbank
from ..reference import Check, Reference, Stage
from .checkpoint import build_sv, build_t2s, build_vits, read_gpt, read_sovits, read_sv_state
from .spectrogram import spectrogram
from .t2s import Text2Semantic
from .vits import Synthesizer


# ---- the checkpoint's parts, loaded once per folder by the engine's own loader ------------------
def _one(ref: Reference, pattern: str, what: str) -> Path:
    found = sorted(ref.ckpt.glob(pattern))
    if len(found) != 1:
        raise CheckpointError(f"{ref.ckpt}: expected one {what} ({pattern}), found {len(found)}")
    return found[0]


def _t2s(ref: Reference) -> Text2Semantic:
    return ref.shared("t2s", lambda: build_t2s(read_gpt(_one(ref, "*.ckpt", "GPT file"))))


def _vits(ref: Reference) -> Synthesizer:
    return ref.shared("vits", lambda: build_vits(read_sovits(_one(ref, "*.pth", "SoVITS file"))))


def _sv(ref: Reference) -> torch.nn.Module:
    def build() -> torch.nn.Module:
        path = _one(ref, "sv/*.ckpt", "speaker-verification file")
        return build_sv(read_sv_state(path), path)

    return ref.shared("sv", build)


# ---- the stages (every model in float32 on the CPU, no autograd) ----------------------------------
@torch.no_grad()
def _t2s_embed(ref: Reference) -> list[Check]:
    t = ref.tensor
    m = _t2s(ref)
    xy = m.embed_prompt(t("t2s.in.phoneme_ids"), t("t2s.in.bert_feature"), t("t2s.in.prompt_semantic"))
    mask = m.prompt_mask(t("t2s.in.phoneme_ids").shape[1], t("t2s.in.prompt_semantic").shape[1], xy.device)
    return [Check("t2s.out.xy_pos", xy), Check("t2s.out.attn_mask", mask.to(torch.uint8), "exact")]


@torch.no_grad()
def _t2s_prompt(ref: Reference) -> list[Check]:
    t = ref.tensor
    m = _t2s(ref)
    mask = t("t2s.out.attn_mask").bool()
    hidden, cache = m.run_prompt(t("t2s.out.xy_pos"), mask)
    out = [Check("t2s.out.prompt_hidden", hidden), Check("t2s.out.prompt_logits", m.ar_predict_layer(hidden))]
    for i, (k, v) in enumerate(cache):
        out += [Check(f"t2s.out.k_cache.{i}", k), Check(f"t2s.out.v_cache.{i}", v)]
    return out


@torch.no_grad()
def _t2s_step(ref: Reference) -> list[Check]:
    t = ref.tensor
    m = _t2s(ref)
    layers = len(m.h.layers)
    cache = [(t(f"t2s.out.k_cache.{i}"), t(f"t2s.out.v_cache.{i}")) for i in range(layers)]
    x = m.step_embedding(t("t2s.in.step_token"), t("t2s.in.prompt_semantic").shape[1])
    hidden, new = m.run_step(t("t2s.out.step_xy_pos"), cache)
    out = [Check("t2s.out.step_xy_pos", x), Check("t2s.out.step_logits", m.ar_predict_layer(hidden[:, -1]))]
    for i, (k, v) in enumerate(new):
        out += [Check(f"t2s.out.step_k_cache.{i}", k), Check(f"t2s.out.step_v_cache.{i}", v)]
    return out


@torch.no_grad()
def _t2s_sample(ref: Reference) -> list[Check]:
    """Sampled tokens right after ``torch.manual_seed(seed)``, for each recorded setting; the
    naive and the batched upstream loops gave the same tokens, so both are compared with ours."""
    t = ref.tensor
    s = ref.meta["t2s_sampling"]
    out: list[Check] = []
    for setting, suffix in (("default", "default_y"), ("greedy", "topk1_y")):
        p = s[setting]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(s["seed"]))
            r = _t2s(ref).generate(t("t2s.in.phoneme_ids"), t("t2s.in.bert_feature"), t("t2s.in.prompt_semantic"),
                                   top_k=int(p["top_k"]), top_p=float(p["top_p"]), temperature=float(p["temperature"]),
                                   repetition_penalty=float(p["repetition_penalty"]),
                                   early_stop_num=int(s["early_stop_num"]))
        for loop in ("naive", "batch"):
            if ref.has(f"t2s.out.{loop}_{suffix}"):
                out.append(Check(f"t2s.out.{loop}_{suffix}", r.tokens, "exact"))
        idx_key = f"naive_{'default' if setting == 'default' else 'topk1'}_idx"
        if idx_key in s:
            out.append(Check(f"t2s_sampling.{idx_key}", torch.tensor([r.idx]), "exact",
                             want=torch.tensor([int(s[idx_key])])))
    return out


@torch.no_grad()
def _vits_latent(ref: Reference) -> list[Check]:
    t = ref.tensor
    m = _vits(ref)
    codes = m.extract_latent(t("vits.in.ssl"))
    return [Check("vits.out.ssl_proj", m.ssl_proj(t("vits.in.ssl"))), Check("vits.out.prompt_codes", codes, "exact"),
            Check("vits.out.prompt_quantized", m.quantizer.decode(t("vits.out.prompt_codes").transpose(0, 1)))]


@torch.no_grad()
def _spectrogram(ref: Reference) -> list[Check]:
    d = ref.meta.get("hps_data", {})
    spec = spectrogram(ref.tensor("spec.in.wav32k"), int(d.get("filter_length", 2048)), int(d.get("hop_length", 640)),
                       int(d.get("win_length", 2048)))
    return [Check("spec.out.spec", spec)]


def _sv_list(ref: Reference) -> list[torch.Tensor] | None:
    return [ref.tensor("vits.in.sv_emb")] if _vits(ref).cfg.is_pro else None


@torch.no_grad()
def _vits_ge(ref: Reference) -> list[Check]:
    t = ref.tensor
    m, spec = _vits(ref), t("spec.out.spec")
    mask = torch.ones(1, 1, spec.shape[2], dtype=spec.dtype)
    out = [Check("vits.out.ref_enc_ge", m.ref_enc(spec[:, :704] * mask, mask))]
    if m.cfg.is_pro:
        ge = m.reference_embedding(spec, t("vits.in.sv_emb"))
        out += [Check("vits.out.ge_after_sv", ge),
                Check("vits.out.ge512", m.ge_to512(t("vits.out.ge_after_sv").transpose(2, 1)).transpose(2, 1))]
    return out


def _recorded_ge(ref: Reference) -> torch.Tensor:
    t = ref.tensor
    return t("vits.out.ge_after_sv") if _vits(ref).cfg.is_pro else t("vits.out.ref_enc_ge")


@torch.no_grad()
def _vits_prior(ref: Reference) -> list[Check]:
    t = ref.tensor
    m = _vits(ref)
    x, m_p, logs_p, _ = m.prior(t("vits.in.codes"), t("vits.in.text"), _recorded_ge(ref))
    return [Check("vits.out.quantized", m.quantizer.decode(t("vits.in.codes"))), Check("vits.out.enc_p_x", x),
            Check("vits.out.m_p", m_p), Check("vits.out.logs_p", logs_p)]


@torch.no_grad()
def _vits_noise(ref: Reference) -> list[Check]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(ref.meta["vits_noise_seed"]))
        noise = torch.randn_like(ref.tensor("vits.out.m_p"))
    return [Check("vits.out.noise", noise)]


@torch.no_grad()
def _vits_flow(ref: Reference) -> list[Check]:
    t = ref.tensor
    m = _vits(ref)
    scale = float(ref.meta.get("vits_decode_args", {}).get("noise_scale", 0.5))
    z_p = t("vits.out.m_p") + t("vits.out.noise") * torch.exp(t("vits.out.logs_p")) * scale
    mask = torch.ones(1, 1, z_p.shape[2], dtype=z_p.dtype)
    z = m.flow.reverse(t("vits.out.z_p"), mask, _recorded_ge(ref))
    return [Check("vits.out.z_p", z_p), Check("vits.out.z", z)]


@torch.no_grad()
def _vits_decode(ref: Reference) -> list[Check]:
    """End to end from codes, phonemes and the reference spectrogram, with upstream's noise draw."""
    t = ref.tensor
    m = _vits(ref)
    args = ref.meta.get("vits_decode_args", {})
    out: list[Check] = []
    for name, scale in (("vits.out.wav", float(args.get("noise_scale", 0.5))), ("vits.out.wav_noise0", 0.0)):
        if not ref.has(name):
            continue
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(ref.meta["vits_noise_seed"]))
            wav = m.decode(t("vits.in.codes"), t("vits.in.text"), [t("spec.out.spec")], _sv_list(ref), scale,
                           float(args.get("speed", 1)))
        out.append(Check(name, wav, "chain"))
    return out


@torch.no_grad()
def _sv_fbank(ref: Reference) -> list[Check]:
    t = ref.tensor
    fbank = kaldi_fbank(t("sv.in.wav16k")[0:1], num_mel_bins=t("sv.out.fbank").shape[-1], sample_frequency=16000)
    return [Check("sv.out.fbank", fbank.unsqueeze(0))]


@torch.no_grad()
def _sv_embedding(ref: Reference) -> list[Check]:
    t = ref.tensor
    out = [Check("sv.out.embedding", _sv(ref)(t("sv.out.fbank")))]
    if _has(ref, "sv.in.fbank_random", "sv.out.embedding_random"):
        out.append(Check("sv.out.embedding_random", _sv(ref)(t("sv.in.fbank_random"))))
    return out


def _has(ref: Reference, *names: str) -> bool:
    return all(ref.has(n) for n in names)


def stages(ref: Reference) -> Iterator[Stage]:
    """The stages `ref` recorded (`mizuoto check-reference --engine gptsovits DIR`): a stage runs
    when the tensors it needs are in the folder."""
    if _has(ref, "t2s.in.phoneme_ids", "t2s.in.bert_feature", "t2s.in.prompt_semantic", "t2s.out.xy_pos"):
        yield Stage("t2s.embed", lambda: _t2s_embed(ref))
    if _has(ref, "t2s.out.xy_pos", "t2s.out.attn_mask", "t2s.out.prompt_logits"):
        yield Stage("t2s.prompt", lambda: _t2s_prompt(ref))
    if _has(ref, "t2s.in.step_token", "t2s.out.step_xy_pos", "t2s.out.k_cache.0", "t2s.out.step_logits"):
        yield Stage("t2s.step", lambda: _t2s_step(ref))
    if _has(ref, "t2s.in.phoneme_ids", "t2s.in.bert_feature", "t2s.in.prompt_semantic", "t2s.out.naive_default_y"):
        yield Stage("t2s.sample", lambda: _t2s_sample(ref))
    if _has(ref, "vits.in.ssl", "vits.out.prompt_codes", "vits.out.prompt_quantized"):
        yield Stage("vits.quantizer", lambda: _vits_latent(ref))
    if _has(ref, "spec.in.wav32k", "spec.out.spec"):
        yield Stage("spectrogram", lambda: _spectrogram(ref))
    if _has(ref, "spec.out.spec", "vits.out.ref_enc_ge"):
        yield Stage("vits.ref_enc", lambda: _vits_ge(ref))
    if _has(ref, "vits.in.codes", "vits.in.text", "vits.out.ref_enc_ge", "vits.out.m_p"):
        yield Stage("vits.text_encoder", lambda: _vits_prior(ref))
    if _has(ref, "vits.out.m_p", "vits.out.noise"):
        yield Stage("vits.noise", lambda: _vits_noise(ref))
    if _has(ref, "vits.out.m_p", "vits.out.logs_p", "vits.out.noise", "vits.out.z_p", "vits.out.z"):
        yield Stage("vits.flow", lambda: _vits_flow(ref))
    if _has(ref, "vits.in.codes", "vits.in.text", "spec.out.spec", "vits.out.wav"):
        yield Stage("vits.decode", lambda: _vits_decode(ref))
    if _has(ref, "sv.in.wav16k", "sv.out.fbank"):
        yield Stage("sv.fbank", lambda: _sv_fbank(ref))
    if _has(ref, "sv.out.fbank", "sv.out.embedding"):
        yield Stage("sv.embedding", lambda: _sv_embedding(ref))
