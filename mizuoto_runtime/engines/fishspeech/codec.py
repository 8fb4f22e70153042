"""Fish Speech's codec (a modified DAC, 44.1 kHz): encoder, residual quantizer with a semantic
codebook and downsampling, window-limited transformers, decoder.

Two halves, each its own component: `CodecEncoder` (audio -> codes: the encoder, the
quantizer's downsampling and pre-transformer, the codebooks' nearest-neighbour search) and
`CodecDecoder` (codes -> audio: codebook lookups, the post-transformer, upsampling, the
decoder). The codebooks and their 1x1 projections are small and appear in both.

Numbers as upstream makes them:
* every conv is causal: left pad ``(kernel - 1) * dilation + 1 - stride`` zeros and right pad
  what makes the last window whole; a transposed conv crops ``kernel - stride`` on the right;
  residual units crop the skip path on the right to the branch's length;
* Snake: ``x + sin(alpha x)^2 / (alpha + 1e-9)``;
* the quantizer searches each codebook by L2-normalised distance, ``|e|^2 - 2 e.c + |c|^2``
  with argmax of its negation, and passes on ``z_e + (z_q - z_e)`` (not ``z_q``), projected
  back; the residual codebooks quantize what the semantic one leaves;
* the transformers are causal with a sliding window (each position sees itself and the
  ``window - 1`` before it); the encoder's uses 512, the quantizer's the configured one;
  RoPE tables in bfloat16 as in the dual-AR model (`dual_ar.ROPE_DTYPE`);
* decoding clamps the semantic codes to its codebook and the residual ones to theirs.
Weight norm (either key form) is folded into plain weights at load (`nn.weight_norm`).
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...nn.convnext import ConvNeXtBlock
from ...nn.feed_forward import SwiGLU
from ...nn.norm import RMSNorm
from ...nn.rotary import apply_pair_table, pair_table
from ...nn.snake import Snake
from ...nn.vq import nearest_codes
from .dual_ar import ROPE_DTYPE

ENCODER_WINDOW = 512  # upstream's encoder transformer never reads its configured window
HEAD_DIM = 64


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    n_layer: int
    dim: int
    n_head: int
    intermediate_size: int
    window: int
    head_dim: int = HEAD_DIM
    rope_base: float = 10000.0
    norm_eps: float = 1e-5


@dataclasses.dataclass(frozen=True)
class CodecConfig:
    """The codec's shapes (the official file carries none: upstream's YAML gives them; the loader
    reads them off the tensors, `codec_weights.infer_codec_config`)."""

    sample_rate: int
    encoder_dim: int
    encoder_rates: tuple[int, ...]
    latent_dim: int
    decoder_dim: int
    decoder_rates: tuple[int, ...]
    encoder_transformer_layers: tuple[int, ...]
    n_codebooks: int
    codebook_size: int
    codebook_dim: int
    semantic_codebook_size: int
    downsample_factor: tuple[int, ...]
    pre: TransformerConfig | None
    post: TransformerConfig | None

    @property
    def frame_length(self) -> int:
        """Samples per code frame (audio is padded to a multiple of it before encoding)."""
        return math.prod(self.encoder_rates) * math.prod(self.downsample_factor)


def _snake(channels: int) -> Snake:
    return Snake(channels, column=True)  # DAC stores alpha as a (1, C, 1) column


class CausalConv(nn.Module):
    """A conv padded on the left so that output ``t`` sees only input up to ``t``."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.span = (kernel - 1) * dilation + 1
        self.pad = self.span - stride

    def forward(self, x: Tensor) -> Tensor:
        length = x.shape[-1]
        frames = (length - self.span + self.pad) / self.stride + 1
        extra = (math.ceil(frames) - 1) * self.stride + (self.span - self.pad) - length
        return self.conv(F.pad(x, (self.pad, extra))).contiguous()


class CausalConvTranspose(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.crop = kernel - stride

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv(x)
        return x[..., : x.shape[-1] - self.crop].contiguous()


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.block = nn.Sequential(_snake(dim), CausalConv(dim, dim, 7, dilation=dilation), _snake(dim),
                                   CausalConv(dim, dim, 1))

    def forward(self, x: Tensor) -> Tensor:
        y = self.block(x)
        crop = x.shape[-1] - y.shape[-1]
        if crop > 0:
            x = x[..., :-crop]
        return x + y


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class CodecAttention(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, 3 * cfg.n_head * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_head * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: Tensor, rope: Tensor, mask: Tensor) -> Tensor:
        b, s, _ = x.shape
        size = self.n_head * self.head_dim
        q, k, v = (t.view(b, s, self.n_head, self.head_dim) for t in self.wqkv(x).split([size, size, size], dim=-1))
        q, k = apply_pair_table(q, rope), apply_pair_table(k, rope)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask[None, None])
        return self.wo(y.transpose(1, 2).contiguous().view(b, s, size))


