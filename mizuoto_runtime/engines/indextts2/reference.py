"""IndexTTS-2's stages for `mizuoto check-reference --engine indextts2 DIR` (the format of
`../shared/fixtures/indextts2/`; any sizes and seeds: settings, seeds and token ids are read from
reference.json, every model from DIR/ckpt with the engine's own loader).

A stage whose inputs the folder does not record is skipped; every recorded output no stage
checks is reported by the framework as unchecked.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from ..reference import Check, Reference, Stage
from . import pipeline
from .bigvgan import BigVGAN
from .campplus import CAMPPlus
from .checkpoint import Layout, load_bigvgan, load_campplus, load_codec, load_gpt, load_s2mel
from .decoding import DecodeSettings
from .s2mel import S2Mel
from .semantic_codec import SemanticCodec
from .unified_voice import UnifiedVoice

T = TypeVar("T")

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


# ---- the checkpoint's parts, loaded once per folder by the engine's own loader ------------------
def _layout(ref: Reference) -> Layout:
    return ref.shared("indextts2.layout", lambda: Layout.open(ref.ckpt))


def _part(ref: Reference, name: str, load: Callable[[Layout], T]) -> T:
    part: T = ref.shared(f"indextts2.{name}", lambda: load(_layout(ref)))
    return part


def _gpt(ref: Reference) -> UnifiedVoice:
    return _part(ref, "gpt", load_gpt)


def _s2mel(ref: Reference) -> S2Mel:
    return _part(ref, "s2mel", load_s2mel)


def _codec(ref: Reference) -> SemanticCodec:
    return _part(ref, "codec", load_codec)


def _campplus(ref: Reference) -> CAMPPlus:
    return _part(ref, "campplus", load_campplus)


def _bigvgan(ref: Reference) -> BigVGAN:
    return _part(ref, "bigvgan", load_bigvgan)


# ---- the stages ---------------------------------------------------------------------------------
def _lengths(ref: Reference, key: str, fallback: torch.Tensor) -> torch.Tensor:
    gpt_meta = ref.meta.get("stages", {}).get("gpt", {})
    return torch.tensor([int(gpt_meta[key])]) if key in gpt_meta else pipeline.feature_lengths(fallback)


@torch.inference_mode()
def _conditioning(ref: Reference) -> Iterator[Check]:
    t = ref.tensor
    spk, emo = t("gpt.in.spk_cond_emb"), t("gpt.in.emo_cond_emb")
    spk_len = t("gpt.in.cond_lengths") if ref.has("gpt.in.cond_lengths") else _lengths(ref, "cond_lengths", spk)
    emo_len = _lengths(ref, "emo_cond_lengths", emo)
    gpt = _gpt(ref)
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


def _prefix(ref: Reference) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (speaker latent, prefix embeddings) from the recorded inputs (emotion merged at alpha 1)."""
    def make() -> tuple[torch.Tensor, torch.Tensor]:
        t = ref.tensor
        spk, emo = t("gpt.in.spk_cond_emb"), t("gpt.in.emo_cond_emb")
        spk_len, emo_len = _lengths(ref, "cond_lengths", spk), _lengths(ref, "emo_cond_lengths", emo)
        latent = _gpt(ref).speaker_latent(spk, spk_len)
        emovec = _gpt(ref).merge_emotion(spk, emo, spk_len, emo_len, 1.0)
        return latent, emovec
    return ref.shared("indextts2.gpt_conditioning", make)


@torch.inference_mode()
def _prompt(ref: Reference) -> Iterator[Check]:
    latent, emovec = _prefix(ref)
    conds = _gpt(ref).conds_latent(latent, emovec)
    yield Check("gpt.out.conds_latent", conds)
    prefix = _gpt(ref).prefix(conds, ref.tensor("gpt.in.text_tokens"))
    yield Check("gpt.out.prefix_embeds", prefix)
    from .unified_voice import PromptedDecoder
    ids = PromptedDecoder(_gpt(ref), prefix).prompt_ids()
    yield Check("gpt.out.prefix_input_ids", ids, "exact")
    yield Check("gpt.out.prefix_attention_mask", torch.ones_like(ids), "exact")


@torch.inference_mode()
def _steps(ref: Reference) -> Iterator[Check]:
    from .unified_voice import PromptedDecoder
    latent, emovec = _prefix(ref)
    prefix = _gpt(ref).prefix(_gpt(ref).conds_latent(latent, emovec), ref.tensor("gpt.in.text_tokens"))
    decoder = PromptedDecoder(_gpt(ref), prefix)
    yield Check("gpt.out.step0_logits", decoder.start(1))
    if ref.has("gpt.in.step1_token"):
        yield Check("gpt.out.step1_logits", decoder.step(ref.tensor("gpt.in.step1_token").reshape(1)))
    if ref.has("gpt.in.tf_codes"):
        codes = ref.tensor("gpt.in.tf_codes")
        yield Check("gpt.out.tf_logits", _gpt(ref).teacher_forced_logits(prefix, codes))
        yield Check("gpt.out.tf_latent", _gpt(ref).latent(latent, ref.tensor("gpt.in.text_tokens"), codes, emovec))


