"""One IndexTTS-2 segment, step by step as upstream's infer_v2 runs it (the functions the engine's
phases and the reference checker share).

Quirks kept (they change numbers): the conformers get the FEATURE width (1024) as the prompt
"length", so every frame of a prompt up to 1024 frames is valid; codes are cut at the first
stop code; the mel length is int(float32(code count) * 1.72); the one noise draw of the flow
comes right after the decoding's draws (same generator, same order).
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

import torch

from ...errors import ArgumentError
from ...nn.features import mel_spectrogram
from .bigvgan import BigVGAN
from .campplus import CAMPPlus
from .checkpoint import Tables
from .decoding import DecodeSettings, generate
from .s2mel import S2Mel
from .semantic_codec import SemanticCodec
from .unified_voice import PromptedDecoder, UnifiedVoice

DIFFUSION_STEPS = 25
CFG_RATE = 0.7
MEL_FRAMES_PER_CODE = 1.72


@dataclasses.dataclass
class VoicePrompt:
    """What one reference voice gives every later request (cached, M4)."""

    spk_emb: torch.Tensor            # (1, T, 1024) normalised w2v-BERT layer-17 features
    ref_mel: torch.Tensor            # (1, 80, F)
    style: torch.Tensor              # (1, 192) CAM++
    prompt_condition: torch.Tensor   # (1, F, C) length-regulated semantic codec embedding
    spk_latent: torch.Tensor         # (1, 32, d) speaker conditioning latents
    base_emotion: torch.Tensor       # (1, d) the emotion vector of the voice itself


def feature_lengths(x: torch.Tensor) -> torch.Tensor:
    """Upstream's prompt "lengths": the last dimension of the (B, T, 1024) features, i.e. 1024."""
    return torch.tensor([x.shape[-1]], device=x.device)


def reference_mel(wav_22k: torch.Tensor, s2mel_cfg: dict[str, Any]) -> torch.Tensor:
    p = s2mel_cfg["preprocess_params"]["spect_params"]
    fmax = p.get("fmax")
    return mel_spectrogram(wav_22k, n_fft=p["n_fft"], num_mels=p["n_mels"],
                           sampling_rate=s2mel_cfg["preprocess_params"]["sr"],
                           hop_size=p["hop_length"], win_size=p["win_length"], fmin=p.get("fmin", 0),
                           fmax=None if fmax in (None, "None") else float(fmax))


def speaker_style(campplus: CAMPPlus, fbank: torch.Tensor) -> torch.Tensor:
    """fbank (T, 80) of the 16 kHz prompt -> CAM++ style (1, 192), mean-normalised over time."""
    return campplus((fbank - fbank.mean(dim=0, keepdim=True)).unsqueeze(0))


