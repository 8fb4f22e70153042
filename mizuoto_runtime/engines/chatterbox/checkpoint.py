"""Chatterbox's checkpoint folder (``ResembleAI/chatterbox`` as downloaded) and loading it
through the `chatterbox-tts` package's own module classes (M27).

The published folder has no config: upstream's classes hard-code the sizes (T3's Llama by a
name in ``LLAMA_CONFIGS``, S3Gen's parts by literal arguments). `sizes_of` reads them back from
the safetensors headers (shapes only, no weights), with every attention head 64 wide as in the
published model, so a folder of other sizes (the tiny test checkpoints) builds the same classes
at its sizes: T3's backbone config is registered in upstream's ``LLAMA_CONFIGS`` under a name of
its own (the published entries are never changed), and where a size differs from the
published one the part upstream builds with literal sizes (T3's perceiver; S3Gen's speech
tokenizer, flow encoder and estimator, HiFT vocoder) is rebuilt with the same class and the
same arguments but that size. The published sizes build exactly upstream's ``T3()``,
``S3Gen()`` and ``VoiceEncoder()``.

Loading: built on meta, filled from the memory-mapped safetensors (T3 in the run dtype,
S3Gen and the voice encoder float32 as upstream runs them). ``conds.pt`` (the built-in voice,
a torch pickle of tensors) is read with ``weights_only=True`` only; nothing else is unpickled.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import CheckpointError
from ...nn.loading import SafetensorsFile, build_on_meta, load_safetensors, reading_weights
from ..upstream import ImportNoise, WarningNoise, quiet_import

log = logging.getLogger(__name__)

VE_FILE = "ve.safetensors"
T3_FILE = "t3_cfg.safetensors"
S3GEN_FILE = "s3gen.safetensors"
TOKENIZER_FILE = "tokenizer.json"
CONDS_FILE = "conds.pt"  # the built-in voice (optional)
REQUIRED_FILES = (VE_FILE, T3_FILE, S3GEN_FILE, TOKENIZER_FILE)
# Chatterbox Multilingual, in the same repository: its T3 and grapheme tokenizer, and the voice
# encoder's and S3Gen's weights as upstream's multilingual loader reads them (torch pickles of
# tensors, read with weights_only=True); Cangjie5_TC.json maps Chinese characters (optional).
MULTILINGUAL_T3 = "t3_mtl23ls_v2.safetensors"
MULTILINGUAL_TOKENIZER = "grapheme_mtl_merged_expanded_v1.json"
VE_PICKLE = "ve.pt"
S3GEN_PICKLE = "s3gen.pt"
CANGJIE_FILE = "Cangjie5_TC.json"
MULTILINGUAL_FILES = (MULTILINGUAL_T3, MULTILINGUAL_TOKENIZER, VE_PICKLE, S3GEN_PICKLE)
HEAD_DIM = 64  # every attention head of the published S3 tokenizer, flow and estimator
# T3's Llama has 16 heads (64 wide in the published model): the multilingual model's alignment
# analyzer reads heads 2, 11 and 15 of layers 9, 12 and 13, so a smaller T3 keeps 16 narrower heads.
T3_HEADS = 16
PERCEIVER_HEADS = 4  # T3's perceiver resampler (upstream's default)
PUBLISHED_LLAMA = "Llama_520M"


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The sizes a folder's weights have; the defaults are the published model's."""

    t3_hidden: int = 1024
    t3_layers: int = 30
    t3_intermediate: int = 4096
    t3_head_dim: int = 64
    t3_kv_heads: int = 16
    tokenizer_width: int = 1280
    tokenizer_layers: int = 6
    flow_blocks: int = 6
    flow_units: int = 2048
    estimator_channels: int = 256
    estimator_blocks: int = 4
    estimator_mid_blocks: int = 12
    estimator_heads: int = 8
    hift_channels: int = 512
    f0_channels: int = 512


PUBLISHED = Sizes()


def split_choice(path: Path) -> tuple[Path, bool]:
    """(the folder, multilingual?) of a loader choice: a folder is Chatterbox (English), its
    ``t3_mtl23ls_v2.safetensors`` is Chatterbox Multilingual."""
    if path.name == MULTILINGUAL_T3:
        return path.parent, True
    return path, False


