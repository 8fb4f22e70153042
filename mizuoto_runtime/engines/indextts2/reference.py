"""IndexTTS-2's stages for `mizuoto check-reference --engine indextts2 DIR` (the format of
`../shared/fixtures/indextts2/`; any sizes and seeds: settings, seeds and token ids are read from
reference.json, every model from DIR/ckpt with the engine's own loader).

A stage whose inputs the folder does not record is skipped; every recorded output no stage
checks is reported by the framework as unchecked.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from ...reference_check import Check, Reference, Stage
from . import pipeline
from .decoding import DecodeSettings
from .checkpoint import Layout, load_bigvgan, load_campplus, load_codec, load_gpt, load_s2mel

# output name -> (settings key, seed key or None) in reference.json stages.gpt
DECODES = {
    "gpt.out.codes_beam_sample": ("default_settings", "seed"),
    "gpt.out.codes_greedy_rep10": ("greedy_settings", None),
    "gpt.out.codes_greedy_rep1": ("greedy_rep1_settings", None),
    "gpt.out.codes_sample_beam1": ("sample_beam1_settings", "sample_beam1_seed"),
}


def settings_of(raw: dict[str, Any]) -> DecodeSettings:
    if raw.get("num_return_sequences", 1) != 1:
        raise ValueError(f"num_return_sequences {raw['num_return_sequences']}: IndexTTS-2 returns one")
    return DecodeSettings(**{k: v for k, v in raw.items() if k != "num_return_sequences"})


class Models:
    """The checkpoint's parts, each loaded the first time a stage needs it."""

    LOADERS: dict[str, Callable[[Layout], Any]] = {"gpt": load_gpt, "s2mel": load_s2mel, "codec": load_codec,
                                                  "campplus": load_campplus, "bigvgan": load_bigvgan}

    def __init__(self, ref: Reference) -> None:
        self.ref = ref
        self.layout = ref.shared("indextts2.layout", lambda: Layout.open(ref.ckpt))

    def __getattr__(self, name: str) -> Any:
        load = type(self).LOADERS.get(name)
        if load is None:
            raise AttributeError(name)
        return self.ref.shared(f"indextts2.{name}", lambda: load(self.layout))


def _lengths(ref: Reference, key: str, fallback: torch.Tensor) -> torch.Tensor:
    gpt_meta = ref.meta.get("stages", {}).get("gpt", {})
    return torch.tensor([int(gpt_meta[key])]) if key in gpt_meta else pipeline.feature_lengths(fallback)


def conditioning(ref: Reference, m: Models) -> Iterator[Check]:
    t = ref.tensor
    spk, emo = t("gpt.in.spk_cond_emb"), t("gpt.in.emo_cond_emb")
    spk_len = t("gpt.in.cond_lengths") if ref.has("gpt.in.cond_lengths") else _lengths(ref, "cond_lengths", spk)
    emo_len = _lengths(ref, "emo_cond_lengths", emo)
    gpt = m.gpt
    x, mask = gpt.conditioning_encoder(spk, spk_len)
    yield Check("gpt.out.spk_conformer", x)
    yield Check("gpt.out.spk_conformer_mask", mask, "exact")
    yield Check("gpt.out.spk_cond_latent", gpt.speaker_latent(spk, spk_len))
    x, mask = gpt.emo_conditioning_encoder(emo, emo_len)
    yield Check("gpt.out.emo_conformer", x)
    yield Check("gpt.out.emo_conformer_mask", mask, "exact")
    yield Check("gpt.out.emo_perceiver", gpt.emotion_perceiver(emo, emo_len))
    yield Check("gpt.out.emo_vec", gpt.emotion_vector(emo, emo_len))
    yield Check("gpt.out.emo_vec_of_spk", gpt.emotion_vector(spk, spk_len))
    yield Check("gpt.out.emovec_merged_alpha1", gpt.merge_emotion(spk, emo, spk_len, emo_len, 1.0))
    yield Check("gpt.out.emovec_merged_alpha0p6", gpt.merge_emotion(spk, emo, spk_len, emo_len, 0.6))


