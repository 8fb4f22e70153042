"""Loading a published CosyVoice 2 / CosyVoice 3 folder into our modules (issue 22).

Folder layout (as downloaded): ``cosyvoice2.yaml`` or ``cosyvoice3.yaml``, ``llm.pt``,
``flow.pt``, ``hift.pt`` (state_dicts, read with ``torch.load(weights_only=True, mmap=True)``),
``CosyVoice-BlankEN/`` (Qwen2 config, tokenizer and ``model.safetensors``), and for voice
prompts ``campplus.onnx``, ``speech_tokenizer_v2.onnx`` / ``_v3.onnx``, ``spk2info.pt``.

The yaml is read as data (`config`): its ``llm``, ``flow``, ``hift`` and ``feat_extractor``
tags are mapped to our classes with their arguments; an unknown tag there is one error naming
it. The LM's Qwen2 weights come from ``llm.pt`` (upstream loads them strictly over the
BlankEN ones); only when ``llm.pt`` lacks them are they read from the BlankEN safetensors.
Modules are built with parameters on ``meta`` and filled from the checkpoint (no second copy).
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import CheckpointError
from ...nn.checkpoint import load_state_dict
from ...nn.decoder import DecoderConfig
from ...nn.loading import build_on_meta, reading_weights
from ...nn.weight_norm import fold_state_dict
from ..checkpoint_files import read_json
from .config import ModelConfig, Tag, args_of, expect
from .dit import DiT, DiTSpec
from .flow import CausalCFM, CosyVoiceFlow, EncoderSpec, PreLookaheadLayer, UpsampleConformerEncoder
from .hift import FixedSource, HiFT, HiFTSpec
from .lm import CosyVoiceLM, LMSpec, RasParams
from .unet import CausalConditionalDecoder, UNetSpec

log = logging.getLogger(__name__)

BLANK_EN = "CosyVoice-BlankEN"
YAMLS = {2: "cosyvoice2.yaml", 3: "cosyvoice3.yaml"}
LM_CLASSES = {"cosyvoice.llm.llm.Qwen2LM": 2, "cosyvoice.llm.llm.CosyVoice3LM": 3}
FLOW_CLASSES = {"cosyvoice.flow.flow.CausalMaskedDiffWithXvec": 2, "cosyvoice.flow.flow.CausalMaskedDiffWithDiT": 3}
HIFT_CLASSES = {"cosyvoice.hifigan.generator.HiFTGenerator": False,
                "cosyvoice.hifigan.generator.CausalHiFTGenerator": True}
F0_CLASSES = {"cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor": False,
              "cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor": True}
MEL_FUNCTIONS = {"matcha.utils.audio.mel_spectrogram": "matcha"}


def detect_version(folder: Path) -> int:
    """2 or 3, from which yaml the folder holds."""
    found = [v for v, name in YAMLS.items() if (folder / name).is_file()]
    if len(found) != 1:
        raise CheckpointError(f"{folder}: expected exactly one of {', '.join(YAMLS.values())}"
                              + (f", found {len(found)}" if found else ""))
    return found[0]


# ---- specs from the yaml --------------------------------------------------------------------
def lm_spec(cfg: ModelConfig, blank_en: Path) -> LMSpec:
    tag = cfg.get("llm")
    version = expect(tag, LM_CLASSES, "llm", cfg.path)
    a = args_of(tag)
    expect(a.get("llm"), {"cosyvoice.llm.llm.Qwen2Encoder": True}, "llm/llm", cfg.path)
    sampling = a.get("sampling")
    expect(sampling, {"cosyvoice.utils.common.ras_sampling": True}, "llm/sampling", cfg.path)
    s = args_of(sampling)
    decoder = DecoderConfig.from_hf(read_json(blank_en / "config.json"), qk_norm=False)
    return LMSpec(version=version, llm_input_size=int(a["llm_input_size"]), llm_output_size=int(a["llm_output_size"]),
                  speech_token_size=int(a["speech_token_size"]), decoder=decoder,
                  sampling=RasParams(float(s.get("top_p", 0.8)), int(s.get("top_k", 25)),
                                     int(s.get("win_size", 10)), float(s.get("tau_r", 0.1))))


def _require(args: Mapping[str, Any], key: str, allowed: tuple[Any, ...], where: str, path: Path) -> None:
    if key in args and args[key] not in allowed:
        raise CheckpointError(f"{path.name}: {where}: {key}={args[key]!r} is not implemented (only {allowed})")


def _estimator(tag: Any, cfg: ModelConfig) -> nn.Module:
    kinds = {"cosyvoice.flow.decoder.CausalConditionalDecoder": "unet", "cosyvoice.flow.DiT.dit.DiT": "dit"}
    kind = expect(tag, kinds, "flow/decoder/estimator", cfg.path)
    a = args_of(tag)
    if kind == "unet":
        _require(a, "act_fn", ("gelu",), "flow/decoder/estimator", cfg.path)
        return CausalConditionalDecoder(UNetSpec(
            in_channels=int(a["in_channels"]), out_channels=int(a["out_channels"]),
            channels=tuple(int(c) for c in a.get("channels", (256, 256))),
            attention_head_dim=int(a.get("attention_head_dim", 64)), n_blocks=int(a.get("n_blocks", 1)),
            num_mid_blocks=int(a.get("num_mid_blocks", 2)), num_heads=int(a.get("num_heads", 4))))
    if a.get("long_skip_connection"):
        raise CheckpointError(f"{cfg.path.name}: flow/decoder/estimator: long_skip_connection is not implemented")
    return DiT(DiTSpec(dim=int(a["dim"]), depth=int(a.get("depth", 8)), heads=int(a.get("heads", 8)),
                       dim_head=int(a.get("dim_head", 64)), ff_mult=int(a.get("ff_mult", 4)),
                       mel_dim=int(a.get("mel_dim", 80)), mu_dim=int(a.get("mu_dim") or a.get("mel_dim", 80)),
                       spk_dim=int(a.get("spk_dim") or 0)))


def build_flow(cfg: ModelConfig) -> CosyVoiceFlow:
    tag = cfg.get("flow")
    version = expect(tag, FLOW_CLASSES, "flow", cfg.path)
    a = args_of(tag)
    dec = a.get("decoder")
    expect(dec, {"cosyvoice.flow.flow_matching.CausalConditionalCFM": True}, "flow/decoder", cfg.path)
    d = args_of(dec)
    params = d.get("cfm_params")
    content: Mapping[str, Any] = {}
    if isinstance(params, Tag):
        expect(params, {"omegaconf.DictConfig": True}, "flow/decoder/cfm_params", cfg.path)
        content = args_of(params).get("content") or {}
    elif isinstance(params, Mapping):
        content = params
    _require(content, "solver", ("euler",), "flow/decoder/cfm_params", cfg.path)
    _require(content, "t_scheduler", ("cosine",), "flow/decoder/cfm_params", cfg.path)
    cfm = CausalCFM(_estimator(d.get("estimator"), cfg), float(content.get("inference_cfg_rate", 0.7)))
    common = dict(vocab_size=int(a.get("vocab_size", 4096)), input_size=int(a.get("input_size", 512)),
                  output_size=int(a.get("output_size", 80)), spk_embed_dim=int(a.get("spk_embed_dim", 192)),
                  token_mel_ratio=int(a.get("token_mel_ratio", 2)), decoder=cfm)
    if version == 2:
        enc = a.get("encoder")
        expect(enc, {"cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder": True}, "flow/encoder", cfg.path)
        e = args_of(enc)
        for key, allowed in (("input_layer", ("linear",)), ("pos_enc_layer_type", ("rel_pos_espnet",)),
                             ("selfattention_layer_type", ("rel_selfattn",)), ("normalize_before", (True,)),
                             ("use_cnn_module", (False,)), ("macaron_style", (False,)),
                             ("activation_type", ("swish",))):
            _require(e, key, allowed, "flow/encoder", cfg.path)
        spec = EncoderSpec(input_size=int(e["input_size"]), output_size=int(e.get("output_size", 256)),
                           attention_heads=int(e.get("attention_heads", 4)),
                           linear_units=int(e.get("linear_units", 2048)), num_blocks=int(e.get("num_blocks", 6)),
                           pre_lookahead_len=int(a.get("pre_lookahead_len", 3)))
        return CosyVoiceFlow(**common, encoder=UpsampleConformerEncoder(spec))  # type: ignore[arg-type]
    pre = a.get("pre_lookahead_layer")
    expect(pre, {"cosyvoice.transformer.upsample_encoder.PreLookaheadLayer": True}, "flow/pre_lookahead_layer",
           cfg.path)
    p = args_of(pre)
    layer = PreLookaheadLayer(int(p["in_channels"]), int(p["channels"]), int(p.get("pre_lookahead_len", 1)))
    return CosyVoiceFlow(**common, pre_lookahead_layer=layer)  # type: ignore[arg-type]


def hift_spec(cfg: ModelConfig) -> HiFTSpec:
    tag = cfg.get("hift")
    causal = expect(tag, HIFT_CLASSES, "hift", cfg.path)
    a = args_of(tag)
    f0 = a.get("f0_predictor")
    if expect(f0, F0_CLASSES, "hift/f0_predictor", cfg.path) != causal:
        raise CheckpointError(f"{cfg.path.name}: hift/f0_predictor: {f0.target} does not go with {tag.target}")
    f = args_of(f0)
    istft = a.get("istft_params") or {"n_fft": 16, "hop_len": 4}
    tup = lambda key, default: tuple(a.get(key, default))  # noqa: E731
    return HiFTSpec(
        causal=causal, in_channels=int(a.get("in_channels", 80)), base_channels=int(a.get("base_channels", 512)),
        nb_harmonics=int(a.get("nb_harmonics", 8)), sampling_rate=int(a.get("sampling_rate", 22050)),
        nsf_alpha=float(a.get("nsf_alpha", 0.1)), nsf_sigma=float(a.get("nsf_sigma", 0.003)),
        nsf_voiced_threshold=float(a.get("nsf_voiced_threshold", 10)),
        upsample_rates=tup("upsample_rates", (8, 8)), upsample_kernel_sizes=tup("upsample_kernel_sizes", (16, 16)),
        n_fft=int(istft["n_fft"]), hop_len=int(istft["hop_len"]),
        resblock_kernel_sizes=tup("resblock_kernel_sizes", (3, 7, 11)),
        resblock_dilation_sizes=tuple(tuple(d) for d in a.get("resblock_dilation_sizes", [[1, 3, 5]] * 3)),
        source_resblock_kernel_sizes=tup("source_resblock_kernel_sizes", (7, 11)),
        source_resblock_dilation_sizes=tuple(tuple(d) for d in a.get("source_resblock_dilation_sizes",
                                                                     [[1, 3, 5]] * 2)),
        lrelu_slope=float(a.get("lrelu_slope", 0.1)), audio_limit=float(a.get("audio_limit", 0.99)),
        conv_pre_look_right=int(a.get("conv_pre_look_right", 4)), f0_cond_channels=int(f.get("cond_channels", 512)))


@dataclasses.dataclass(frozen=True)
class MelSpec:
    """The yaml's ``feat_extractor`` (Matcha's mel_spectrogram): the prompt mel's settings."""

    n_fft: int
    num_mels: int
    sampling_rate: int
    hop_size: int
    win_size: int
    fmin: float
    fmax: float | None
    center: bool