def check_layout(folder: Path, multilingual: bool = False) -> None:
    if not folder.is_dir():
        raise CheckpointError(f"Chatterbox checkpoint folder not found: {folder}")
    needed = (VE_FILE, S3GEN_FILE, TOKENIZER_FILE, *MULTILINGUAL_FILES) if multilingual else REQUIRED_FILES
    missing = [name for name in needed if not (folder / name).is_file()]
    if missing:
        kind = "Chatterbox Multilingual" if multilingual else "Chatterbox"
        raise CheckpointError(f"{folder}: not a {kind} checkpoint folder, missing {', '.join(missing)} "
                              "(expected the files of ResembleAI/chatterbox)")


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with SafetensorsFile(path) as f:
        return {name: tuple(entry[1]) for name, entry in f.entries.items()}


def _count(shapes: dict[str, Any], prefix: str) -> int:
    """How many numbered children `prefix` has (``prefix.0.…``, ``prefix.1.…``)."""
    found = {name[len(prefix):].split(".", 1)[0] for name in shapes if name.startswith(prefix)}
    return len({n for n in found if n.isdigit()})


def _dim(shapes: dict[str, tuple[int, ...]], name: str, axis: int, path: Path) -> int:
    if name not in shapes:
        raise CheckpointError(f"{path}: has no tensor {name} (not laid out as Chatterbox's)")
    return shapes[name][axis]


def sizes_of(folder: Path, multilingual: bool = False,
             s3gen_shapes: dict[str, tuple[int, ...]] | None = None) -> Sizes:
    """The folder's sizes, from its safetensors headers (no weights are read); S3Gen's from
    `s3gen_shapes` where given (the multilingual model's, read from its pickle)."""
    t3_path, s3_path = folder / (MULTILINGUAL_T3 if multilingual else T3_FILE), folder / S3GEN_FILE
    t3 = _shapes(t3_path)
    s3 = s3gen_shapes if s3gen_shapes is not None else _shapes(s3_path)
    layer = "tfmr.layers.0."
    est = "flow.decoder.estimator."
    head_dim = _dim(t3, layer + "self_attn.q_proj.weight", 0, t3_path) // T3_HEADS
    return Sizes(
        t3_hidden=_dim(t3, "text_emb.weight", 1, t3_path),
        t3_layers=_count(t3, "tfmr.layers."),
        t3_intermediate=_dim(t3, layer + "mlp.gate_proj.weight", 0, t3_path),
        t3_head_dim=head_dim,
        t3_kv_heads=_dim(t3, layer + "self_attn.k_proj.weight", 0, t3_path) // max(head_dim, 1),
        tokenizer_width=_dim(s3, "tokenizer.encoder.conv1.weight", 0, s3_path),
        tokenizer_layers=_count(s3, "tokenizer.encoder.blocks."),
        flow_blocks=_count(s3, "flow.encoder.encoders."),
        flow_units=_dim(s3, "flow.encoder.encoders.0.feed_forward.w_1.weight", 0, s3_path),
        estimator_channels=_dim(s3, est + "final_proj.weight", 1, s3_path),
        estimator_blocks=_count(s3, est + "down_blocks.0.1."),
        estimator_mid_blocks=_count(s3, est + "mid_blocks."),
        estimator_heads=_dim(s3, est + "down_blocks.0.1.0.attn1.to_q.weight", 0, s3_path) // HEAD_DIM,
        hift_channels=_dim(s3, "mel2wav.conv_pre.parametrizations.weight.original1", 0, s3_path),
        f0_channels=_dim(s3, "mel2wav.f0_predictor.condnet.0.parametrizations.weight.original1", 0, s3_path),
    )


#: What importing `chatterbox` says that users cannot act on: diffusers' deprecation of
#: `LoRACompatibleLinear` (S3Gen's estimator subclasses it; no LoRA is ever loaded into it).
CHATTERBOX_NOISE = ImportNoise(warnings=(
    WarningNoise(FutureWarning, "`LoRACompatibleLinear` is deprecated", "diffusers.models.lora"),))