class CodecBlock(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.attention = CodecAttention(cfg)
        self.feed_forward = SwiGLU(cfg.dim, cfg.intermediate_size)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention_layer_scale = LayerScale(cfg.dim)
        self.ffn_layer_scale = LayerScale(cfg.dim)

    def forward(self, x: Tensor, rope: Tensor, mask: Tensor) -> Tensor:
        h = x + self.attention_layer_scale(self.attention(self.attention_norm(x), rope, mask))
        return h + self.ffn_layer_scale(self.feed_forward(self.ffn_norm(h)))


class WindowTransformer(nn.Module):
    """Causal transformer over ``[B, C, T]`` whose positions see a window of the past."""

    def __init__(self, cfg: TransformerConfig, input_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(CodecBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.input_proj: nn.Module = nn.Linear(input_dim, cfg.dim) if input_dim != cfg.dim else nn.Identity()
        self.output_proj: nn.Module = nn.Linear(cfg.dim, input_dim) if input_dim != cfg.dim else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        x = self.input_proj(x.transpose(1, 2))
        t = x.shape[1]
        positions = torch.arange(t, device=x.device)
        rope = pair_table(positions, self.cfg.head_dim, self.cfg.rope_base, ROPE_DTYPE)
        mask = (positions[None, :] <= positions[:, None]) & (positions[None, :] > positions[:, None] - self.cfg.window)
        for layer in self.layers:
            x = layer(x, rope, mask)
        return self.output_proj(self.norm(x)).transpose(1, 2)


class Chain(nn.Module):
    """Layers run in order, kept under ``block`` (the checkpoint's key path)."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.block = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class EncoderBlock(Chain):
    def __init__(self, dim: int, stride: int, transformer: TransformerConfig | None) -> None:
        half = dim // 2
        layers: list[nn.Module] = [ResidualUnit(half, 1), ResidualUnit(half, 3), ResidualUnit(half, 9), _snake(half),
                                   CausalConv(half, dim, 2 * stride, stride=stride)]
        if transformer is not None:
            layers.append(WindowTransformer(transformer, dim))
        super().__init__(layers)


class Encoder(Chain):
    def __init__(self, cfg: CodecConfig) -> None:
        d = cfg.encoder_dim
        blocks: list[nn.Module] = [CausalConv(1, d, 7)]
        for stride, n_layer in zip(cfg.encoder_rates, cfg.encoder_transformer_layers):
            d *= 2
            t = (TransformerConfig(n_layer=n_layer, dim=d, n_head=d // HEAD_DIM, intermediate_size=3 * d,
                                   window=ENCODER_WINDOW) if n_layer else None)
            blocks.append(EncoderBlock(d, stride, t))
        super().__init__([*blocks, _snake(d), CausalConv(d, cfg.latent_dim, 3)])


class DecoderBlock(Chain):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__([_snake(cin), CausalConvTranspose(cin, cout, 2 * stride, stride),
                          ResidualUnit(cout, 1), ResidualUnit(cout, 3), ResidualUnit(cout, 9)])


class Decoder(nn.Module):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [CausalConv(cfg.latent_dim, cfg.decoder_dim, 7)]
        out = cfg.decoder_dim
        for i, stride in enumerate(cfg.decoder_rates):
            cin, out = cfg.decoder_dim // 2 ** i, cfg.decoder_dim // 2 ** (i + 1)
            layers.append(DecoderBlock(cin, out, stride))
        layers += [_snake(out), CausalConv(out, 1, 7), nn.Tanh()]
        self.model = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)


class Codebook(nn.Module):
    """One codebook with its 1x1 in/out projections (keys as the ``dac`` package names them)."""

    def __init__(self, dim: int, size: int, codebook_dim: int) -> None:
        super().__init__()
        self.in_proj = nn.Conv1d(dim, codebook_dim, 1)
        self.out_proj = nn.Conv1d(codebook_dim, dim, 1)
        self.codebook = nn.Embedding(size, codebook_dim)

    def quantize(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """(codes ``[B, T]``, what it takes out of `z` ``[B, dim, T]``)."""
        z_e = self.in_proj(z)
        codes = nearest_codes(z_e, self.codebook.weight)
        z_q = self.lookup(codes)
        return codes, self.out_proj(z_e + (z_q - z_e))

    def lookup(self, codes: Tensor) -> Tensor:
        return F.embedding(codes, self.codebook.weight).transpose(1, 2)

    def decode(self, codes: Tensor) -> Tensor:
        return self.out_proj(self.lookup(codes))


class Codebooks(nn.Module):
    def __init__(self, dim: int, count: int, size: int, codebook_dim: int) -> None:
        super().__init__()
        self.size = size
        self.quantizers = nn.ModuleList(Codebook(dim, size, codebook_dim) for _ in range(count))

    def quantize(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """(codes ``[B, count, T]``, the sum taken out); each codebook quantizes what the earlier left."""
        residual, taken, codes = z, torch.zeros((), dtype=z.dtype, device=z.device), []
        for q in self.quantizers:
            c, z_q = q.quantize(residual)
            taken = taken + z_q
            residual = residual - z_q
            codes.append(c)
        return torch.stack(codes, dim=1), taken

    def decode(self, codes: Tensor) -> Tensor:
        z: Tensor | float = 0.0
        for i, q in enumerate(self.quantizers):
            z = z + q.decode(codes[:, i])
        assert isinstance(z, Tensor)
        return z


def _convnext(dim: int) -> ConvNeXtBlock:
    return ConvNeXtBlock(dim, 4 * dim, CausalConv(dim, dim, 7, groups=dim))


def _downsample(cfg: CodecConfig) -> nn.Sequential:
    d = cfg.latent_dim
    return nn.Sequential(*[nn.Sequential(CausalConv(d, d, f, stride=f), _convnext(d)) for f in cfg.downsample_factor])


def _upsample(cfg: CodecConfig) -> nn.Sequential:
    d = cfg.latent_dim
    return nn.Sequential(*[nn.Sequential(CausalConvTranspose(d, d, f, f), _convnext(d))
                           for f in reversed(cfg.downsample_factor)])


class Quantizer(nn.Module):
    """The quantizer's weights one codec half needs (keys under ``quantizer.`` as upstream)."""

    def __init__(self, cfg: CodecConfig, encode: bool) -> None:
        super().__init__()
        d = cfg.latent_dim
        self.semantic_quantizer = Codebooks(d, 1, cfg.semantic_codebook_size, cfg.codebook_dim)
        self.quantizer = Codebooks(d, cfg.n_codebooks, cfg.codebook_size, cfg.codebook_dim)
        if encode:
            self.downsample = _downsample(cfg)
            self.pre_module: nn.Module = WindowTransformer(cfg.pre, d) if cfg.pre else nn.Identity()
        else:
            self.upsample = _upsample(cfg)
            self.post_module: nn.Module = WindowTransformer(cfg.post, d) if cfg.post else nn.Identity()


class CodecEncoder(nn.Module):
    """Audio ``[B, samples]`` (44.1 kHz) -> codes ``[B, 1 + n_codebooks, frames]``."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.quantizer = Quantizer(cfg, encode=True)

    def memory_units(self) -> list[nn.Module]:
        """M12: the encoder's blocks, then the quantizer's transformer layers."""
        return [*list(self.encoder.block)[1:-2], *getattr(self.quantizer.pre_module, "layers", [])]

    def latent(self, audio: Tensor) -> Tensor:
        """The encoder's output on `audio` right-padded with zeros to whole code frames."""
        length = audio.shape[-1]
        pad = math.ceil(length / self.cfg.frame_length) * self.cfg.frame_length - length
        return self.encoder(F.pad(audio[:, None], (0, pad)))

    def forward(self, audio: Tensor) -> Tensor:
        q = self.quantizer
        z = q.pre_module(q.downsample(self.latent(audio)))
        semantic, taken = q.semantic_quantizer.quantize(z)
        residual, _ = q.quantizer.quantize(z - taken)
        return torch.cat([semantic, residual], dim=1)


class CodecDecoder(nn.Module):
    """Codes ``[B, 1 + n_codebooks, frames]`` -> audio ``[B, 1, frames * hop]``."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = Quantizer(cfg, encode=False)
        self.decoder = Decoder(cfg)

    def memory_units(self) -> list[nn.Module]:
        """M12: the quantizer's transformer layers, then the decoder's upsampling blocks."""
        return [*getattr(self.quantizer.post_module, "layers", []), *list(self.decoder.model)[1:-3]]

    def latent(self, codes: Tensor) -> Tensor:
        """The quantizer's decoded latent (codes clamped to their codebooks, on a copy)."""
        q = self.quantizer
        semantic = codes[:, :1].clamp(max=q.semantic_quantizer.size - 1)
        residual = codes[:, 1:].clamp(max=q.quantizer.size - 1)
        z = q.semantic_quantizer.decode(semantic) + q.quantizer.decode(residual)
        return q.upsample(q.post_module(z))

    def forward(self, codes: Tensor) -> Tensor:
        return self.decoder(self.latent(codes))
