"""A reference's conditionals as upstream's ``ChatterboxTTS.prepare_conditionals`` computes them,
from audio already in memory (upstream reads a file with ``librosa.load(path, sr=24000)``):
the S3Gen reference (mel, speech tokens, CAM++ x-vector) of the first 10 s at 24 kHz, T3's
speech-token prompt of the first 6 s at 16 kHz, and the voice encoder's speaker embedding."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

ENC_COND_SECONDS = 6  # upstream's ChatterboxTTS.ENC_COND_LEN, in seconds of 16 kHz
DEC_COND_SECONDS = 10  # ChatterboxTTS.DEC_COND_LEN, in seconds of 24 kHz


def at_24k(waveform: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mono float32 at 24 kHz, resampled as ``librosa.load(..., sr=24000)`` does (soxr_hq)."""
    import librosa

    wav = np.asarray(waveform, dtype=np.float32)
    return wav if sample_rate == 24000 else librosa.resample(wav, orig_sr=sample_rate, target_sr=24000)


def conditionals(t3: nn.Module, s3gen: nn.Module, ve: nn.Module, wav_24k: np.ndarray,
                 device: torch.device) -> dict[str, Any]:
    """``{"t3": {speaker_emb, cond_prompt_speech_tokens}, "gen": {...}}`` on the CPU, as
    ``prepare_conditionals`` builds them (the emotion is set per request)."""
    import librosa
    from chatterbox.models.s3gen import S3GEN_SR
    from chatterbox.models.s3tokenizer import S3_SR

    ref_16k = librosa.resample(wav_24k, orig_sr=S3GEN_SR, target_sr=S3_SR)
    gen = s3gen.embed_ref(wav_24k[:DEC_COND_SECONDS * S3GEN_SR], S3GEN_SR, device=device)
    prompt_len = t3.hp.speech_cond_prompt_len
    tokens, _ = s3gen.tokenizer.forward([ref_16k[:ENC_COND_SECONDS * S3_SR]], max_len=prompt_len)
    embed = torch.from_numpy(ve.embeds_from_wavs([ref_16k], sample_rate=S3_SR)).mean(axis=0, keepdim=True)
    return {
        "t3": {"speaker_emb": embed.cpu(), "cond_prompt_speech_tokens": torch.atleast_2d(tokens).cpu()},
        "gen": {k: v.cpu() if torch.is_tensor(v) else v for k, v in gen.items()},
    }
