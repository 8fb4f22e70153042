"""A training set on disk: a folder of audio files, each with a transcript beside it.

``clip01.wav`` + ``clip01.txt`` (UTF-8, the words spoken), and so on; ``.flac`` and ``.ogg``
are read too where soundfile is installed. Files are taken in name order. A clip without a
transcript, an empty transcript or a folder without clips is one error naming the file.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ...audio import Audio, read_wav, write_wav
from ...errors import MizuotoError

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")
DEMO_TEXTS = ("hello there", "a second clip")
DEMO_RATE = 24000


@dataclasses.dataclass(frozen=True)
class Clip:
    name: str
    audio: Path
    transcript: str


def read_clips(folder: str | Path) -> list[Clip]:
    folder = Path(folder)
    if not folder.is_dir():
        raise MizuotoError(f"training data folder not found: {folder}")
    clips = []
    for audio in sorted(p for p in folder.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file()):
        text_file = audio.with_suffix(".txt")
        if not text_file.is_file():
            raise MizuotoError(f"{audio}: no transcript {text_file.name} beside it")
        try:
            text = text_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise MizuotoError(f"{text_file}: cannot be read as UTF-8 text ({exc})") from exc
        if not text:
            raise MizuotoError(f"{text_file}: the transcript is empty")
        clips.append(Clip(audio.stem, audio, text))
    if not clips:
        raise MizuotoError(f"{folder}: no audio clips ({', '.join(AUDIO_SUFFIXES)}) with transcripts (.txt)")
    return clips


def load_audio(path: Path) -> Audio:
    """A clip's samples: soundfile where installed (any format it reads), else 16-bit PCM WAV."""
    try:
        import soundfile
    except ImportError:
        return read_wav(path)
    try:
        data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, soundfile.LibsndfileError) as exc:
        raise MizuotoError(f"{path}: cannot be read as audio ({exc})") from exc
    if data.shape[0] == 0:
        raise MizuotoError(f"{path}: the clip has no samples")
    return Audio(torch.from_numpy(data.T.copy()), int(rate))


def write_demo_clips(folder: str | Path, texts: tuple[str, ...] = DEMO_TEXTS, seconds: float = 1.0,
                     seed: int = 1) -> Path:
    """A tiny training set for tests, benchmarks and demos (no recordings needed): one clip per
    text, a tone with a little noise, each a different pitch, and its transcript."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    t = torch.arange(int(seconds * DEMO_RATE))
    for i, text in enumerate(texts):
        wav = 0.3 * torch.sin(t / (5.0 + 3 * i)) + 0.05 * torch.randn(t.shape[0], generator=gen)
        write_wav(folder / f"clip{i}.wav", Audio(wav.unsqueeze(0), DEMO_RATE))
        (folder / f"clip{i}.txt").write_text(text, encoding="utf-8")
    return folder
