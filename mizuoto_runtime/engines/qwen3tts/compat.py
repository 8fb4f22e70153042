"""The official `qwen-tts` 0.1.1 package on transformers 5.x (issue 11 item 3, issue 14 item 1).

`qwen-tts` pins ``transformers==4.57.3``; current ComfyUI environments carry transformers 5.x,
and one environment must hold every engine (OmniVoice needs >= 5.3). The pin is stricter than
the code: the package's model code runs unchanged on 5.x once the few transformers APIs it
imports by their 4.57 names are given back to it. `install()` does that, before and right after
``import qwen_tts``, and only inside the package's own modules (nothing global changes):

* ``check_model_inputs()`` — a decorator *factory* in 4.57, a plain decorator in 5.x (which also
  split it into ``merge_with_config_defaults`` + ``capture_outputs``): the factory form again,
  made of the two 5.x parts, as 5.x's own models stack them.
* ``create_causal_mask`` / ``create_sliding_window_causal_mask`` — 5.x renamed ``input_embeds``
  to ``inputs_embeds`` and ``past_key_values`` to ``cache``, and derives the query offset from
  the cache instead of ``cache_position``: the package's 4.57 keywords, translated.
* ``ROPE_INIT_FUNCTIONS["default"]`` — 5.x dropped the plain RoPE entry (each model computes its
  own): the package's modules get a copy of the table with it (the 4.57 formula).
* Config token ids — 4.57's ``PretrainedConfig`` defaulted ``pad_token_id`` & co. to None; 5.x
  does not: the package's config classes get those defaults as class attributes.
* Rotary ``inv_freq`` — 5.x's ``from_pretrained`` leaves non-persistent buffers to
  ``_init_weights``, which the package overrides without them: computed as at construction
  (only the package's own ``from_pretrained`` needs it; our loader builds buffers for real).
* The 12 Hz tokenizer's Mimi encoder — 5.x split ``MimiModel`` into an encoder and a decoder
  half; the package subclasses it and assigns ``None`` to the 4.57 decoder attributes (now
  read-only properties). It is built as 5.x's encoder-only ``MimiModel`` (``decoder_config =
  None``), whose tensors sit under other names than in the published checkpoints: `codec_key`
  maps them for our loader, and the package's class is registered with transformers' own
  conversion mapping for ``MimiModel`` so its ``from_pretrained`` finds them too.

`tests/engines/test_qwen3tts_compat.py` checks each adaptation, and the Qwen3-TTS suite runs on 5.x; on
4.x `install()` does nothing.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any

import torch

# 5.x module names of the speech tokenizer's Mimi encoder -> the published (4.57) tensor names.
_CODEC_RENAMES: tuple[tuple[str, str], ...] = (
    ("encoder.encoder.encoder_seanet.", "encoder.encoder."),
    ("encoder.encoder.encoder_transformer.", "encoder.encoder_transformer."),
    ("encoder.encoder.downsample.", "encoder.downsample."),
)
_TOKEN_ID_DEFAULTS = ("bos_token_id", "pad_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id")
_installed = False


def transformers_major() -> int:
    import transformers

    return int(re.match(r"\d+", transformers.__version__).group())  # type: ignore[union-attr]


def needed() -> bool:
    return transformers_major() >= 5


def codec_key(module_name: str) -> str:
    """The published checkpoint's name of a speech-tokenizer tensor, from its module name here."""
    if needed():
        for ours, official in _CODEC_RENAMES:
            if module_name.startswith(ours):
                return official + module_name[len(ours):]
    return module_name


def codec_module_name(checkpoint_key: str) -> str:
    """The inverse of `codec_key`: where a published speech-tokenizer tensor goes here."""
    if needed():
        for ours, official in _CODEC_RENAMES:
            if checkpoint_key.startswith(official):
                return ours + checkpoint_key[len(official):]
    return checkpoint_key


