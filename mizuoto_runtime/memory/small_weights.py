"""Smaller stored weights: fp8 and int8 Linear and Conv weights, upcast on the device as used (issue 36).

A layer converted here keeps its weight in the small dtype everywhere it lives — host RAM,
pinned memory, a streamed copy, a resident device copy — so every byte count the runtime
keeps (a slot's `nbytes`, a unit's, a handle's size) is the stored size with no extra
bookkeeping. Its forward turns the weight into the input's dtype on the device it computes on,
as ComfyUI's manual cast does (`comfy/ops.py`: the weight cast, times `scale_weight`), and
computes in that dtype; nothing is upcast on the host.

- `fp8_e4m3fn`, `fp8_e5m2`: the weight divided by one per-tensor scale (its largest magnitude
  over the format's largest value) and cast to fp8, as fp8 checkpoints shared for ComfyUI are
  (`scale_weight` / `weight_scale`, which load as they are).
- `int8`: weight-only, symmetric, one scale per output channel. On a CPU a Linear layer
  computes with torch's int8 weight-pack matmul (`aten._weight_int8pack_mm`); elsewhere it is
  dequantized to the input's dtype first.

The scale is a parameter of the layer, so it streams with the weight it scales. Placement
never changes which path a layer computes with (that is decided by the compute device and the
input), so every placement gives the same bits with the same choice (M57).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable, Iterable
from typing import ClassVar, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from ..errors import ArgumentError, MizuotoError
from .devices import device_anchors

log = logging.getLogger(__name__)

PUBLISHED = "as published"
FP8 = {"fp8_e4m3fn": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
INT8 = "int8"
CHOICES: tuple[str, ...] = (PUBLISHED, *FP8, INT8)
STORED = {**FP8, INT8: torch.int8}  # choice -> the dtype its weights are stored in
_INT8_MAX = 127.0
_INT8_KERNEL_BLOCK = 16


def parse_choice(value: object, what: str = "weights") -> str:
    """`value` as one of `CHOICES`, else an `ArgumentError` naming `what`."""
    if value not in CHOICES:
        raise ArgumentError(f"{what} must be one of {', '.join(repr(c) for c in CHOICES)}, got {value!r}")
    return str(value)


def choice_of(dtype: torch.dtype) -> str:
    """The choice that stores weights in `dtype` (`PUBLISHED` for any other)."""
    return next((c for c, d in STORED.items() if d == dtype), PUBLISHED)


@functools.cache
def _fp8_works(device_type: str, dtype: torch.dtype) -> str | None:
    """None when a tensor of `dtype` can be made on `device_type` and cast to bfloat16 there;
    else what failed."""
    try:
        torch.zeros(2, dtype=dtype, device=device_type).to(torch.bfloat16)
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def check_fp8(dtype: torch.dtype, device: torch.device, what: str) -> None:
    """One clear error when `device` (with this torch) cannot hold `dtype` weights."""
    failed = _fp8_works(device.type, dtype)
    if failed is not None:
        raise MizuotoError(f"{what}: {choice_of(dtype)} weights cannot be used on {device} with torch "
                           f"{torch.__version__} ({failed}); choose weights 'as published' or 'int8'")


def e4m3_on_cpu(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`weight.to(dtype)` for float8_e4m3fn on a CPU, where torch's cast runs one element at a
    time (3x slower here). e4m3's sign, exponent and mantissa bits moved into float16's
    places give the same number times 2^-8, subnormals included; float16 holds every e4m3
    value, so the result is the cast's exactly (NaN, which no stored weight holds, aside)."""
    bits = weight.view(torch.uint8).to(torch.int16)
    half = (((bits & 0x80) << 8) | ((bits & 0x7F) << 7)).view(torch.float16)
    return (half * 256).to(dtype)


def _weight(layer: nn.Module) -> torch.Tensor:
    weight = layer._parameters["weight"]
    assert weight is not None
    return weight


def _scale(layer: nn.Module) -> torch.Tensor | None:
    return layer._parameters.get("weight_scale")


def _channel_dim(layer: nn.Module) -> int:
    """The weight's output-channel dimension (a transposed conv's is 1)."""
    return int(getattr(_STORED_CLASS.get(type(layer), type(layer)), "CHANNEL_DIM", 0))