def import_upstream() -> None:
    """Import `chatterbox` (an optional extra) and its watermarker's package (`compat`: also
    where setuptools has no `pkg_resources`)."""
    from .compat import import_perth

    import_perth()  # before chatterbox, whose modules import perth
    quiet_import("chatterbox", CHATTERBOX_NOISE)


def llama_config_name(sizes: Sizes) -> str:
    """The name T3 reads its backbone config by: the published one, or a config of these
    sizes registered in upstream's ``LLAMA_CONFIGS`` (a copy of the published config with the
    sizes changed)."""
    from chatterbox.models.t3.llama_configs import LLAMA_CONFIGS

    published = (PUBLISHED.t3_hidden, PUBLISHED.t3_layers, PUBLISHED.t3_intermediate, PUBLISHED.t3_head_dim,
                 PUBLISHED.t3_kv_heads)
    mine = (sizes.t3_hidden, sizes.t3_layers, sizes.t3_intermediate, sizes.t3_head_dim, sizes.t3_kv_heads)
    if mine == published:
        return PUBLISHED_LLAMA
    name = "mizuoto_llama_" + "x".join(str(n) for n in mine)
    LLAMA_CONFIGS.setdefault(name, {
        **LLAMA_CONFIGS[PUBLISHED_LLAMA], "hidden_size": sizes.t3_hidden, "num_hidden_layers": sizes.t3_layers,
        "intermediate_size": sizes.t3_intermediate, "num_attention_heads": T3_HEADS,
        "num_key_value_heads": sizes.t3_kv_heads, "head_dim": sizes.t3_head_dim})
    return name


def build_t3(sizes: Sizes, multilingual: bool = False) -> nn.Module:
    """Upstream's T3 (English, or multilingual: its larger text vocabulary) at `sizes`."""
    from chatterbox.models.t3 import T3
    from chatterbox.models.t3.modules.perceiver import Perceiver
    from chatterbox.models.t3.modules.t3_config import T3Config

    hp = T3Config.multilingual() if multilingual else T3Config.english_only()
    hp.llama_config_name = llama_config_name(sizes)
    t3 = T3(hp)
    if sizes.t3_hidden != PUBLISHED.t3_hidden:  # upstream's Perceiver() defaults are 1024 wide
        t3.cond_enc.perceiver = Perceiver(32, sizes.t3_hidden, sizes.t3_hidden, PERCEIVER_HEADS)
    return t3


def build_s3gen(sizes: Sizes) -> nn.Module:
    """Upstream's ``S3Gen()``; parts whose sizes differ from the published ones rebuilt with
    the arguments `S3Token2Mel` / `S3Token2Wav` give them, at `sizes`."""
    from chatterbox.models.s3gen import S3Gen

    s3gen = S3Gen()
    if (sizes.tokenizer_width, sizes.tokenizer_layers) != (PUBLISHED.tokenizer_width, PUBLISHED.tokenizer_layers):
        _resize_tokenizer(s3gen.tokenizer, sizes)
    flow = (sizes.flow_blocks, sizes.flow_units, sizes.estimator_channels, sizes.estimator_blocks,
            sizes.estimator_mid_blocks, sizes.estimator_heads)
    if flow != (PUBLISHED.flow_blocks, PUBLISHED.flow_units, PUBLISHED.estimator_channels,
                PUBLISHED.estimator_blocks, PUBLISHED.estimator_mid_blocks, PUBLISHED.estimator_heads):
        s3gen.flow = _flow(sizes)
    if (sizes.hift_channels, sizes.f0_channels) != (PUBLISHED.hift_channels, PUBLISHED.f0_channels):
        s3gen.mel2wav = _hift(sizes)
    return s3gen