def install(import_package: Callable[[], object] = lambda: importlib.import_module("qwen_tts")) -> None:
    """Adapt transformers 5.x to the package (idempotent; a no-op on 4.x). Imports `qwen_tts`
    with `import_package` (the engine's quiet import)."""
    global _installed
    if _installed or not needed():
        import_package()

        _installed = True
        return
    import transformers.utils.generic as generic

    original = generic.check_model_inputs
    generic.check_model_inputs = check_model_inputs  # read once, by the package's import below
    try:
        import_package()
    finally:
        generic.check_model_inputs = original
    from qwen_tts.core.models import configuration_qwen3_tts, modeling_qwen3_tts
    from qwen_tts.core.tokenizer_12hz import configuration_qwen3_tts_tokenizer_v2, modeling_qwen3_tts_tokenizer_v2
    from qwen_tts.core.tokenizer_25hz import configuration_qwen3_tts_tokenizer_v1

    for module in (configuration_qwen3_tts, configuration_qwen3_tts_tokenizer_v2, configuration_qwen3_tts_tokenizer_v1):
        _default_token_ids(module)
    for module in (modeling_qwen3_tts, modeling_qwen3_tts_tokenizer_v2):
        module.ROPE_INIT_FUNCTIONS = {"default": default_rope_parameters, **module.ROPE_INIT_FUNCTIONS}
        for name in ("create_causal_mask", "create_sliding_window_causal_mask"):
            if hasattr(module, name):
                setattr(module, name, mask_keywords_of_4_57(getattr(module, name)))
    modeling_qwen3_tts_tokenizer_v2.Qwen3TTSTokenizerV2Encoder.__init__ = _encoder_only_mimi
    _published_mimi_names("Qwen3TTSTokenizerV2Encoder")
    for cls in (modeling_qwen3_tts.Qwen3TTSTalkerCodePredictorModelForConditionalGeneration,
                modeling_qwen3_tts.Qwen3TTSTalkerForConditionalGeneration):
        cls.forward = cache_keyword_of_4_57(cls.forward)
        cls._update_model_kwargs_for_generation = cache_from_outputs(cls._update_model_kwargs_for_generation)
    for cls in (modeling_qwen3_tts.Qwen3TTSPreTrainedModel, modeling_qwen3_tts.Qwen3TTSTalkerTextPreTrainedModel,
                modeling_qwen3_tts_tokenizer_v2.Qwen3TTSTokenizerV2DecoderPreTrainedModel):
        cls._init_weights = rope_buffers_too(cls._init_weights)
    for output in (modeling_qwen3_tts.Qwen3TTSTalkerCodePredictorOutputWithPast,
                   modeling_qwen3_tts.Qwen3TTSTalkerOutputWithPast):
        output.__init__ = cache_field_of_4_57(output.__init__)
    _installed = True


def check_model_inputs(func: Callable[..., Any] | None = None, *,
                       tie_last_hidden_states: bool = True) -> Any:
    """4.57's decorator factory (``@check_model_inputs()``) made of 5.x's two decorators."""
    from transformers.utils.generic import merge_with_config_defaults
    from transformers.utils.output_capturing import capture_outputs

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        return merge_with_config_defaults(capture_outputs(f, tie_last_hidden_states=tie_last_hidden_states))

    return decorate if func is None else decorate(func)


def mask_keywords_of_4_57(create: Callable[..., Any]) -> Callable[..., Any]:
    """A 5.x mask function called with 4.57's keywords (``cache_position`` is implied by the cache)."""

    @functools.wraps(create)
    def call(*args: Any, **kwargs: Any) -> Any:
        if "input_embeds" in kwargs:
            kwargs["inputs_embeds"] = kwargs.pop("input_embeds")
        if "past_key_values" in kwargs:
            kwargs["cache"] = kwargs.pop("past_key_values")
        kwargs.pop("cache_position", None)
        return create(*args, **kwargs)

    return call


