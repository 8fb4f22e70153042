"""CosyVoice's synthesis steps on a loaded model, as upstream's ``CosyVoice2Model.tts`` /
``CosyVoice3Model.tts`` run them without streaming (issue 22): speech tokens from the LM (our
loop, RAS draws from the global generator), silent-token thinning (CosyVoice 3), the flow on
prompt + new tokens, HiFT on the new mel. The engine adapter calls the same functions phase by
phase; the reference checker calls them on recorded inputs."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...nn.decoder import Cache, KVCache
from ...nn.features import mel_spectrogram
from .checkpoint import CosyVoiceModel, MelSpec
from .lm import Generation, RasParams, RasSampler, generate, length_bounds

# CosyVoice3Model.silent_tokens: after 5 in a row, further ones are dropped.
SILENT_TOKENS: dict[int, tuple[int, ...]] = {2: (), 3: (1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323)}
MAX_SILENT_RUN = 5


def drop_silent(tokens: Sequence[int], silent: Sequence[int], max_run: int = MAX_SILENT_RUN) -> list[int]:
    out: list[int] = []
    run = 0
    for t in tokens:
        if t in silent:
            run += 1
            if run > max_run:
                continue
        else:
            run = 0
        out.append(t)
    return out


def prompt_mel(wav: torch.Tensor, spec: MelSpec) -> torch.Tensor:
    """``(1, frames, 80)``: upstream's ``_extract_speech_feat`` of a 24 kHz waveform ``(1, samples)``."""
    mel = mel_spectrogram(wav, n_fft=spec.n_fft, num_mels=spec.num_mels, sampling_rate=spec.sampling_rate,
                          hop_size=spec.hop_size, win_size=spec.win_size, fmin=spec.fmin, fmax=spec.fmax,
                          center=spec.center)
    return mel.squeeze(dim=0).transpose(0, 1).unsqueeze(dim=0)


def speech_tokens(model: CosyVoiceModel, text: torch.Tensor, prompt_text: torch.Tensor,
                  prompt_speech_token: torch.Tensor, *, cache: Cache | None = None,
                  sampling: RasParams | None = None, max_new_tokens: int | None = None,
                  keep_logits: bool = False, on_token: Callable[[int], Any] | None = None) -> Generation:
    """The LM's tokens for `text` ``(1, n)`` after the prompt (ids ``(1, m)`` and speech tokens)."""
    lm = model.lm
    lm_input = lm.prefill_input(text, prompt_text, prompt_speech_token)
    min_len, max_len = length_bounds(text.shape[1])
    if max_new_tokens is not None:
        max_len = min(max_len, max_new_tokens)
    sampler = RasSampler(sampling or lm.spec.sampling)
    return generate(lm, lm_input, min_len, max_len, sampler, cache if cache is not None else KVCache(),
                    keep_logits=keep_logits, on_token=on_token)


def token2wav(model: CosyVoiceModel, tokens: Sequence[int], prompt_token: torch.Tensor, prompt_feat: torch.Tensor,
              embedding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mel ``(1, 80, T)`` and waveform ``(1, samples)`` of the new tokens."""
    token = torch.tensor([list(tokens)], dtype=torch.int32, device=prompt_token.device)
    mel = model.flow(token, prompt_token, prompt_feat, embedding)
    wav, _, _ = model.hift(mel)
    return mel, wav