def _resize_tokenizer(tokenizer: nn.Module, sizes: Sizes) -> None:
    from s3tokenizer.model_v2 import AudioEncoderV2, FSQVectorQuantization

    config = dataclasses.replace(tokenizer.config, n_audio_state=sizes.tokenizer_width,
                                 n_audio_head=sizes.tokenizer_width // HEAD_DIM, n_audio_layer=sizes.tokenizer_layers)
    tokenizer.config = config
    tokenizer.encoder = AudioEncoderV2(config.n_mels, config.n_audio_state, config.n_audio_head, config.n_audio_layer,
                                       2, config.use_sdpa)
    tokenizer.quantizer = FSQVectorQuantization(config.n_audio_state, config.n_codebook_size)


def _flow(sizes: Sizes) -> nn.Module:
    from chatterbox.models.s3gen.configs import CFM_PARAMS
    from chatterbox.models.s3gen.decoder import ConditionalDecoder
    from chatterbox.models.s3gen.flow import CausalMaskedDiffWithXvec
    from chatterbox.models.s3gen.flow_matching import CausalConditionalCFM
    from chatterbox.models.s3gen.transformer.upsample_encoder import UpsampleConformerEncoder

    encoder = UpsampleConformerEncoder(
        output_size=512, attention_heads=512 // HEAD_DIM, linear_units=sizes.flow_units, num_blocks=sizes.flow_blocks,
        dropout_rate=0.1, positional_dropout_rate=0.1, attention_dropout_rate=0.1, normalize_before=True,
        input_layer="linear", pos_enc_layer_type="rel_pos_espnet", selfattention_layer_type="rel_selfattn",
        input_size=512, use_cnn_module=False, macaron_style=False)
    estimator = ConditionalDecoder(
        in_channels=320, out_channels=80, causal=True, channels=[sizes.estimator_channels], dropout=0.0,
        attention_head_dim=HEAD_DIM, n_blocks=sizes.estimator_blocks, num_mid_blocks=sizes.estimator_mid_blocks,
        num_heads=sizes.estimator_heads, act_fn="gelu", meanflow=False)
    decoder = CausalConditionalCFM(spk_emb_dim=80, cfm_params=CFM_PARAMS, estimator=estimator)
    return CausalMaskedDiffWithXvec(encoder=encoder, decoder=decoder)


def _hift(sizes: Sizes) -> nn.Module:
    from chatterbox.models.s3gen.const import S3GEN_SR
    from chatterbox.models.s3gen.f0_predictor import ConvRNNF0Predictor
    from chatterbox.models.s3gen.hifigan import HiFTGenerator

    return HiFTGenerator(
        sampling_rate=S3GEN_SR, upsample_rates=[8, 5, 3], upsample_kernel_sizes=[16, 11, 7],
        source_resblock_kernel_sizes=[7, 7, 11], source_resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5], [1, 3, 5]],
        base_channels=sizes.hift_channels, f0_predictor=ConvRNNF0Predictor(cond_channels=sizes.f0_channels))


@dataclasses.dataclass
class Models:
    """A loaded folder: upstream's modules and text tokenizer, and the built-in voice."""

    t3: nn.Module
    s3gen: nn.Module
    ve: nn.Module
    tokenizer: Any
    conds: dict[str, Any] | None
    sizes: Sizes


def load_conds(path: Path) -> dict[str, Any] | None:
    """The built-in voice (``conds.pt``): ``{"t3": {...}, "gen": {...}}`` of tensors, read with
    ``weights_only=True`` (never an arbitrary unpickle); None where the folder has none."""
    if not path.is_file():
        return None
    try:
        conds = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, ValueError, EOFError) as exc:
        raise CheckpointError(f"{path}: not a Chatterbox built-in voice ({exc})") from exc
    if not (isinstance(conds, dict) and isinstance(conds.get("t3"), dict) and isinstance(conds.get("gen"), dict)):
        raise CheckpointError(f"{path}: not a Chatterbox built-in voice (expected the keys 't3' and 'gen')")
    return conds


