"""GPT-SoVITS's reference stages: each recorded stage of a fixture folder (``ckpt/``,
``reference.safetensors``, ``reference.json``) run with the engine's own loader and model code
on its recorded inputs, compared with its recorded outputs.

A stage runs when the tensors it needs are in the file (a v2 folder has no ``sv.*`` or
``vits.out.ge512``); nothing depends on one folder's sizes. Tolerances (the fixture README):
one module or one step ``1e-4 * max(1, max|ref|)``, a chained run to the waveform ``1e-3``,
integers identical.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch

from ...errors import CheckpointError
from ...reference_check import Check, Reference, Stage
from ...nn.features import kaldi_fbank
from .spectrogram import spectrogram
from .t2s import Text2Semantic
from .vits import Synthesizer
from .checkpoint import build_sv, build_t2s, build_vits, read_gpt, read_sovits, read_sv_state

MODULE, CHAIN, EXACT = "module", "chain", "exact"


class Fixture:
    """A reference folder as the stages read it: its tensors, its json, and the models built
    from its ``ckpt/`` with the engine's own loader (once per folder)."""

    def __init__(self, ref: Reference) -> None:
        self.ref = ref
        self.meta = ref.meta
        self.tensors = ref.tensors

    def has(self, *names: str) -> bool:
        return all(self.ref.has(n) for n in names)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.ref.tensor(name)

    def _one(self, pattern: str, what: str) -> Path:
        found = sorted(self.ref.ckpt.glob(pattern))
        if len(found) != 1:
            raise CheckpointError(f"{self.ref.ckpt}: expected one {what} ({pattern}), found {len(found)}")
        return found[0]

    @property
    def t2s(self) -> Text2Semantic:
        return self.ref.shared("t2s", lambda: build_t2s(read_gpt(self._one("*.ckpt", "GPT file"))))

    @property
    def vits(self) -> Synthesizer:
        return self.ref.shared("vits", lambda: build_vits(read_sovits(self._one("*.pth", "SoVITS file"))))

    @property
    def sv(self) -> torch.nn.Module:
        def build() -> torch.nn.Module:
            path = self._one("sv/*.ckpt", "speaker-verification file")
            return build_sv(read_sv_state(path), path)

        return self.ref.shared("sv", build)


Outputs = list[tuple]  # (recorded tensor name, what we computed, kind[, what is recorded when not a tensor])


def _t2s_embed(f: Fixture) -> Outputs:
    m = f.t2s
    xy = m.embed_prompt(f["t2s.in.phoneme_ids"], f["t2s.in.bert_feature"], f["t2s.in.prompt_semantic"])
    mask = m.prompt_mask(f["t2s.in.phoneme_ids"].shape[1], f["t2s.in.prompt_semantic"].shape[1], xy.device)
    return [("t2s.out.xy_pos", xy, MODULE), ("t2s.out.attn_mask", mask.to(torch.uint8), EXACT)]


def _t2s_prompt(f: Fixture) -> Outputs:
    m = f.t2s
    mask = f["t2s.out.attn_mask"].bool()
    hidden, cache = m.run_prompt(f["t2s.out.xy_pos"], mask)
    out = [("t2s.out.prompt_hidden", hidden, MODULE), ("t2s.out.prompt_logits", m.ar_predict_layer(hidden), MODULE)]
    for i, (k, v) in enumerate(cache):
        out += [(f"t2s.out.k_cache.{i}", k, MODULE), (f"t2s.out.v_cache.{i}", v, MODULE)]
    return out


def _t2s_step(f: Fixture) -> Outputs:
    m = f.t2s
    layers = len(m.h.layers)
    cache = [(f[f"t2s.out.k_cache.{i}"], f[f"t2s.out.v_cache.{i}"]) for i in range(layers)]
    x = m.step_embedding(f["t2s.in.step_token"], f["t2s.in.prompt_semantic"].shape[1])
    hidden, new = m.run_step(f["t2s.out.step_xy_pos"], cache)
    out = [("t2s.out.step_xy_pos", x, MODULE), ("t2s.out.step_logits", m.ar_predict_layer(hidden[:, -1]), MODULE)]
    for i, (k, v) in enumerate(new):
        out += [(f"t2s.out.step_k_cache.{i}", k, MODULE), (f"t2s.out.step_v_cache.{i}", v, MODULE)]
    return out