def cache_keyword_of_4_57(forward: Callable[..., Any]) -> Callable[..., Any]:
    """5.x's ``generate`` passes the cache as ``cache=``; the package's forwards take ``past_key_values``."""

    @functools.wraps(forward)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if "cache" in kwargs:
            kwargs["past_key_values"] = kwargs.pop("cache")
        return forward(self, *args, **kwargs)

    return call


def cache_from_outputs(update: Callable[..., Any]) -> Callable[..., Any]:
    """5.x's ``generate`` carries the cache on from ``outputs["cache"]``; the package's outputs
    name it ``past_key_values``."""

    @functools.wraps(update)
    def call(self: Any, outputs: Any, model_kwargs: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        model_kwargs = update(self, outputs, model_kwargs, *args, **kwargs)
        if getattr(outputs, "past_key_values", None) is not None:
            model_kwargs["cache"] = outputs.past_key_values
        return model_kwargs

    return call


def cache_field_of_4_57(init: Callable[..., Any]) -> Callable[..., Any]:
    """5.x's `ModelOutput` renames a ``past_key_values=`` argument to ``cache=`` before the
    dataclass sees it; the package's outputs still declare ``past_key_values``. `init` is that
    renaming wrapper; the dataclass's own ``__init__`` is under it (and this one gets wrapped the
    same way when it is set on the class)."""
    init = inspect.unwrap(init)

    @functools.wraps(init)
    def call(self: Any, *args: Any, cache: Any = None, **kwargs: Any) -> None:
        if cache is not None:
            kwargs["past_key_values"] = cache
        init(self, *args, **kwargs)

    return call


def rope_buffers_too(init_weights: Callable[..., Any]) -> Callable[..., Any]:
    """5.x's ``from_pretrained`` builds on meta and leaves non-persistent buffers to
    ``_init_weights``; the package's override skips its rotary embeddings, whose ``inv_freq``
    would stay uninitialized memory. Computed here as their constructor does."""

    @functools.wraps(init_weights)
    def call(self: Any, module: Any) -> None:
        init_weights(self, module)
        if hasattr(module, "rope_init_fn") and isinstance(getattr(module, "inv_freq", None), torch.Tensor):
            inv_freq, _ = module.rope_init_fn(module.config, module.inv_freq.device)
            with torch.no_grad():
                module.inv_freq.copy_(inv_freq)
                module.original_inv_freq = module.inv_freq

    return call


def default_rope_parameters(config: Any, device: torch.device | None = None, seq_len: int | None = None,
                            **_: Any) -> tuple[torch.Tensor, float]:
    """Plain RoPE inverse frequencies (4.57's ``"default"``: the same arithmetic, bit for bit)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (config.rope_theta ** exponents), 1.0


def _default_token_ids(module: Any) -> None:
    from transformers import PretrainedConfig

    for cls in vars(module).values():
        if inspect.isclass(cls) and issubclass(cls, PretrainedConfig) and cls.__module__ == module.__name__:
            for name in _TOKEN_ID_DEFAULTS:
                if not hasattr(cls, name):
                    setattr(cls, name, None)


def _published_mimi_names(class_name: str) -> None:
    """Let the package's own ``from_pretrained`` read the published encoder tensors too: 5.x maps
    Mimi's old names by class name, and skips classes outside transformers unless registered."""
    from transformers.conversion_mapping import (
        get_checkpoint_conversion_mapping,
        register_checkpoint_conversion_mapping,
    )

    if get_checkpoint_conversion_mapping(class_name) is None:
        register_checkpoint_conversion_mapping(class_name, get_checkpoint_conversion_mapping("MimiModel"))


def _encoder_only_mimi(self: Any, config: Any) -> None:
    """The 12 Hz tokenizer's encoder: 5.x's ``MimiModel`` without its decoder half (the package's
    own decoder decodes)."""
    from transformers import MimiModel

    config.decoder_config = None
    MimiModel.__init__(self, config)