def read_pickled_state(path: Path) -> dict[str, torch.Tensor]:
    """A state dict saved with torch.save, memory-mapped and read with ``weights_only=True``."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (RuntimeError, OSError, ValueError, EOFError) as exc:
        raise CheckpointError(f"{path}: not a state dict of tensors ({exc})") from exc
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise CheckpointError(f"{path}: not a state dict of tensors")
    return state


def _fill(model: nn.Module, state: dict[str, torch.Tensor], path: Path, strict: bool = True) -> None:
    """`model` (on meta) takes `state`'s tensors (as upstream's load_state_dict; `strict` False
    where upstream's is)."""
    try:
        model.load_state_dict(state, strict=strict, assign=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{path} does not match {type(model).__name__}: {exc}") from exc
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise CheckpointError(f"{path}: has no {', '.join(left)}")


def mtl_tokenizer(folder: Path) -> Any:
    """Upstream's `MTLTokenizer` for the folder, built without its download: its constructor
    fetches Cangjie5_TC.json from the Hugging Face hub; here it is read from the folder, where
    the published repository has it (without it, Chinese is tokenized without the Cangjie codes,
    as upstream does when its download fails)."""
    from chatterbox.models.tokenizers.tokenizer import ChineseCangjieConverter, MTLTokenizer
    from tokenizers import Tokenizer

    converter = ChineseCangjieConverter.__new__(ChineseCangjieConverter)
    converter.word2cj, converter.cj2word, converter.segmenter = {}, {}, None
    cangjie = folder / CANGJIE_FILE
    if cangjie.is_file():
        for entry in read_json_list(cangjie):
            word, code = str(entry).split("\t")[:2]
            converter.word2cj[word] = code
            converter.cj2word.setdefault(code, []).append(word)
    converter._init_segmenter()
    tokenizer = MTLTokenizer.__new__(MTLTokenizer)
    tokenizer.tokenizer = Tokenizer.from_file(str(folder / MULTILINGUAL_TOKENIZER))
    tokenizer.cangjie_converter = converter
    tokenizer.check_vocabset_sot_eot()
    return tokenizer


def read_json_list(path: Path) -> list[Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot be read as JSON ({exc})") from exc
    if not isinstance(data, list):
        raise CheckpointError(f"{path}: expected a JSON list")
    return data


def load(folder: Path, dtype: torch.dtype, multilingual: bool = False) -> Models:
    """Upstream's modules for `folder` (its English model, or its multilingual one), built on
    meta and filled from its memory-mapped files (M27)."""
    check_layout(folder, multilingual)
    import_upstream()
    from chatterbox.models.tokenizers import EnTokenizer
    from chatterbox.models.voice_encoder import VoiceEncoder

    ve = build_on_meta(VoiceEncoder, torch.float32)
    s3gen_state: dict[str, torch.Tensor] | None = None
    if not reading_weights():  # a shapes-only build (engines.published): the published sizes, no file read
        sizes = PUBLISHED
    elif multilingual:  # upstream's multilingual loader reads the pickled copies
        s3gen_state = read_pickled_state(folder / S3GEN_PICKLE)
        sizes = sizes_of(folder, True, {k: tuple(v.shape) for k, v in s3gen_state.items()})
        _fill(ve, read_pickled_state(folder / VE_PICKLE), folder / VE_PICKLE)
    else:
        sizes = sizes_of(folder)
        load_safetensors(ve, folder / VE_FILE)
    t3 = build_on_meta(lambda: build_t3(sizes, multilingual), dtype)
    load_safetensors(t3, folder / (MULTILINGUAL_T3 if multilingual else T3_FILE))
    s3gen = build_on_meta(lambda: build_s3gen(sizes), torch.float32)
    # As upstream's strict=False: the S3 tokenizer's mel filters and window are computed, not stored.
    if s3gen_state is not None:
        _fill(s3gen, s3gen_state, folder / S3GEN_PICKLE, strict=False)
    else:
        load_safetensors(s3gen, folder / S3GEN_FILE, strict=False)
    path = folder / (MULTILINGUAL_TOKENIZER if multilingual else TOKENIZER_FILE)
    tokenizer = None  # a shapes-only build reads no tokenizer: it cannot run a request
    try:
        if reading_weights():
            tokenizer = mtl_tokenizer(folder) if multilingual else EnTokenizer(str(path))
    except (OSError, ValueError, AssertionError) as exc:
        raise CheckpointError(f"{path}: not Chatterbox's text tokenizer ({exc!r})") from exc
    for module in (t3, s3gen, ve):
        module.eval()
    return Models(t3, s3gen, ve, tokenizer, load_conds(folder / CONDS_FILE), sizes)