@torch.inference_mode()
def _decodes(ref: Reference) -> Iterator[Check]:
    meta = ref.meta["stages"]["gpt"]
    latent, emovec = _prefix(ref)
    text = ref.tensor("gpt.in.text_tokens")
    for name, (settings_key, seed_key) in DECODES.items():
        if not ref.has(name):
            continue
        if seed_key is not None:
            torch.manual_seed(int(meta[seed_key]))
        codes = pipeline.decode_codes(_gpt(ref), latent, text, emovec, settings_of(meta[settings_key]),
                                      int(meta["max_generate_length"]))
        yield Check(name, codes, "exact")
    if ref.has("gpt.out.inference_cond_latent"):
        yield Check("gpt.out.inference_cond_latent", latent)


@torch.inference_mode()
def _codec_stage(ref: Reference) -> Iterator[Check]:
    codes, quantized = _codec(ref).quantize(ref.tensor("codec.in.feat"))
    yield Check("codec.out.codes", codes, "exact")
    yield Check("codec.out.quantized", quantized)
    if ref.has("codec.in.vq_codes"):
        yield Check("codec.out.vq2emb", _codec(ref).embed(ref.tensor("codec.in.vq_codes")))


@torch.inference_mode()
def _campplus_stage(ref: Reference) -> Iterator[Check]:
    raw = ref.tensor("campplus.in.fbank_raw")
    yield Check("campplus.in.fbank", (raw - raw.mean(dim=0, keepdim=True)).unsqueeze(0),
                want=ref.tensor("campplus.in.fbank"))
    yield Check("campplus.out.style", pipeline.speaker_style(_campplus(ref), raw))


@torch.inference_mode()
def _mel(ref: Reference) -> Iterator[Check]:
    yield Check("mel.out.mel", pipeline.reference_mel(ref.tensor("mel.in.wav_22k"), _layout(ref).config["s2mel"]))


@torch.inference_mode()
def _s2mel_stage(ref: Reference) -> Iterator[Check]:
    t = ref.tensor
    if ref.has("s2mel.in.lr_x"):
        yield Check("s2mel.out.lr_out", _s2mel(ref).length_regulator(t("s2mel.in.lr_x"), t("s2mel.in.lr_ylens")))
    if ref.has("s2mel.in.gpt_layer_x"):
        yield Check("s2mel.out.gpt_layer", _s2mel(ref).gpt_layer(t("s2mel.in.gpt_layer_x")))


@torch.inference_mode()
def _flow(ref: Reference) -> Iterator[Check]:
    t, meta = ref.tensor, ref.meta["stages"].get("flow", {})
    cfm = _s2mel(ref).cfm
    if ref.has("flow.in.est_x"):
        yield Check("flow.out.est_out", cfm.estimator(t("flow.in.est_x"), t("flow.in.est_prompt_x"),
                                                      t("flow.in.est_x_lens"), t("flow.in.est_t"),
                                                      t("flow.in.est_style"), t("flow.in.est_mu")))
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


@torch.inference_mode()
def _vocoder(ref: Reference) -> Iterator[Check]:
    yield Check("vocoder.out.wav", _bigvgan(ref)(ref.tensor("vocoder.in.mel")))


@torch.inference_mode()
def _end_to_end(ref: Reference) -> Iterator[Check]:
    """infer_v2 for one segment, no emotion audio: voice prompt, one seed, decode, latent, flow, vocoder."""
    t, meta = ref.tensor, ref.meta["stages"]["e2e"]
    spk, text = t("e2e.in.spk_cond_emb"), t("e2e.in.text_tokens")
    gpt, s2m = _gpt(ref), _s2mel(ref)
    ref_mel = pipeline.reference_mel(t("e2e.in.wav_22k"), _layout(ref).config["s2mel"])
    yield Check("e2e.out.ref_mel", ref_mel)
    codes, quantized, condition = pipeline.semantic_prompt(_codec(ref), s2m, spk, ref_mel.shape[-1])
    yield Check("e2e.out.S_ref_codes", codes, "exact")
    yield Check("e2e.out.S_ref", quantized)
    style = pipeline.speaker_style(_campplus(ref), t("e2e.in.fbank_raw"))
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
    latent, projected, embedded = pipeline.content(gpt, s2m, _codec(ref), voice.spk_latent, text, cut, emovec)
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
    wav = pipeline.vocode(_bigvgan(ref), mel_out)
    yield Check("e2e.out.wav", wav, "chain")
    yield Check("e2e.out.wav_pcm_scaled", pipeline.pcm_scale(wav), "chain")


def stages(ref: Reference) -> Iterator[Stage]:
    """The stages `ref` recorded: a stage runs when the folder records its input."""
    if ref.has("gpt.in.spk_cond_emb"):
        yield Stage("gpt.conditioning", lambda: _conditioning(ref))
    if ref.has("gpt.in.text_tokens"):
        yield Stage("gpt.prompt", lambda: _prompt(ref))
        yield Stage("gpt.steps", lambda: _steps(ref))
        yield Stage("gpt.decode", lambda: _decodes(ref))
    if ref.has("codec.in.feat"):
        yield Stage("codec", lambda: _codec_stage(ref))
    if ref.has("campplus.in.fbank_raw"):
        yield Stage("campplus", lambda: _campplus_stage(ref))
    if ref.has("mel.in.wav_22k"):
        yield Stage("mel", lambda: _mel(ref))
    if ref.has("s2mel.in.lr_x"):
        yield Stage("s2mel", lambda: _s2mel_stage(ref))
    if ref.has("flow.in.mu"):
        yield Stage("flow", lambda: _flow(ref))
    if ref.has("vocoder.in.mel"):
        yield Stage("vocoder", lambda: _vocoder(ref))
    if ref.has("e2e.in.spk_cond_emb"):
        yield Stage("e2e", lambda: _end_to_end(ref))
