"""M45: each engine phase's working-memory estimate, made from the request before the phase runs,
fits what the phase really allocates: between 1.0x and 1.3x of its measured CPU peak, for every
phase of every engine (Qwen3-TTS, F5-TTS, OmniVoice, VoxCPM 2, the demo, CosyVoice 2 / 3, Fish
Speech S2-Pro / S1-mini, IndexTTS-2, GPT-SoVITS v2, Higgs Audio v2, VibeVoice, Dia, CSM,
Chatterbox), on the plain CPU with tiny checkpoints in the published layouts, at two request sizes
each (issue 11, 12, 21, 22, 34).

Measured as `bench/engines.py --peaks` prints it (`phase_peaks`): the peak of CPU tensor storages
created while the phase runs (`PeakTracker`), each counted until it is freed. On the plain CPU
nothing is placed or streamed, so that peak is the phase's own working memory plus what it
returns. Never under it: a phase under `ctx.use` is not retried (M41), and one on a nearly full
device would run out of memory. Not much over it either: the estimate decides whether the
weights fit whole, and over-reserving pushes weights out for nothing.
"""
from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import require_engine, require_qwen_tts

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_engines", REPO / "bench" / "engines.py")
assert spec is not None and spec.loader is not None
bench_engines = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench_engines  # its dataclasses look their module up
spec.loader.exec_module(bench_engines)

LOW, HIGH = 1.0, 1.3
PHASES = {  # the phases each engine must report (with components: where weights are placed)
    "qwen3tts": {"voice prompt (codec_encoder)", "voice prompt (speaker_encoder)", "talker (talker)",
                 "codec decoder (codec_decoder)"},
    "f5tts": {"flow (flow)", "vocoder (vocoder)"},
    "omnivoice": {"voice prompt (audio_encoder+quantizer)", "llm (llm)", "codec decoder (quantizer+audio_decoder)"},
    "voxcpm2": {"voice prompt (vae_encoder)", "generate (generator)", "decoder (vae_decoder)"},
    "demo": {"voice prompt (speaker_encoder)", "talker (talker)", "codec decoder (decoder)"},
    **{f"cosyvoice{v}": {"voice prompt (campplus+speech_tokenizer)", "talker (llm)", "flow (flow)", "vocoder (vocoder)"}
       for v in (2, 3)},
    **{name: {"voice prompt (codec_encoder)", "talker (talker)", "decoder (codec_decoder)"}
       for name in ("fishspeech", "fishspeech-s1")},
    "indextts2": {"voice prompt (w2v_bert+semantic_codec+campplus+conditioning)", "talker (talker)", "flow (flow)",
                  "vocoder (vocoder)"},
    "gptsovits": {"voice prompt (hubert+vits)", "bert (bert)", "talker (t2s)", "decoder (vits)"},
    "higgsaudio": {"voice prompt (audio_encoder+quantizer)", "talker (talker)", "decoder (quantizer+audio_decoder)"},
    "vibevoice": {"voice prompt (acoustic_encoder)", "talker (talker+acoustic_decoder+semantic_encoder)"},
    "dia": {"voice prompt (dac_encoder+quantizer)", "talker (talker)", "decoder (quantizer+dac_decoder)"},
    "csm": {"voice prompt (mimi_encoder+quantizer)", "talker (talker)", "decoder (quantizer+mimi_decoder)"},
    **{name: {"voice prompt (s3_tokenizer+speaker_encoder+voice_encoder)", "talker (talker)", "flow (flow)",
              "vocoder (vocoder)"} for name in ("chatterbox", "chatterbox-mtl")},
}
# engines whose folders bench/engines.py writes
NATIVE = ("cosyvoice", "fishspeech", "indextts2", "gptsovits", "chatterbox")


@pytest.fixture
def folder(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], Path | None]:
    def checkpoint(engine_id: str) -> Path | None:
        if engine_id == "demo":
            return None  # random weights, no folder
        native = bench_engines.RUNTIME_IDS.get(engine_id, engine_id)
        if native in NATIVE:
            require_engine(native)
            return bench_engines.checkpoint_folders([engine_id], tmp_path)[engine_id]
        if engine_id == "qwen3tts":
            require_qwen_tts()
            return request.getfixturevalue("qwen3tts_checkpoint")("base")
        return request.getfixturevalue(f"{engine_id}_checkpoint")()

    return checkpoint


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("engine_id", sorted(PHASES))
def test_every_phase_estimates_between_1_and_1_3_of_its_peak(engine_id: str,
                                                             folder: Callable[[str], Path | None]) -> None:
    rows = bench_engines.phase_peaks({engine_id: folder(engine_id)})
    assert {r.phase for r in rows} == PHASES[engine_id]
    assert len({r.request for r in rows}) == 2 and all(r.peak > 0 for r in rows)  # each phase really allocated
    off = [f"{r.phase}, {r.request}: estimate {r.estimate / 2**20:.2f} MB, measured {r.peak / 2**20:.2f} MB "
           f"({r.ratio:.2f}x)" for r in rows if not LOW <= r.ratio <= HIGH]
    assert not off, "\n".join(off)
