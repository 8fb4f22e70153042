"""The demo engine: a tiny phased TTS with random weights (no download) — voice prompt,
talker and codec decoder, each its own component and phase (M1). It exists so the README's
main job, the nodes and the tests run the whole runtime end to end without model weights.
Its audio is noise shaped by the text and voice, deterministic for a seed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...audio import Audio
from ...memory.phases import RequestContext
from ...memory.tiling import tiled_1d
from ...nn.kv_cache import peak_bytes
from ...nn.loading import build_on_meta, load_safetensors
from ..base import CheckpointInfo, Codes, Engine, Sampling, SmallWeights, Voice
from .model import CODEBOOK, COMPONENTS, FRAMES_PER_TEXT_TOKEN, HOP, random_weights


class DemoEngine(Engine):
    """Three components, three phases: voice prompt, talker, codec decoder (M1)."""

    id = "demo"
    title = "Demo"
    PHASED = True
    BUILTIN = CheckpointInfo("built-in random weights")
    sample_rate = 16000
    WEIGHTS = {
        "voice_prompt": SmallWeights(("speaker_encoder",)),
        "generate": SmallWeights(("talker",)),
        # Its decoder's convolutions hold under 1 MB and its output is heard as it is: int8's
        # rounding there saves nothing worth it (fp8 keeps its exponent, so its error stays relative).
        "decode": SmallWeights(("decoder",), refuses=(("int8", "its decoder's layers are too small for int8 "
                                                                "to save memory worth its rounding"),)),
    }

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        """A folder `tiny.write` wrote: one safetensors file per component."""
        if all((folder / f"{name}.safetensors").is_file() for name in COMPONENTS):
            return CheckpointInfo("Demo")
        return None

    def __init__(self, manager: Any, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None, seed: int = 1234) -> None:
        super().__init__(manager, model_dir, dtype, device)
        modules = self._load(seed)
        self.speaker_encoder = self.register(modules["speaker_encoder"], "speaker_encoder")
        self.talker = self.register(modules["talker"], "talker", kind="sequence")
        self.decoder = self.register(modules["decoder"], "decoder")

    def _load(self, seed: int) -> dict[str, nn.Module]:
        if self.model_dir is None:
            return {k: m.to(self.dtype) for k, m in random_weights(seed).items()}
        return {
            name: load_safetensors(build_on_meta(cls, self.dtype), self.model_dir / f"{name}.safetensors").eval()
            for name, cls in COMPONENTS.items()
        }

    def handles(self) -> list[Any]:
        return [self.speaker_encoder, self.talker, self.decoder]

    # ---- voice prompt ----------------------------------------------------------------------
    def encode_voice(self, ctx: RequestContext, reference: Audio | None, transcript: str | None,
                     speaker: str | None, instruct: str | None = None) -> dict[str, Any]:
        if reference is None:
            with self.seeded(sum((speaker or "default").encode())):
                return {"embedding": torch.randn(1, self.talker.module.dim, dtype=self.dtype)}
        wav = reference.mono().to(self.dtype).unsqueeze(0)
        if wav.shape[-1] < HOP:
            raise ValueError(f"reference audio is too short: {wav.shape[-1]} samples, need at least {HOP}")
        memory = 5 * wav.numel() * wav.element_size()  # frames + conv activations of the same size, tanh, sum

        @torch.inference_mode()
        def encode() -> dict[str, Any]:
            return {"embedding": self.speaker_encoder.module(wav)}

        return ctx.run("voice prompt", [self.speaker_encoder], encode, memory)

    # ---- talker ----------------------------------------------------------------------------
    def frames_for(self, text: str, sampling: Sampling) -> int:
        """M46: frames estimated from the text, capped by max_new_tokens."""
        return min(FRAMES_PER_TEXT_TOKEN * len(text.encode()) + 8, sampling.max_new_tokens)

    def talker_memory(self, prompt_len: int, frames: int) -> int:
        """M45/M46: the growing KV cache's peak plus a step's activations."""
        talker = self.talker.module
        element = torch.tensor([], dtype=self.dtype).element_size()
        position_bytes = 2 * talker.dim * element
        activations = 10 * (prompt_len + 1) * talker.dim * element
        return peak_bytes(position_bytes, len(talker.layers), prompt_len + frames) + activations

    def generate(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling) -> Codes:
        tokens = torch.tensor([list(text.encode())], dtype=torch.long)
        frames = self.frames_for(text, sampling)
        generator = ctx.generator or torch.Generator().manual_seed(sampling.seed)
        talker = self.talker.module
        embedding = voice.data["embedding"].to(self.dtype)

        @torch.inference_mode()
        def talk() -> torch.Tensor:
            caches: list[list[torch.Tensor]] = [[] for _ in talker.layers]
            x = talker.prompt(tokens, embedding)
            out = []
            for i in range(frames):
                ctx.progress(i, frames)
                logits = talker.step(x, caches).float() / max(sampling.temperature, 1e-5)
                top = torch.topk(logits, min(sampling.top_k, CODEBOOK)) if sampling.top_k > 0 else None
                if sampling.do_sample:
                    probs = torch.softmax(top.values if top is not None else logits, -1)
                    pick = torch.multinomial(probs, 1, generator=generator)
                    code = top.indices.gather(-1, pick) if top is not None else pick
                else:
                    code = logits.argmax(-1, keepdim=True)
                out.append(code)
                x = talker.code_embed(code)
            return torch.cat(out, dim=1)

        codes = ctx.run("talker", [self.talker], talk, self.talker_memory(tokens.shape[1] + 1, frames),
                        generators=[generator])
        return Codes(codes, self.id)

    # ---- codec decoder ---------------------------------------------------------------------
    def codec_decoder_memory(self, frames: int) -> int:
        element = torch.tensor([], dtype=self.dtype).element_size()
        return 14 * frames * HOP * 64 * element // 8  # the widest late stage, its input, activations and output

    def decode(self, ctx: RequestContext, codes: Codes, allow_fallback: bool | None = None) -> Audio:
        decoder = self.decoder.module

        @torch.inference_mode()
        def whole() -> torch.Tensor:
            return decoder(codes.tokens)

        @torch.inference_mode()
        def tiled() -> torch.Tensor:
            return tiled_1d(decoder, codes.tokens)

        wav = ctx.run("codec decoder", [self.decoder], whole, self.codec_decoder_memory(codes.tokens.shape[-1]),
                      fallback=("tiled_1d", tiled), allow_fallback=allow_fallback)
        return Audio(wav[0].float(), self.sample_rate)
