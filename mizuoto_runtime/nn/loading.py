"""Checkpoints: memory-mapped safetensors into a model built in its run precision (M27).

A model run in half precision never holds a float32 copy: it is built on the `meta` device
(no memory), converted to the run dtype there (free), then each tensor is read from the
memory-mapped file straight into its final buffer, converting one tensor at a time. The
file's pages are released after each tensor, so peak RSS stays near the model's size. The
result equals loading in float32 and converting (the same `Tensor.copy_` rounding).

A tensor stored in the model's dtype whose bytes are aligned as a fresh allocation's
(`memory.mapped.ALIGNMENT`) is not copied: the model keeps a view of the file's pages (a
private mapping; see `memory.mapped`), read when first used and reclaimable by the kernel, so a
model larger than free RAM loads and streams (issue 34).
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import math
import mmap
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, MizuotoError, json_kind
from ..memory.devices import device_anchors
from ..memory.mapped import ALIGNMENT, track
from ..memory.small_weights import FP8, can_store, choice_of, scale_for, store_layer

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
_PAGE = mmap.PAGESIZE
log = logging.getLogger(__name__)
# How fp8 checkpoints shared for ComfyUI scale a layer's weight: `<layer>.scale_weight` (ComfyUI's
# scaled fp8) or `<layer>.weight_scale`. `scale_input` (for fp8 matmuls of the input) and the
# `scaled_fp8` marker are not needed to compute in the model's dtype.
SCALE_SUFFIXES = (".scale_weight", ".weight_scale")
UNUSED_KEYS = (".scale_input", ".input_scale")
UNUSED_NAMES = ("scaled_fp8",)
# The safetensors library's own bound on the JSON header (100 MB).
MAX_HEADER_BYTES = 100_000_000
# dtype, shape, begin and end of a tensor's bytes in the data section
_Entry = tuple[torch.dtype, tuple[int, ...], int, int]


def _is_count(value: Any) -> bool:
    """A JSON integer >= 0 (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class SafetensorsFile:
    """A memory-mapped safetensors file: names, dtypes, shapes, and zero-copy views.

    The header is untrusted input: its length is checked against the file's size before
    anything is read or allocated, and every entry is checked (an object with a known `dtype`,
    a `shape` of non-negative integers, `data_offsets` that tile the data section in order and
    whose length matches the shape, as the safetensors format requires). Any fault is one
    `CheckpointError` naming the file and what is wrong.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"checkpoint file not found: {self.path}")
        try:
            self._file = open(self.path, "rb")
        except OSError as exc:
            raise CheckpointError(f"{self.path}: cannot be read ({exc})") from exc
        try:
            self.entries, self.data_start, data_bytes = self._read_header()
            length = self.data_start + data_bytes
            # Private and writable: a tensor kept as a view may be written in place (a private
            # copy of that page); the file never changes.
            self._map = mmap.mmap(self._file.fileno(), length, access=mmap.ACCESS_COPY) if length else None
            self._address = track(self._map) if self._map is not None else 0
        except OSError as exc:
            self._file.close()
            raise CheckpointError(f"{self.path}: cannot be read ({exc})") from exc
        except BaseException:
            self._file.close()
            raise

    def _fault(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: not a valid safetensors file: {what}")

    def _read_header(self) -> tuple[dict[str, _Entry], int, int]:
        """The entries, where the data section starts, and how many of its bytes they use."""
        file_size = os.fstat(self._file.fileno()).st_size
        head = self._file.read(8)
        if len(head) != 8:
            raise self._fault(f"{file_size} bytes, shorter than the 8-byte header length")
        (size,) = struct.unpack("<Q", head)
        # Checked before reading: an untrusted length never sizes an allocation.
        if size > min(file_size - 8, MAX_HEADER_BYTES):
            raise self._fault(f"header length {size} does not fit in the file's {file_size} bytes"
                              if size > file_size - 8 else f"header length {size} exceeds {MAX_HEADER_BYTES}")
        raw = self._file.read(size)
        if len(raw) != size:
            raise self._fault(f"cut short in the header ({len(raw)} of {size} bytes)")
        try:
            header = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # JSON, UTF-8, and int-size faults are all ValueError
            raise self._fault(f"header is not JSON ({exc})") from exc
        if not isinstance(header, dict):
            raise self._fault(f"header is {json_kind(header)}, not a JSON object")
        header.pop("__metadata__", None)  # free-form strings; nothing here reads them
        entries = {name: self._entry(name, info) for name, info in header.items()}
        return entries, 8 + size, self._check_offsets(entries, file_size - 8 - size)

    def _entry(self, name: str, info: Any) -> _Entry:
        if not isinstance(info, dict):
            raise self._fault(f"entry {name!r} is {json_kind(info)}, not a JSON object")
        missing = [k for k in ("dtype", "shape", "data_offsets") if k not in info]
        if missing:
            raise self._fault(f"tensor {name!r} has no {', '.join(missing)}")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _DTYPES:
            raise CheckpointError(f"{self.path}: tensor {name!r} has unsupported dtype {dtype!r}; "
                                  f"known: {', '.join(_DTYPES)}")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise self._fault(f"tensor {name!r} has shape {shape!r}, not a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
                and offsets[0] <= offsets[1]):
            raise self._fault(f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end] with begin <= end")
        torch_dtype = _DTYPES[dtype]
        nbytes = math.prod(shape) * torch_dtype.itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise self._fault(f"tensor {name!r} of shape {tuple(shape)} {dtype} needs {nbytes} bytes; "
                              f"its data_offsets {offsets} span {offsets[1] - offsets[0]}")
        return torch_dtype, tuple(shape), offsets[0], offsets[1]

    def _check_offsets(self, entries: dict[str, _Entry], data_bytes: int) -> int:
        """The tensors tile the data section in order, with no gap or overlap, and fit the file;
        returns the bytes they span."""
        end = 0
        for name, (_, _, start, stop) in sorted(entries.items(), key=lambda e: (e[1][2], e[1][3])):
            if start != end:
                raise self._fault(f"tensor {name!r} starts at byte {start} of the data, expected {end} "
                                  "(tensors overlap or leave a gap)")
            end = stop
        if end > data_bytes:
            raise self._fault(f"cut short: its tensors need {end} bytes of data, the file has {data_bytes}")
        return end

    def view(self, name: str) -> torch.Tensor:
        """A tensor viewing the mapped bytes (no copy). Writing to it changes this process's
        private copy of the page, never the file."""
        dtype, shape, start, end = self.entries[name]
        if end == start:
            return torch.empty(shape, dtype=dtype)
        assert self._map is not None
        buf = memoryview(self._map)[self.data_start + start:self.data_start + end]
        return torch.frombuffer(buf, dtype=dtype).reshape(shape)

    def aligned(self, name: str) -> bool:
        """Whether the tensor's bytes start where a fresh allocation's would (`ALIGNMENT`), so a
        view of them can be kept and computed on as a copy would be."""
        _, _, start, end = self.entries[name]
        return end > start and (self._address + self.data_start + start) % ALIGNMENT == 0

    def release(self, name: str) -> None:
        """Drop the mapped pages of one copied-out tensor from this process (keeps RSS near the
        model size). Only pages wholly inside it: a page it shares with a neighbour may hold
        that neighbour's kept (and perhaps written) bytes."""
        if self._map is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        _, _, start, end = self.entries[name]
        lo = -(-(self.data_start + start) // _PAGE) * _PAGE
        hi = (self.data_start + end) // _PAGE * _PAGE
        if hi > lo:
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a view is still alive; the mapping closes when it dies
        self._file.close()

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Create parameters on `meta` (no memory, no init cost) while buffers stay real.

    Buffers such as rotary `inv_freq` or conv strides are often non-persistent: not in the
    checkpoint, computed at construction, so they must be built for real. A parameter's
    initializer then runs on the meta tensor and costs nothing.
    """
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


_SHAPES_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("mizuoto_shapes_only", default=False)


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Build a model as its loader does, reading no weight (issue 35: a published model's
    placement from its shapes alone). Inside the block every parameter is created on `meta`
    (`parameters_on_meta`), `load_safetensors` and `nn.Module.load_state_dict` leave the meta
    tensors as they are, and `reading_weights()` is false, so a loader skips what only a real
    run needs (tokenizers, checks of weight values). Buffers stay real: they are built by the
    model's own code and counted like the real model's. Nothing built here can run."""
    token = _SHAPES_ONLY.set(True)
    load_state_dict = nn.Module.load_state_dict

    def keep_meta(module: nn.Module, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return torch.nn.modules.module._IncompatibleKeys([], [])

    nn.Module.load_state_dict = keep_meta  # type: ignore[method-assign,assignment]
    try:
        with parameters_on_meta():
            yield
    finally:
        nn.Module.load_state_dict = load_state_dict  # type: ignore[method-assign]
        _SHAPES_ONLY.reset(token)


def reading_weights() -> bool:
    """False inside `shapes_only`: the loader builds shapes and reads no weight."""
    return not _SHAPES_ONLY.get()


def build_on_meta(factory: Callable[[], nn.Module], dtype: torch.dtype | None = None) -> nn.Module:
    """Construct a model whose parameters take no memory, in their run precision (M27).

    Floating-point parameters are converted to `dtype` while still on meta (free); buffers keep
    the dtype the model's own code gave them.
    """
    with parameters_on_meta():
        model = factory()
    if dtype is not None:
        # By identity, so tied parameters stay tied; the originals are kept alive meanwhile so
        # their ids cannot be reused.
        converted: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}
        for module in model.modules(remove_duplicate=False):
            for name, param in module._parameters.items():
                if param is not None and param.is_floating_point():
                    if id(param) not in converted:
                        converted[id(param)] = (param, nn.Parameter(param.to(dtype), requires_grad=param.requires_grad))
                    module._parameters[name] = converted[id(param)][1]
    return model


def load_safetensors(model: nn.Module, paths: str | Path | Iterable[str | Path], *, prefix: str = "",
                     strict: bool = True, rename: Callable[[str], str] | None = None) -> nn.Module:
    """Fill `model` (built on `meta` or on the CPU) from memory-mapped safetensors files.

    Each parameter keeps the dtype the model has (the run precision); tensors are converted
    one at a time. Missing and unexpected keys and shape mismatches raise one
    `CheckpointError` naming every tensor at fault. `prefix` selects keys under it. Inside
    `shapes_only` nothing is read: the model keeps its meta tensors.
    """
    if not reading_weights():
        return model
    files = [SafetensorsFile(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    try:
        found: dict[str, tuple[SafetensorsFile, str]] = {}  # model name -> (file, key in file)
        for f in files:
            for key in f.entries:
                if key.startswith(prefix):
                    name = key[len(prefix):]
                    found[rename(name) if rename else name] = (f, key)
        scales = _scales(found)
        targets = _targets(model)
        _check(model, targets, found, files, strict)
        kept: dict[str, int] = {}
        anchors = device_anchors(model)
        for name, (owners, tensor) in targets.items():
            source = next((n for n in [name, *owners[1:]] if n in found), None)
            if source is None:
                continue
            f, key = found[source]
            scale = scales.get(source)
            stored = _stored_layer(model, owners, f.entries[key][0], anchors)
            if stored is not None:
                weight = f.view(key).clone()
                store_layer(stored, weight, None if scale is None else scale_for(stored, _read(scale), source))
                kept[choice_of(weight.dtype)] = kept.get(choice_of(weight.dtype), 0) + 1
            elif scale is None and f.entries[key][0] == tensor.dtype and f.aligned(key):
                _assign(model, owners, f.view(key), isinstance(tensor, nn.Parameter))  # the file's pages
                continue
            else:
                value = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
                value.copy_(f.view(key) if scale is None else _dequantized(f.view(key), _read(scale), source))
                _assign(model, owners, value, isinstance(tensor, nn.Parameter))
            f.release(key)
        for choice, count in kept.items():
            log.info("%s: %d layers stored as %s in the checkpoint, kept so", type(model).__name__, count, choice)
    finally:
        for f in files:
            f.close()
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise CheckpointError(f"tensors still on 'meta' after loading (not in the checkpoint): {', '.join(left)}")
    return model


def _scales(found: dict[str, tuple[SafetensorsFile, str]]) -> dict[str, tuple[SafetensorsFile, str]]:
    """Take the weight scales of an fp8 checkpoint out of `found` (they are no model tensors):
    the weight's name -> where its scale is. The keys no computation in the model's dtype needs
    are dropped too."""
    scales = {}
    for name in list(found):
        suffix = next((s for s in SCALE_SUFFIXES if name.endswith(s)), None)
        if suffix is not None:
            scales[name[:-len(suffix)] + ".weight"] = found.pop(name)
        elif name.endswith(UNUSED_KEYS) or name in UNUSED_NAMES:
            found.pop(name)
    for weight, (f, key) in scales.items():
        if weight not in found:
            raise CheckpointError(f"{f.path}: {key} scales {weight}, which the checkpoint does not hold")
    return scales


def _read(where: tuple[SafetensorsFile, str]) -> torch.Tensor:
    f, key = where
    return f.view(key).float()


def _dequantized(weight: torch.Tensor, scale: torch.Tensor, name: str) -> torch.Tensor:
    """A scaled checkpoint weight that the model keeps in its own dtype (its layer cannot store
    it small): the weight times its scale, one number or one per output channel (dimension 0)."""
    if scale.numel() == 1:
        return weight.float() * scale.reshape(())
    if weight.dim() and scale.numel() == weight.shape[0]:
        return weight.float() * scale.reshape(-1, *([1] * (weight.dim() - 1)))
    raise MizuotoError(f"{name}: its scale has shape {tuple(scale.shape)}; a weight of shape "
                       f"{tuple(weight.shape)} takes one number or {weight.shape[0] if weight.dim() else 1} "
                       "(one per output channel)")


def _stored_layer(model: nn.Module, owners: list[str], dtype: torch.dtype, anchors: set[int]) -> nn.Module | None:
    """The layer that keeps an fp8 checkpoint weight as it is stored: a Linear or Conv's own
    `weight`, read by no other module, and not one code finds the model's dtype from. None: the
    weight is converted to the model's dtype."""
    if dtype not in FP8.values() or len(owners) != 1 or not owners[0].endswith(".weight"):
        return None
    layer = model.get_submodule(owners[0].rpartition(".")[0])
    return layer if can_store(layer) and id(layer.weight) not in anchors else None


def _targets(model: nn.Module) -> dict[str, tuple[list[str], torch.Tensor]]:
    """Every state-dict tensor with all names it has (tied weights share one entry)."""
    by_id: dict[int, tuple[list[str], torch.Tensor]] = {}
    state = model.state_dict(keep_vars=True)
    for name, tensor in state.items():
        entry = by_id.setdefault(id(tensor), ([], tensor))
        entry[0].append(name)
    return {names[0]: (names, t) for names, t in by_id.values()}


def _check(model: nn.Module, targets: dict[str, tuple[list[str], torch.Tensor]],
           found: dict[str, tuple[SafetensorsFile, str]], files: list[SafetensorsFile], strict: bool) -> None:
    where = ", ".join(str(f.path) for f in files)
    aliases = {n for names, _ in targets.values() for n in names}
    problems: list[str] = []
    for name, (names, tensor) in targets.items():
        source = next((n for n in names if n in found), None)
        if source is None:
            if strict:
                problems.append(f"missing {name} {tuple(tensor.shape)}")
            continue
        f, key = found[source]
        shape = f.entries[key][1]
        if tuple(shape) != tuple(tensor.shape):
            problems.append(f"shape of {source}: checkpoint {tuple(shape)}, model {tuple(tensor.shape)}")
    if strict:
        problems += [f"unexpected {k}" for k in found if k not in aliases]
    if problems:
        raise CheckpointError(f"checkpoint {where} does not match {type(model).__name__}: " + "; ".join(problems))


def _assign(model: nn.Module, names: list[str], value: torch.Tensor, is_param: bool) -> None:
    tensor: torch.Tensor = nn.Parameter(value, requires_grad=False) if is_param else value
    for name in names:
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        if is_param:
            old = module._parameters[attr]
            if isinstance(tensor, nn.Parameter) and old is not None:
                tensor.requires_grad_(old.requires_grad)
            module._parameters[attr] = tensor  # type: ignore[assignment]
        else:
            module._buffers[attr] = tensor
