"""CosyVoice's voice-prompt parts as torch modules under the runtime (issue 22; M4): the CAM++
speaker encoder (``campplus.onnx``) and the S3 speech tokenizer (``speech_tokenizer_v2.onnx``
/ ``_v3.onnx``), their weights taken from the ONNX files' initializers, so their memory is
counted, placed and evicted like every other component (onnxruntime would hide it).

- CAM++: the ONNX graph becomes a torch ``GraphModule`` with ``onnx2torch`` (every node a torch
  op, every initializer a parameter or buffer). Input as upstream's frontend makes it: kaldi
  fbank (80 bins, 16 kHz, dither 0; `nn.features.kaldi_fbank`) minus its mean over time.
- S3 tokenizer: ``s3tokenizer``'s torch model (``S3TokenizerV2`` / ``V3``) filled from the file's
  initializers by that package's own name mapping for the published files; a file it cannot map
  is converted as a graph (``onnx2torch``) instead. Input: whisper's 128-bin log-mel of the
  16 kHz audio (``s3tokenizer.log_mel_spectrogram``, what upstream's ``whisper`` call computes).

Verified here: both paths on small ONNX files the tests write (outputs equal onnxruntime's).
Not verified here: the published ``campplus.onnx`` and tokenizer files themselves (no copy is
available offline); ``s3tokenizer``'s mapping is that package's, made for those files.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from ...errors import CheckpointError
from ...nn.features import kaldi_fbank

log = logging.getLogger(__name__)

SPEAKER_RATE = 16000
MAX_PROMPT_SECONDS = 30  # upstream refuses longer audio for the speech tokenizer


def _graph(path: Path) -> nn.Module:
    """An ONNX file as a torch module (weights from its initializers)."""
    import onnx
    from onnx2torch import convert

    try:
        return convert(onnx.load(str(path)))
    except (OSError, ValueError, NotImplementedError, onnx.onnx_cpp2py_export.checker.ValidationError) as exc:
        raise CheckpointError(f"{path}: cannot be converted to a torch module ({exc})") from exc


class CampPlus(nn.Module):
    """Speaker embedding ``(1, 192)`` of 16 kHz audio ``(1, samples)``."""

    def __init__(self, graph: nn.Module) -> None:
        super().__init__()
        self.graph = graph

    def forward(self, wav16k: torch.Tensor) -> torch.Tensor:
        feat = kaldi_fbank(wav16k, num_mel_bins=80, sample_frequency=SPEAKER_RATE)
        feat = feat - feat.mean(dim=0, keepdim=True)
        return self.graph(feat.unsqueeze(0)).reshape(1, -1)


def load_campplus(path: Path) -> CampPlus:
    return CampPlus(_graph(path))


class SpeechTokenizer(nn.Module):
    """Speech tokens ``(1, n)`` int32 (25 Hz) of 16 kHz audio ``(1, samples)``."""

    def __init__(self, model: nn.Module, packaged: bool) -> None:
        super().__init__()
        self.model = model
        self.packaged = packaged  # s3tokenizer's model (else an onnx2torch graph)

    @property
    def attention_heads(self) -> int:
        """The encoder's attention heads (s3tokenizer's config); 0 for a converted graph, whose
        heads are not known (M45: the engine's estimate counts their scores)."""
        return int(self.model.config.n_audio_head) if self.packaged else 0

    @property
    def rotary_table_bytes(self) -> int:
        """Bytes a call holds whatever the audio's length: s3tokenizer's V2 encoder builds cos
        and sin over its whole rotary table (2048 positions x 128, float32: 2 MiB) at every call
        and keeps them through its blocks; V3 cuts the table to the audio (M45)."""
        import s3tokenizer

        if not self.packaged or not isinstance(self.model, s3tokenizer.S3TokenizerV2):
            return 0
        return 2 * torch.view_as_real(self.model.encoder.freqs_cis).numel() * 4

    def forward(self, wav16k: torch.Tensor) -> torch.Tensor:
        from s3tokenizer import log_mel_spectrogram

        mel = log_mel_spectrogram(wav16k[0], n_mels=128).unsqueeze(0)
        length = torch.tensor([mel.shape[2]], dtype=torch.int32, device=mel.device)
        if self.packaged:
            codes, _ = self.model.quantize(mel, length)
        else:
            codes = self.model(mel, length)
        return codes.reshape(1, -1).to(torch.int32)


def load_speech_tokenizer(path: Path) -> SpeechTokenizer:
    """s3tokenizer's model for the published files; any other ONNX graph converted as it is."""
    import s3tokenizer

    from ...nn.loading import build_on_meta

    cls = s3tokenizer.S3TokenizerV3 if "v3" in path.name else s3tokenizer.S3TokenizerV2
    convert = s3tokenizer.onnx2torch_v3 if "v3" in path.name else s3tokenizer.onnx2torch
    try:
        state = convert(str(path), None, False)
        model = build_on_meta(lambda: cls(path.stem))
        if set(state) == set(model.state_dict()):
            # torch's own method: S3TokenizerV3 overrides it without `assign` (a TypeError there)
            nn.Module.load_state_dict(model, state, strict=True, assign=True)
            return SpeechTokenizer(model.eval(), packaged=True)
    except (KeyError, IndexError, ValueError, RuntimeError, AssertionError) as exc:
        # s3tokenizer's mapping checks each name with a bare `assert` (an AssertionError with no
        # message): what it tripped on is kept for debugging, not shown as the reason
        log.debug("%s: s3tokenizer's weight mapping failed", path.name, exc_info=exc)
    log.info("%s: not laid out as the published speech tokenizer (s3tokenizer's model cannot take its "
             "weights), so its ONNX graph runs as converted, node by node", path.name)
    return SpeechTokenizer(_graph(path), packaged=False)


def resample(wav: torch.Tensor, rate: int, target: int) -> torch.Tensor:
    """Mono ``(1, samples)`` at `target` Hz, as upstream's ``load_wav`` (torchaudio's sinc resampler)."""
    if rate == target:
        return wav
    import torchaudio

    return torchaudio.functional.resample(wav, rate, target)