def mel_spec(cfg: ModelConfig) -> MelSpec:
    tag = cfg.get("feat_extractor")
    expect(tag, MEL_FUNCTIONS, "feat_extractor", cfg.path)
    a = args_of(tag)
    fmax = a.get("fmax")
    return MelSpec(int(a["n_fft"]), int(a["num_mels"]), int(a["sampling_rate"]), int(a["hop_size"]),
                   int(a["win_size"]), float(a.get("fmin", 0)), None if fmax is None else float(fmax),
                   bool(a.get("center", False)))


# ---- weights ----------------------------------------------------------------------------------
def fill(module: nn.Module, state: Mapping[str, torch.Tensor], source: Path) -> nn.Module:
    """Put `state` into `module` (built on meta), every mismatch in one error naming `source`."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)}, model {tuple(own[k].shape)}"
              for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        parts = (([f"missing {', '.join(missing[:6])}" + (" ..." if len(missing) > 6 else "")] if missing else [])
                 + ([f"unexpected {', '.join(unexpected[:6])}" + (" ..." if len(unexpected) > 6 else "")]
                    if unexpected else [])
                 + shapes[:6])
        raise CheckpointError(f"{source} does not match {type(module).__name__}: " + "; ".join(parts))
    module.load_state_dict(dict(state), strict=True, assign=True)
    return module


def llm_state(folder: Path) -> dict[str, torch.Tensor]:
    state = load_state_dict(folder / "llm.pt")
    state.pop("llm.model.lm_head.weight", None)  # tied to embed_tokens; the speech LM never uses it
    if not any(k.startswith("llm.model.model.") for k in state):
        from safetensors.torch import load_file

        path = folder / BLANK_EN / "model.safetensors"
        if not path.is_file():
            raise CheckpointError(f"{folder / 'llm.pt'} has no Qwen2 weights and {path} does not exist")
        blank = load_file(str(path))
        state.update({"llm.model." + k: v.float() for k, v in blank.items() if k.startswith("model.")})
    return state


@dataclasses.dataclass
class CosyVoiceModel:
    version: int
    folder: Path
    config: ModelConfig
    lm: CosyVoiceLM
    flow: CosyVoiceFlow
    hift: HiFT
    mel: MelSpec
    sample_rate: int

    @property
    def blank_en(self) -> Path:
        return self.folder / BLANK_EN


def load_model(folder: str | Path, *, dtype: torch.dtype | None = None) -> CosyVoiceModel:
    """Every part of a CosyVoice folder, on the CPU, in float32 (or `dtype`)."""
    folder = Path(folder)
    version = detect_version(folder)
    blank_en = folder / BLANK_EN
    cfg = ModelConfig.read(folder / YAMLS[version], {"qwen_pretrain_path": str(blank_en)})
    built: dict[str, nn.Module] = {}
    makers: dict[str, tuple[Callable[[], nn.Module], Callable[[], dict[str, torch.Tensor]]]] = {
        "llm": (lambda: CosyVoiceLM(lm_spec(cfg, blank_en)), lambda: llm_state(folder)),
        "flow": (lambda: build_flow(cfg), lambda: load_state_dict(folder / "flow.pt")),
        "hift": (_hift_factory(cfg), lambda: fold_state_dict(load_state_dict(folder / "hift.pt",
                                                                               strip_prefixes=("generator.",)))),
    }
    for part in ("llm", "flow", "hift"):
        make, state = makers[part]
        module = build_on_meta(make)
        if reading_weights():  # a shapes-only build (engines.published) reads no weight
            fill(module, state(), folder / f"{part}.pt")
        if part == "hift" and isinstance(module, HiFT) and module.spec.causal:
            module.f0_predictor.to(torch.float64)
        if dtype is not None and dtype != torch.float32:
            module.to(dtype)
        built[part] = module.eval()
    lm = built["llm"]
    flow = built["flow"]
    hift = built["hift"]
    assert isinstance(lm, CosyVoiceLM) and isinstance(flow, CosyVoiceFlow) and isinstance(hift, HiFT)
    if version == 2 and lm.spec.version != 2 or version == 3 and lm.spec.version != 3:
        raise CheckpointError(f"{folder / YAMLS[version]}: its llm class is for CosyVoice {lm.spec.version}")
    return CosyVoiceModel(version, folder, cfg, lm, flow, hift, mel_spec(cfg), int(cfg.get("sample_rate")))


def _hift_factory(cfg: ModelConfig) -> Callable[[], HiFT]:
    """The HiFT constructor. CosyVoice 3's fixed source buffers are drawn here, before the
    module is built on meta: their draws replay real parameter inits, which meta would skip."""
    spec = hift_spec(cfg)
    fixed = None
    if spec.causal:
        flow = args_of(cfg.get("flow"))
        fixed = FixedSource(flow_vocab=int(flow.get("vocab_size", 4096)), flow_input=int(flow.get("input_size", 512)),
                            spk_dim=int(flow.get("spk_embed_dim", 192)), mel=spec.in_channels,
                            cond_channels=spec.f0_cond_channels)
    return lambda: HiFT(spec, fixed)
