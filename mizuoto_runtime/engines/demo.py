"""The demo engine: a tiny phased TTS with random weights (no download) — voice prompt,
talker and codec decoder, each its own component and phase (M1). It exists so the README's
main job, the nodes and the tests run the whole runtime end to end without model weights.
Its audio is noise shaped by the text and voice, deterministic for a seed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..audio import Audio
from ..lm.cache import peak_bytes
from ..loading import build_on_meta, load_safetensors
from ..phases import RequestContext
from ..tiling import tiled_1d
from .base import CheckpointInfo, Codes, Engine, Sampling, Voice

HOP = 256  # waveform samples per code frame
CODEBOOK = 256
TEXT_VOCAB = 256  # UTF-8 bytes
FRAMES_PER_TEXT_TOKEN = 4


class SpeakerEncoder(nn.Module):
    """Reference waveform → a voice embedding (oneshot)."""

    def __init__(self, dim: int = 256, width: int = 384) -> None:
        super().__init__()
        self.inp = nn.Conv1d(HOP, width, 3, padding=1)
        self.blocks = nn.Sequential(*(nn.Conv1d(width, width, 3, padding=1) for _ in range(2)))
        self.out = nn.Linear(width, dim)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        usable = wav.shape[-1] // HOP * HOP
        frames = wav[..., :usable].reshape(wav.shape[0], -1, HOP).transpose(1, 2)
        h = self.inp(frames)
        for block in self.blocks:
            h = h + torch.tanh(block(h))
        return self.out(h.mean(-1))


class TalkerLayer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.norm2 = nn.RMSNorm(dim)
        self.up = nn.Linear(dim, 3 * dim, bias=False)
        self.down = nn.Linear(3 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor]) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        if cache:
            k, v = torch.cat([cache[0], k], 1), torch.cat([cache[1], v], 1)
        cache[:] = [k, v]
        mask = None
        if q.shape[1] > 1:
            mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).tril(k.shape[1] - q.shape[1])
        x = x + self.o(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        return x + self.down(F.silu(self.up(self.norm2(x))))


class Talker(nn.Module):
    """Text bytes + voice → code frames, token by token (sequence)."""

    def __init__(self, dim: int = 256, layers: int = 4) -> None:
        super().__init__()
        self.dim = dim
        self.text_embed = nn.Embedding(TEXT_VOCAB, dim)
        self.code_embed = nn.Embedding(CODEBOOK + 1, dim)  # + a start-of-audio code
        self.voice_proj = nn.Linear(dim, dim)
        self.layers = nn.ModuleList(TalkerLayer(dim) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, CODEBOOK, bias=False)

    def step(self, x: torch.Tensor, caches: list[list[torch.Tensor]]) -> torch.Tensor:
        for layer, cache in zip(self.layers, caches):
            x = layer(x, cache)
        return self.head(self.norm(x[:, -1]))

    def prompt(self, text: torch.Tensor, voice: torch.Tensor) -> torch.Tensor:
        start = self.code_embed(torch.full((text.shape[0], 1), CODEBOOK))
        return torch.cat([self.voice_proj(voice).unsqueeze(1), self.text_embed(text), start], dim=1)


class CodecDecoder(nn.Module):
    """Code frames → waveform, upsampling ×256 through ConvTranspose1d stages (oneshot)."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(CODEBOOK, width)
        self.pre = nn.Conv1d(width, width, 7, padding=3)
        chans = [width, width, width // 2, width // 4, width // 8]
        self.stages = nn.Sequential(*(
            nn.Sequential(nn.ConvTranspose1d(chans[i], chans[i + 1], 8, stride=4, padding=2),
                          nn.Conv1d(chans[i + 1], chans[i + 1], 7, padding=3))
            for i in range(4)
        ))
        self.post = nn.Conv1d(chans[-1], 1, 7, padding=3)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        h = self.pre(self.embed(codes).transpose(1, 2))
        for up, conv in self.stages:
            h = up(F.leaky_relu(h, 0.1))
            h = h + conv(F.leaky_relu(h, 0.1))
        return torch.tanh(self.post(h))


COMPONENTS: dict[str, type[nn.Module]] = {"speaker_encoder": SpeakerEncoder, "talker": Talker, "decoder": CodecDecoder}


def random_weights(seed: int = 1234) -> dict[str, nn.Module]:
    """The demo's components with weights drawn from `seed` (no download)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return {name: cls().eval() for name, cls in COMPONENTS.items()}


def save_checkpoint(directory: str | Path, seed: int = 1234, dtype: torch.dtype = torch.float32) -> Path:
    """Write the demo's components as `<name>.safetensors` (for the loading path, M27)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, module in random_weights(seed).items():
        state = {k: v.to(dtype).contiguous() for k, v in module.state_dict().items()}
        save_file(state, str(directory / f"{name}.safetensors"))
    return directory


class DemoEngine(Engine):
    """Three components, three phases: voice prompt, talker, codec decoder (M1)."""

    id = "demo"
    title = "Demo"
    PHASED = True
    BUILTIN = CheckpointInfo("built-in random weights")
    sample_rate = 16000

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        """A folder `save_checkpoint` wrote: one safetensors file per component."""
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

    def generation_memory(self, prompt_len: int, frames: int) -> int:
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

        codes = ctx.run("talker", [self.talker], talk, self.generation_memory(tokens.shape[1] + 1, frames),
                        generators=[generator])
        return Codes(codes, self.id)

    # ---- codec decoder ---------------------------------------------------------------------
    def decoder_memory(self, frames: int) -> int:
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

        wav = ctx.run("codec decoder", [self.decoder], whole, self.decoder_memory(codes.tokens.shape[-1]),
                      fallback=("tiled_1d", tiled), allow_fallback=allow_fallback)
        return Audio(wav[0].float(), self.sample_rate)