def _prefix(ref: Reference, m: Models) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (speaker latent, prefix embeddings) from the recorded inputs (emotion merged at alpha 1)."""
    def make() -> tuple[torch.Tensor, torch.Tensor]:
        t = ref.tensor
        spk, emo = t("gpt.in.spk_cond_emb"), t("gpt.in.emo_cond_emb")
        spk_len, emo_len = _lengths(ref, "cond_lengths", spk), _lengths(ref, "emo_cond_lengths", emo)
        latent = m.gpt.speaker_latent(spk, spk_len)
        emovec = m.gpt.merge_emotion(spk, emo, spk_len, emo_len, 1.0)
        return latent, emovec
    return ref.shared("indextts2.gpt_conditioning", make)


def prompt(ref: Reference, m: Models) -> Iterator[Check]:
    latent, emovec = _prefix(ref, m)
    conds = m.gpt.conds_latent(latent, emovec)
    yield Check("gpt.out.conds_latent", conds)
    prefix = m.gpt.prefix(conds, ref.tensor("gpt.in.text_tokens"))
    yield Check("gpt.out.prefix_embeds", prefix)
    from .unified_voice import PromptedDecoder
    ids = PromptedDecoder(m.gpt, prefix).prompt_ids()
    yield Check("gpt.out.prefix_input_ids", ids, "exact")
    yield Check("gpt.out.prefix_attention_mask", torch.ones_like(ids), "exact")


def steps(ref: Reference, m: Models) -> Iterator[Check]:
    from .unified_voice import PromptedDecoder
    latent, emovec = _prefix(ref, m)
    prefix = m.gpt.prefix(m.gpt.conds_latent(latent, emovec), ref.tensor("gpt.in.text_tokens"))
    decoder = PromptedDecoder(m.gpt, prefix)
    yield Check("gpt.out.step0_logits", decoder.start(1))
    if ref.has("gpt.in.step1_token"):
        yield Check("gpt.out.step1_logits", decoder.step(ref.tensor("gpt.in.step1_token").reshape(1)))
    if ref.has("gpt.in.tf_codes"):
        codes = ref.tensor("gpt.in.tf_codes")
        yield Check("gpt.out.tf_logits", m.gpt.teacher_forced_logits(prefix, codes))
        yield Check("gpt.out.tf_latent", m.gpt.latent(latent, ref.tensor("gpt.in.text_tokens"), codes, emovec))


def decodes(ref: Reference, m: Models) -> Iterator[Check]:
    meta = ref.meta["stages"]["gpt"]
    latent, emovec = _prefix(ref, m)
    text = ref.tensor("gpt.in.text_tokens")
    for name, (settings_key, seed_key) in DECODES.items():
        if not ref.has(name):
            continue
        if seed_key is not None:
            torch.manual_seed(int(meta[seed_key]))
        codes = pipeline.decode_codes(m.gpt, latent, text, emovec, settings_of(meta[settings_key]),
                                      int(meta["max_generate_length"]))
        yield Check(name, codes, "exact")
    if ref.has("gpt.out.inference_cond_latent"):
        yield Check("gpt.out.inference_cond_latent", latent)


def codec(ref: Reference, m: Models) -> Iterator[Check]:
    codes, quantized = m.codec.quantize(ref.tensor("codec.in.feat"))
    yield Check("codec.out.codes", codes, "exact")
    yield Check("codec.out.quantized", quantized)
    if ref.has("codec.in.vq_codes"):
        yield Check("codec.out.vq2emb", m.codec.embed(ref.tensor("codec.in.vq_codes")))


def campplus(ref: Reference, m: Models) -> Iterator[Check]:
    raw = ref.tensor("campplus.in.fbank_raw")
    yield Check("campplus.in.fbank", (raw - raw.mean(dim=0, keepdim=True)).unsqueeze(0), want=ref.tensor("campplus.in.fbank"))
    yield Check("campplus.out.style", pipeline.speaker_style(m.campplus, raw))


def mel(ref: Reference, m: Models) -> Iterator[Check]:
    yield Check("mel.out.mel", pipeline.reference_mel(ref.tensor("mel.in.wav_22k"), m.layout.config["s2mel"]))


def s2mel(ref: Reference, m: Models) -> Iterator[Check]:
    if ref.has("s2mel.in.lr_x"):
        yield Check("s2mel.out.lr_out", m.s2mel.length_regulator(ref.tensor("s2mel.in.lr_x"), ref.tensor("s2mel.in.lr_ylens")))
    if ref.has("s2mel.in.gpt_layer_x"):
        yield Check("s2mel.out.gpt_layer", m.s2mel.gpt_layer(ref.tensor("s2mel.in.gpt_layer_x")))


def flow(ref: Reference, m: Models) -> Iterator[Check]:
    t, meta = ref.tensor, ref.meta["stages"].get("flow", {})
    cfm = m.s2mel.cfm
    if ref.has("flow.in.est_x"):
        yield Check("flow.out.est_out", cfm.estimator(t("flow.in.est_x"), t("flow.in.est_prompt_x"), t("flow.in.est_x_lens"),
                                                      t("flow.in.est_t"), t("flow.in.est_style"), t("flow.in.est_mu")))
    if not ref.has("flow.in.mu"):
        return
    if "noise_seed" in meta:
        torch.manual_seed(int(meta["noise_seed"]))
        yield Check("flow.in.noise", cfm.noise(t("flow.in.mu")) * float(meta.get("temperature", 1.0)),
                    want=t("flow.in.noise"))
    args = (t("flow.in.noise"), t("flow.in.x_lens"), t("flow.in.prompt"), t("flow.in.mu"), t("flow.in.style"))
    yield Check("flow.out.mel", cfm.solve(*args, int(meta.get("n_timesteps", pipeline.DIFFUSION_STEPS)),
                                          float(meta.get("inference_cfg_rate", pipeline.CFG_RATE))), "chain")
    if ref.has("flow.out.mel_cfg0"):
        yield Check("flow.out.mel_cfg0", cfm.solve(*args, int(meta["cfg0_n_timesteps"]), 0.0), "chain")


def vocoder(ref: Reference, m: Models) -> Iterator[Check]:
    yield Check("vocoder.out.wav", m.bigvgan(ref.tensor("vocoder.in.mel")))


def end_to_end(ref: Reference, m: Models) -> Iterator[Check]:
    """infer_v2 for one segment, no emotion audio: voice prompt, one seed, decode, latent, flow, vocoder."""
    t, meta = ref.tensor, ref.meta["stages"]["e2e"]
    spk, text = t("e2e.in.spk_cond_emb"), t("e2e.in.text_tokens")
    gpt, s2m = m.gpt, m.s2mel
    ref_mel = pipeline.reference_mel(t("e2e.in.wav_22k"), m.layout.config["s2mel"])
    yield Check("e2e.out.ref_mel", ref_mel)
    codes, quantized, condition = pipeline.semantic_prompt(m.codec, s2m, spk, ref_mel.shape[-1])
    yield Check("e2e.out.S_ref_codes", codes, "exact")
    yield Check("e2e.out.S_ref", quantized)
    style = pipeline.speaker_style(m.campplus, t("e2e.in.fbank_raw"))
    yield Check("e2e.out.style", style)
    yield Check("e2e.out.prompt_condition", condition)
    lengths = pipeline.feature_lengths(spk)
    voice = pipeline.VoicePrompt(spk, ref_mel, style, condition, gpt.speaker_latent(spk, lengths),
                                 gpt.emotion_vector(spk, lengths))
    torch.manual_seed(int(meta["seed"]))
    emovec = pipeline.emotion_from_audio(gpt, voice, None, float(meta.get("emo_alpha", 1.0)))
    yield Check("e2e.out.emovec", emovec)
    raw = pipeline.decode_codes(gpt, voice.spk_latent, text, emovec, settings_of(meta["settings"]),
                                int(meta["max_generate_length"]))
    yield Check("e2e.out.codes_raw", raw, "exact")
    cut = pipeline.cut_at_stop(raw, gpt.cfg.stop_mel_token)
    yield Check("e2e.out.codes", cut, "exact")
    yield Check("e2e.out.spk_cond_latent", voice.spk_latent)
    latent, projected, embedded = pipeline.content(gpt, s2m, m.codec, voice.spk_latent, text, cut, emovec)
    yield Check("e2e.out.gpt_latent", latent, "chain")
    yield Check("e2e.out.gpt_layer", projected, "chain")
    yield Check("e2e.out.vq2emb", embedded)
    cond, cat = pipeline.flow_condition(s2m, voice, projected, embedded)
    yield Check("e2e.out.cond", cond, "chain")
    yield Check("e2e.out.cat_condition", cat, "chain")
    noise = s2m.cfm.noise(cat)
    yield Check("e2e.out.cfm_noise", noise)
    full = s2m.cfm.solve(noise, torch.tensor([cat.shape[1]]), ref_mel, cat, style,
                         int(meta.get("diffusion_steps", pipeline.DIFFUSION_STEPS)),
                         float(meta.get("inference_cfg_rate", pipeline.CFG_RATE)))
    yield Check("e2e.out.vc_target_full", full, "chain")
    mel_out = full[:, :, ref_mel.shape[-1]:]
    yield Check("e2e.out.mel", mel_out, "chain")
    wav = pipeline.vocode(m.bigvgan, mel_out)
    yield Check("e2e.out.wav", wav, "chain")
    yield Check("e2e.out.wav_pcm_scaled", pipeline.pcm_scale(wav), "chain")


STAGES: dict[str, tuple[str, Callable[[Reference, Models], Iterator[Check]]]] = {
    "gpt.conditioning": ("gpt.in.spk_cond_emb", conditioning),
    "gpt.prompt": ("gpt.in.text_tokens", prompt),
    "gpt.steps": ("gpt.in.text_tokens", steps),
    "gpt.decode": ("gpt.in.text_tokens", decodes),
    "codec": ("codec.in.feat", codec),
    "campplus": ("campplus.in.fbank_raw", campplus),
    "mel": ("mel.in.wav_22k", mel),
    "s2mel": ("s2mel.in.lr_x", s2mel),
    "flow": ("flow.in.mu", flow),
    "vocoder": ("vocoder.in.mel", vocoder),
    "e2e": ("e2e.in.spk_cond_emb", end_to_end),
}


def stages(ref: Reference) -> Iterable[Stage]:
    models = Models(ref)

    def runner(fn: Callable[[Reference, Models], Iterator[Check]]) -> Callable[[], list[Check]]:
        def run() -> list[Check]:
            with torch.inference_mode():
                return list(fn(ref, models))
        return run

    return [Stage(name, runner(fn)) for name, (needs, fn) in STAGES.items() if ref.has(needs)]