def semantic_prompt(codec: SemanticCodec, s2mel: S2Mel, spk_emb: torch.Tensor, frames: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> codec codes, quantized embedding, and the prompt condition stretched to `frames`."""
    codes, quantized = codec.quantize(spk_emb)
    condition = s2mel.length_regulator(quantized, torch.tensor([frames], device=spk_emb.device))
    return codes, quantized, condition


def voice_prompt(gpt: UnifiedVoice, codec: SemanticCodec, s2mel: S2Mel, campplus: CAMPPlus,
                 spk_emb: torch.Tensor, wav_22k: torch.Tensor, fbank: torch.Tensor,
                 s2mel_cfg: dict[str, Any]) -> VoicePrompt:
    ref_mel = reference_mel(wav_22k, s2mel_cfg)
    _, _, condition = semantic_prompt(codec, s2mel, spk_emb, ref_mel.shape[-1])
    lengths = feature_lengths(spk_emb)
    return VoicePrompt(spk_emb, ref_mel, speaker_style(campplus, fbank), condition,
                       gpt.speaker_latent(spk_emb, lengths), gpt.emotion_vector(spk_emb, lengths))


def emotion_from_audio(gpt: UnifiedVoice, voice: VoicePrompt, emo_emb: torch.Tensor | None,
                       alpha: float) -> torch.Tensor:
    """merge_emovec: base + alpha * (emotion - base); no emotion audio -> the voice's own, alpha 1."""
    if emo_emb is None:
        return voice.base_emotion
    emo = gpt.emotion_vector(emo_emb, feature_lengths(emo_emb))
    return voice.base_emotion + alpha * (emo - voice.base_emotion)


def emotion_rows(tables: Tables, style: torch.Tensor, rng: random.Random | None = None) -> list[int]:
    """Per emotion, the row of its block of the emotion matrix to use: the one whose speaker row
    is most similar (cosine) to the voice's style, or with `rng` one at random (upstream's
    `use_random`: `randint` per emotion, in order)."""
    if rng is not None:
        return [rng.randint(0, len(rows) - 1) for rows in tables.emo_matrix]
    cosine = torch.nn.functional.cosine_similarity
    return [int(torch.argmax(cosine(style.float(), rows.float().to(style.device), dim=1)))
            for rows in tables.spk_matrix]


def check_weights(tables: Tables, weights: Sequence[float]) -> None:
    if len(weights) != len(tables.emo_matrix):
        raise ArgumentError(f"indextts2: the emotion vector needs {len(tables.emo_matrix)} weights "
                            f"(happy, angry, sad, afraid, disgusted, melancholic, surprised, calm), got {len(weights)}")


def emotion_from_weights(tables: Tables, style: torch.Tensor, weights: list[float], emovec: torch.Tensor,
                         alpha: float, rng: random.Random | None = None) -> torch.Tensor:
    """The 8-emotion vector path: weights scaled by alpha (clamped to 0..1, truncated to 4
    decimals as upstream), times each emotion's chosen row (`emotion_rows`), summed; the voice's
    own emotion `emovec` fills the remainder (1 - the weights' sum)."""
    check_weights(tables, weights)
    scale = max(0.0, min(1.0, alpha))
    if scale != 1.0:
        weights = [int(w * scale * 10000) / 10000 for w in weights]
    w = torch.tensor(weights, device=style.device)
    rows = [block[i].unsqueeze(0) for i, block in zip(emotion_rows(tables, style, rng), tables.emo_matrix)]
    mixed = torch.sum(w.unsqueeze(1) * torch.cat(rows, 0).to(style.device), 0).unsqueeze(0)
    return mixed + (1 - torch.sum(w)) * emovec


def skip_prompt_draws(w2v_draws: int) -> None:
    """The draws upstream's infer makes from torch's CPU generator between its seed and its
    decoding: its w2v-BERT draws `w2v_draws` numbers per call (see `W2VBert.upstream_draws`) and
    a request with a voice not yet cached calls it twice (the voice, and the emotion reference,
    which is the voice itself when none is given). So the codes are those of upstream's first
    request for a voice (its later requests with the voice cached skip these draws). On a GPU
    the decoding draws from the device's generator, which these leave alone, as upstream's."""
    for _ in range(2 * w2v_draws):
        torch.rand([])


def decode_codes(gpt: UnifiedVoice, spk_latent: torch.Tensor, text: torch.Tensor, emovec: torch.Tensor,
                 settings: DecodeSettings, max_new: int) -> torch.Tensor:
    """The decoding of one segment -> codes (1, n), possibly ending with stop."""
    prefix = gpt.prefix(gpt.conds_latent(spk_latent, emovec), text)
    decoder = PromptedDecoder(gpt, prefix)
    return generate(decoder, decoder.prompt_ids(), max_new, gpt.cfg.stop_mel_token, settings)


def cut_at_stop(codes: torch.Tensor, stop: int) -> torch.Tensor:
    hits = (codes[0] == stop).nonzero()
    return codes[:, :int(hits[0])] if hits.numel() else codes


def content(gpt: UnifiedVoice, s2mel: S2Mel, codec: SemanticCodec, spk_latent: torch.Tensor, text: torch.Tensor,
            codes: torch.Tensor, emovec: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> GPT latent, its projection, and the codes' codec embedding (1, n, hidden)."""
    latent = gpt.latent(spk_latent, text, codes, emovec)
    return latent, s2mel.gpt_layer(latent), codec.embed(codes).transpose(1, 2)


def target_frames(code_count: int) -> int:
    return int((torch.tensor([code_count]) * MEL_FRAMES_PER_CODE).long())


def flow_condition(s2mel: S2Mel, voice: VoicePrompt, projected: torch.Tensor, embedded: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """-> the generated part's condition and [prompt condition, it] along time."""
    frames = torch.tensor([target_frames(embedded.shape[1])], device=embedded.device)
    cond = s2mel.length_regulator(embedded + projected, frames)
    return cond, torch.cat([voice.prompt_condition, cond], dim=1)


def pcm_scale(wav: torch.Tensor) -> torch.Tensor:
    return torch.clamp(32767 * wav, -32767.0, 32767.0)


def vocode(bigvgan: BigVGAN, mel: torch.Tensor) -> torch.Tensor:
    """mel (1, 80, F) -> (1, 256 F) in [-1, 1]."""
    return bigvgan(mel.float()).squeeze().unsqueeze(0)