class CastWeights(nn.Module):
    """Mixed into a Linear/Conv class: the weight is stored small (`weight_scale`: its scale,
    or None) and cast to the input's dtype on the input's device in the forward."""

    STORED_LAYER: ClassVar[bool] = True
    CHANNEL_DIM: ClassVar[int] = 0  # the weight's output-channel dimension (int8 scales)

    def cast_weight(self, x: torch.Tensor) -> torch.Tensor:
        """The weight in `x`'s dtype, scaled (the only full-precision copy, made on the device)."""
        stored = _weight(self)
        weight = e4m3_on_cpu(stored, x.dtype) if stored.dtype == torch.float8_e4m3fn and stored.is_cpu \
            else stored.to(x.dtype)
        scale = _scale(self)
        if scale is None:
            return weight
        shape = [1] * weight.dim()
        if scale.numel() > 1:
            shape[self.CHANNEL_DIM] = scale.numel()
        return weight * scale.to(x.dtype).reshape(shape)

    def cast_bias(self, x: torch.Tensor) -> torch.Tensor | None:
        bias = self._parameters.get("bias")
        return None if bias is None else bias.to(x.dtype)


class StoredLinear(CastWeights, nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = _scale(self)
        if self.weight.dtype == torch.int8 and scale is not None and _int8_kernel_applies(x, self):
            flat = x.reshape(-1, x.shape[-1]).contiguous()
            out = torch.ops.aten._weight_int8pack_mm(flat, self.weight, scale.to(x.dtype).reshape(-1))
            out = out.reshape(*x.shape[:-1], out.shape[-1])
            bias = self.cast_bias(x)
            return out if bias is None else out + bias
        return F.linear(x, self.cast_weight(x), self.cast_bias(x))


class StoredConv1d(CastWeights, nn.Conv1d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.cast_weight(x), self.cast_bias(x))


class StoredConv2d(CastWeights, nn.Conv2d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.cast_weight(x), self.cast_bias(x))


def _transposed(layer: StoredConvTranspose1d | StoredConvTranspose2d, x: torch.Tensor,
                output_size: list[int] | None) -> torch.Tensor:
    """A transposed conv's forward (torch's own), with the weight cast."""
    dims = 1 if isinstance(layer, StoredConvTranspose1d) else 2
    pad = cast(tuple[int, ...], layer.padding)  # a transposed conv's padding is never a string
    padding = layer._output_padding(x, output_size, list(layer.stride), list(pad), list(layer.kernel_size),
                                    dims, list(layer.dilation))
    conv = F.conv_transpose1d if dims == 1 else F.conv_transpose2d
    return conv(x, layer.cast_weight(x), layer.cast_bias(x), layer.stride, pad, padding, layer.groups, layer.dilation)


class StoredConvTranspose1d(CastWeights, nn.ConvTranspose1d):
    CHANNEL_DIM = 1

    def forward(self, x: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        return _transposed(self, x, output_size)


class StoredConvTranspose2d(CastWeights, nn.ConvTranspose2d):
    CHANNEL_DIM = 1

    def forward(self, x: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        return _transposed(self, x, output_size)


# Exact classes only: a subclass of nn.Linear may read its weight outside `forward`.
_STORED_CLASS: dict[type[nn.Module], type[nn.Module]] = {
    nn.Linear: StoredLinear, nn.Conv1d: StoredConv1d, nn.Conv2d: StoredConv2d,
    nn.ConvTranspose1d: StoredConvTranspose1d, nn.ConvTranspose2d: StoredConvTranspose2d,
}


def _int8_kernel_applies(x: torch.Tensor, layer: nn.Linear) -> bool:
    """torch's int8 weight-pack matmul: CPU, a float input, a contiguous [out, in] weight whose
    `in` is a multiple of 16 (the kernel reads it in blocks of 16; torch 2.14's crashes on any
    other, e.g. F5-TTS's 200-wide input projection)."""
    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and layer.weight.is_contiguous() and x.shape[-1] == layer.weight.shape[1]
            and layer.weight.shape[1] % _INT8_KERNEL_BLOCK == 0)


def can_store(layer: nn.Module) -> bool:
    """Whether `layer` can store its weight small: a plain Linear or Conv (not weight-normed),
    or a layer stored small already."""
    return ((type(layer) in _STORED_CLASS or getattr(type(layer), "STORED_LAYER", False))
            and not parametrize.is_parametrized(layer))


def is_stored_small(module: nn.Module) -> bool:
    return bool(getattr(type(module), "STORED_LAYER", False)) and _weight(module).dtype in STORED.values()


def stored_choice(module: nn.Module) -> str:
    """What `module`'s Linear and Conv weights are stored as: the choice, `PUBLISHED` when none
    is stored small, or the choices joined when a checkpoint mixes them."""
    found = sorted({choice_of(_weight(m).dtype) for m in module.modules() if is_stored_small(m)})
    return " + ".join(found) if found else PUBLISHED


def largest_cast_bytes(module: nn.Module) -> int:
    """The largest weight a stored-small layer of `module` casts in its forward, at the
    precision it computes in (its bias' or scale's dtype): the working memory the cast adds."""
    sizes = [_weight(m).numel() * compute_dtype(m).itemsize for m in module.modules() if is_stored_small(m)]
    return max(sizes, default=0)


def compute_dtype(layer: nn.Module) -> torch.dtype:
    """The dtype a stored-small layer computes in, as far as it says: its scale's or its bias'
    (float32 when it has neither)."""
    for t in (_scale(layer), layer._parameters.get("bias")):
        if t is not None and t.is_floating_point():
            return t.dtype
    return torch.float32


def _quantize(weight: torch.Tensor, choice: str, channel_dim: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`weight` stored as `choice`, and its scale (in the weight's own dtype; None: unscaled)."""
    w = weight.detach().float()
    if choice == INT8:
        dims = [d for d in range(w.dim()) if d != channel_dim]
        amax = w.abs().amax(dim=dims) if dims else w.abs()
        scale = (amax / _INT8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
        shape = [1] * w.dim()
        shape[channel_dim] = -1
        q = torch.round(w / scale.reshape(shape)).clamp(-_INT8_MAX, _INT8_MAX).to(torch.int8)
        return q.contiguous(), scale.to(weight.dtype)
    dtype = FP8[choice]
    largest = float(w.abs().max()) if w.numel() else 0.0
    if largest == 0.0:
        return w.to(dtype), None
    # Scaled to the format's largest value, as ComfyUI's scaled fp8 is: small weights (a layer
    # initialised at 0.02) would otherwise fall into fp8's few subnormals, or to zero.
    scale = torch.tensor(largest / torch.finfo(dtype).max)
    return (w / scale).to(dtype), scale.to(weight.dtype)


def _dequantized(layer: nn.Module) -> torch.Tensor:
    """A stored-small layer's weight back in its compute dtype (for a conversion to another choice)."""
    assert isinstance(layer, CastWeights)
    return layer.cast_weight(torch.empty(0, dtype=compute_dtype(layer), device=_weight(layer).device))


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def store_layer(layer: nn.Module, weight: torch.Tensor, scale: torch.Tensor | None) -> None:
    """Make `layer` (a Linear/Conv, or one stored small already) hold `weight` as stored, scaled by `scale`."""
    cls = _STORED_CLASS.get(type(layer), type(layer))
    if not getattr(cls, "STORED_LAYER", False):
        raise MizuotoError(f"a {type(layer).__name__} layer cannot store smaller weights (only Linear and Conv)")
    layer.__class__ = cls
    layer._parameters["weight"] = _param(weight)
    layer._parameters["weight_scale"] = None if scale is None else _param(scale)


def _castable(root: nn.Module, keep: Iterable[str]) -> list[tuple[str, nn.Module]]:
    """The Linear and Conv layers of `root` whose weight may be stored small: not named in
    `keep` (a name, or the start of one), not weight-normed, holding a weight no other module
    reads (a head tied to an embedding stays as the embedding is), and not a weight code finds
    the model's dtype from (`device_anchors`: else it would compute in fp8)."""
    kept = tuple(keep)
    anchors = device_anchors(root)
    owners: dict[int, int] = {}
    for module in root.modules():
        for t in module._parameters.values():
            if t is not None:
                owners[id(t)] = owners.get(id(t), 0) + 1
    found = []
    for name, module in root.named_modules():
        if not can_store(module) or any(name == k or name.startswith(k + ".") for k in kept):
            continue
        weight = module._parameters.get("weight")
        if weight is None or not weight.is_floating_point() and weight.dtype != torch.int8:
            continue
        if owners.get(id(weight), 0) > 1 or "weight_g" in module._parameters or id(weight) in anchors:
            continue
        found.append((name, module))
    return found


def store_small(root: nn.Module, choice: str, *, keep: Iterable[str] = (), what: str = "") -> int:
    """Store the Linear and Conv weights of `root` (a component, on its host) as `choice`, one
    layer at a time, so host memory holds the model once plus one layer. Layers stored as
    another small choice (a pre-quantized checkpoint) are converted once, and the log says so.
    Returns how many layers changed."""
    choice = parse_choice(choice)
    if choice == PUBLISHED:
        return 0
    if choice in FP8:
        check_fp8(FP8[choice], torch.device("cpu"), what or type(root).__name__)
    name = what or type(root).__name__
    converted: dict[str, int] = {}  # from another small choice: layers
    before = after = changed = 0
    for _, layer in _castable(root, keep):
        stored = choice_of(_weight(layer).dtype) if is_stored_small(layer) else None
        if stored == choice:
            continue
        if stored is not None:
            converted[stored] = converted.get(stored, 0) + 1
            source = _dequantized(layer)
        else:
            source = _weight(layer).detach()
        before += _layer_bytes(layer)
        weight, scale = _quantize(source, choice, _channel_dim(layer))
        store_layer(layer, weight, scale)
        after += _layer_bytes(layer)
        changed += 1
    for stored, count in converted.items():
        log.info("%s: %d layers stored as %s converted once to %s", name, count, stored, choice)
    if changed:
        return_freed_ram()
        log.info("%s: %d Linear and Conv weights stored as %s: %.1f MB -> %.1f MB", name, changed, choice,
                 before / 2**20, after / 2**20)
    return changed


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    path = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] = ctypes.CDLL(path).malloc_trim if path else None  # type: ignore[assignment]
    except (OSError, AttributeError):
        return None  # not glibc: its allocator gives freed pages back by itself, or never
    return trim


def return_freed_ram() -> None:
    """Give the host pages the full-precision weights held back to the system: glibc keeps freed
    heap memory in the process, so without this the RSS would not fall with the stored size."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _layer_bytes(layer: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (_weight(layer), _scale(layer)) if t is not None)


def scale_for(layer: nn.Module, scale: torch.Tensor, weight_name: str) -> torch.Tensor:
    """A checkpoint's `scale_weight` / `weight_scale` for `layer`, checked: one number, or one per
    output channel. Anything else is one error naming the tensor."""
    weight = _weight(layer)
    channel = _channel_dim(layer)
    channels = weight.shape[channel] if weight.dim() else 1
    if scale.numel() == 1 or (scale.numel() == channels and scale.squeeze().dim() <= 1):
        # in the dtype the layer computes in, as `_quantize`'s scales are
        dtype = compute_dtype(layer) if is_stored_small(layer) else weight.dtype
        return (scale.reshape(-1) if scale.numel() > 1 else scale.reshape(())).to(dtype)
    raise MizuotoError(f"{weight_name}: its scale has shape {tuple(scale.shape)}; a weight of shape "
                       f"{tuple(weight.shape)} takes one number or {channels} (one per output channel)")


def parse_weights(text: str) -> str | dict[str, str]:
    """A `weights` choice as a host writes it: one choice for every phase ("fp8_e4m3fn"), or
    phase=choice pairs separated by commas ("generate=fp8_e4m3fn,decode=int8")."""
    text = text.strip()
    if "=" not in text:
        return parse_choice(text)
    pairs = {}
    for part in text.split(","):
        phase, sep, choice = part.partition("=")
        if not sep or not phase.strip():
            raise ArgumentError(f"weights {text!r}: {part.strip()!r} is not phase=choice")
        pairs[phase.strip()] = parse_choice(choice.strip(), f"weights for {phase.strip()!r}")
    return pairs