def _t2s_sample(f: Fixture) -> Outputs:
    """Sampled tokens right after ``torch.manual_seed(seed)``, for each recorded setting; the
    naive and the batched upstream loops gave the same tokens, so both are compared with ours."""
    s = f.meta["t2s_sampling"]
    out: Outputs = []
    for setting, suffix in (("default", "default_y"), ("greedy", "topk1_y")):
        p = s[setting]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(s["seed"]))
            r = f.t2s.generate(f["t2s.in.phoneme_ids"], f["t2s.in.bert_feature"], f["t2s.in.prompt_semantic"],
                               top_k=int(p["top_k"]), top_p=float(p["top_p"]), temperature=float(p["temperature"]),
                               repetition_penalty=float(p["repetition_penalty"]),
                               early_stop_num=int(s["early_stop_num"]))
        for loop in ("naive", "batch"):
            if f"t2s.out.{loop}_{suffix}" in f.tensors:
                out.append((f"t2s.out.{loop}_{suffix}", r.tokens, EXACT))
        idx_key = f"naive_{'default' if setting == 'default' else 'topk1'}_idx"
        if idx_key in s:
            out.append((f"t2s_sampling.{idx_key}", torch.tensor([r.idx]), EXACT, torch.tensor([int(s[idx_key])])))
    return out


def _vits_latent(f: Fixture) -> Outputs:
    m = f.vits
    codes = m.extract_latent(f["vits.in.ssl"])
    return [("vits.out.ssl_proj", m.ssl_proj(f["vits.in.ssl"]), MODULE), ("vits.out.prompt_codes", codes, EXACT),
            ("vits.out.prompt_quantized", m.quantizer.decode(f["vits.out.prompt_codes"].transpose(0, 1)), MODULE)]


def _spectrogram(f: Fixture) -> Outputs:
    d = f.meta.get("hps_data", {})
    spec = spectrogram(f["spec.in.wav32k"], int(d.get("filter_length", 2048)), int(d.get("hop_length", 640)),
                       int(d.get("win_length", 2048)))
    return [("spec.out.spec", spec, MODULE)]


def _sv_list(f: Fixture) -> list[torch.Tensor] | None:
    return [f["vits.in.sv_emb"]] if f.vits.cfg.is_pro else None


def _vits_ge(f: Fixture) -> Outputs:
    m, spec = f.vits, f["spec.out.spec"]
    mask = torch.ones(1, 1, spec.shape[2], dtype=spec.dtype)
    out = [("vits.out.ref_enc_ge", m.ref_enc(spec[:, :704] * mask, mask), MODULE)]
    if m.cfg.is_pro:
        ge = m.reference_embedding(spec, f["vits.in.sv_emb"])
        out += [("vits.out.ge_after_sv", ge, MODULE),
                ("vits.out.ge512", m.ge_to512(f["vits.out.ge_after_sv"].transpose(2, 1)).transpose(2, 1), MODULE)]
    return out


def _recorded_ge(f: Fixture) -> torch.Tensor:
    return f["vits.out.ge_after_sv"] if f.vits.cfg.is_pro else f["vits.out.ref_enc_ge"]


def _vits_prior(f: Fixture) -> Outputs:
    m = f.vits
    x, m_p, logs_p, _ = m.prior(f["vits.in.codes"], f["vits.in.text"], _recorded_ge(f))
    return [("vits.out.quantized", m.quantizer.decode(f["vits.in.codes"]), MODULE), ("vits.out.enc_p_x", x, MODULE),
            ("vits.out.m_p", m_p, MODULE), ("vits.out.logs_p", logs_p, MODULE)]


def _vits_noise(f: Fixture) -> Outputs:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(f.meta["vits_noise_seed"]))
        noise = torch.randn_like(f["vits.out.m_p"])
    return [("vits.out.noise", noise, MODULE)]


def _vits_flow(f: Fixture) -> Outputs:
    m = f.vits
    scale = float(f.meta.get("vits_decode_args", {}).get("noise_scale", 0.5))
    z_p = f["vits.out.m_p"] + f["vits.out.noise"] * torch.exp(f["vits.out.logs_p"]) * scale
    mask = torch.ones(1, 1, z_p.shape[2], dtype=z_p.dtype)
    z = m.flow.reverse(f["vits.out.z_p"], mask, _recorded_ge(f))
    return [("vits.out.z_p", z_p, MODULE), ("vits.out.z", z, MODULE)]


