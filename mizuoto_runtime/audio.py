"""Audio as the runtime passes it around, and WAV files (stdlib `wave`, 16-bit PCM)."""
from __future__ import annotations

import dataclasses
import wave
from pathlib import Path

import numpy as np
import torch

from .errors import MizuotoError


@dataclasses.dataclass
class Audio:
    """A waveform `[channels, samples]` float32 in [-1, 1] and its sample rate."""

    waveform: torch.Tensor
    sample_rate: int

    def __post_init__(self) -> None:
        if self.waveform.dim() == 1:
            self.waveform = self.waveform.unsqueeze(0)
        if self.waveform.dim() != 2:
            raise MizuotoError(f"Audio: waveform must be [channels, samples], got shape {tuple(self.waveform.shape)}")

    @property
    def seconds(self) -> float:
        return self.waveform.shape[-1] / self.sample_rate

    def mono(self) -> torch.Tensor:
        return self.waveform.float().mean(0)

    def mono_at(self, rate: int) -> torch.Tensor:
        """The mono waveform at `rate` Hz (torchaudio's resampling, imported only when the rate
        differs: the engines that call it have torchaudio in their requirements)."""
        wav = self.mono()
        if self.sample_rate == rate:
            return wav
        import torchaudio

        return torchaudio.functional.resample(wav, self.sample_rate, rate)


def write_wav(path: str | Path, audio: Audio) -> Path:
    path = Path(path)
    pcm = (audio.waveform.float().clamp(-1, 1) * 32767).round().to(torch.int16)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(pcm.shape[0])
        f.setsampwidth(2)
        f.setframerate(audio.sample_rate)
        f.writeframes(pcm.t().contiguous().numpy().tobytes())
    return path


def read_wav(path: str | Path) -> Audio:
    path = Path(path)
    try:
        with wave.open(str(path), "rb") as f:
            width, channels, rate = f.getsampwidth(), f.getnchannels(), f.getframerate()
            data = f.readframes(f.getnframes())
    except (wave.Error, EOFError) as exc:
        raise MizuotoError(f"{path}: not a PCM WAV file ({exc})") from exc
    if width != 2:
        raise MizuotoError(f"{path}: only 16-bit PCM WAV is read here, got {8 * width}-bit")
    samples = np.frombuffer(data, dtype="<i2").reshape(-1, channels).T.astype(np.float32) / 32768.0
    return Audio(torch.from_numpy(samples.copy()), rate)