def _vits_decode(f: Fixture) -> Outputs:
    """End to end from codes, phonemes and the reference spectrogram, with upstream's noise draw."""
    m = f.vits
    args = f.meta.get("vits_decode_args", {})
    out: Outputs = []
    for name, scale in (("vits.out.wav", float(args.get("noise_scale", 0.5))), ("vits.out.wav_noise0", 0.0)):
        if name not in f.tensors:
            continue
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(f.meta["vits_noise_seed"]))
            wav = m.decode(f["vits.in.codes"], f["vits.in.text"], [f["spec.out.spec"]], _sv_list(f), scale,
                           float(args.get("speed", 1)))
        out.append((name, wav, CHAIN))
    return out


def _sv_fbank(f: Fixture) -> Outputs:
    fbank = kaldi_fbank(f["sv.in.wav16k"][0:1], num_mel_bins=f["sv.out.fbank"].shape[-1], sample_frequency=16000)
    return [("sv.out.fbank", fbank.unsqueeze(0), MODULE)]


def _sv_embedding(f: Fixture) -> Outputs:
    out = [("sv.out.embedding", f.sv(f["sv.out.fbank"]), MODULE)]
    if f.has("sv.in.fbank_random", "sv.out.embedding_random"):
        out.append(("sv.out.embedding_random", f.sv(f["sv.in.fbank_random"]), MODULE))
    return out


# (name, the recorded tensors it needs — absent: the folder did not record it, — what it runs)
STAGES: tuple[tuple[str, tuple[str, ...], Callable[[Fixture], Outputs]], ...] = (
    ("t2s.embed", ("t2s.in.phoneme_ids", "t2s.in.bert_feature", "t2s.in.prompt_semantic", "t2s.out.xy_pos"),
     _t2s_embed),
    ("t2s.prompt", ("t2s.out.xy_pos", "t2s.out.attn_mask", "t2s.out.prompt_logits"), _t2s_prompt),
    ("t2s.step", ("t2s.in.step_token", "t2s.out.step_xy_pos", "t2s.out.k_cache.0", "t2s.out.step_logits"),
     _t2s_step),
    ("t2s.sample", ("t2s.in.phoneme_ids", "t2s.in.bert_feature", "t2s.in.prompt_semantic",
                    "t2s.out.naive_default_y"), _t2s_sample),
    ("vits.quantizer", ("vits.in.ssl", "vits.out.prompt_codes", "vits.out.prompt_quantized"), _vits_latent),
    ("spectrogram", ("spec.in.wav32k", "spec.out.spec"), _spectrogram),
    ("vits.ref_enc", ("spec.out.spec", "vits.out.ref_enc_ge"), _vits_ge),
    ("vits.text_encoder", ("vits.in.codes", "vits.in.text", "vits.out.ref_enc_ge", "vits.out.m_p"), _vits_prior),
    ("vits.noise", ("vits.out.m_p", "vits.out.noise"), _vits_noise),
    ("vits.flow", ("vits.out.m_p", "vits.out.logs_p", "vits.out.noise", "vits.out.z_p", "vits.out.z"), _vits_flow),
    ("vits.decode", ("vits.in.codes", "vits.in.text", "spec.out.spec", "vits.out.wav"), _vits_decode),
    ("sv.fbank", ("sv.in.wav16k", "sv.out.fbank"), _sv_fbank),
    ("sv.embedding", ("sv.out.fbank", "sv.out.embedding"), _sv_embedding),
)


def _run(stage: Callable[[Fixture], Outputs], fixture: Fixture) -> list[Check]:
    """Every model in float32 on the CPU, no autograd."""
    with torch.no_grad():
        outputs = stage(fixture)
    return [Check(o[0], o[1], o[2], o[3] if len(o) > 3 else None) for o in outputs]


def stages(ref: Reference) -> list[Stage]:
    """The stages `ref` recorded (`mizuoto check-reference --engine gptsovits DIR`)."""
    fixture = Fixture(ref)
    return [Stage(name, functools.partial(_run, fn, fixture)) for name, needs, fn in STAGES if fixture.has(*needs)]
