"""An ONNX graph converted to a torch module once per file, kept as safetensors (issue 35, item 4).

Converting a published-size graph with ``onnx2torch`` takes seconds and several times the
file's size in memory, most of it shape inference over the whole serialized model and copies
of its initializers. What the conversion builds depends on the graph and on the initializers'
shapes, not on the weights' values. So the first conversion keeps, in one safetensors file named
by the ONNX file's SHA-256 (and the converter's version):

- the finished module's ``state_dict`` (after the caller's `Build` step, as the engine uses it);
- the graph with every large initializer's data left out (its name, type and shape kept, its
  data marked external), in the file's metadata: the *skeleton*.

A later load hashes the ONNX file (a changed file is another entry), converts the skeleton (each
left-out initializer a lazily zeroed array: no memory touched), runs the same `Build`, and
assigns the kept tensors, keys and shapes checked strictly. The module is the same module with
the same weights, so its outputs are equal. An entry that cannot be read, or that does not fit
the converted skeleton, is dropped with one log line and the graph is converted again.

Entries are bounded by count (`KEEP`, least recently used dropped): each holds a whole model.
Checkpoints are read only as safetensors; nothing in an entry is executed or unpickled.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn

from ..errors import CheckpointError
from .checkpoint import save_whole

log = logging.getLogger(__name__)

FORMAT = "mizuoto-onnx-module/1"
KEEP = 2  # entries kept per cache folder (each a whole model's weights)
SKELETON_BYTES = 4096  # initializers larger than this are left out of the skeleton (weights, not shapes)
_CHUNK = 1 << 22

Build = Callable[[Any], nn.Module]  # the converted fx.GraphModule -> the module the engine keeps


def file_digest(path: Path) -> str:
    """SHA-256 of `path`'s bytes (about 0.3 s per 500 MB here)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _converter_version() -> str:
    return f"onnx2torch-{version('onnx2torch')}-onnx-{version('onnx')}"


def load_converted(path: Path, build: Build, cache: Path | None) -> nn.Module:
    """`path`'s graph converted and passed through `build`, from `cache` when an entry for this
    file's bytes is there (else converted and kept there); `cache` None: converted, not kept."""
    if cache is None:
        return _convert(path, build)[0]
    digest = file_digest(path)
    entry = cache / f"{digest[:32]}.safetensors"
    if entry.is_file():
        module = _from_entry(entry, digest, build)
        if module is not None:
            _touch(entry)
            return module
    module, skeleton = _convert(path, build)
    try:
        _write(entry, module, skeleton, digest)
    except OSError as exc:  # a read-only or full disk: the module is still good
        log.warning("Mizuoto: could not keep the converted %s in %s (%s)", path.name, cache, exc)
    return module


def _convert(path: Path, build: Build) -> tuple[nn.Module, bytes]:
    """Convert `path` (`build` applied) and make its skeleton."""
    import onnx
    from google.protobuf.message import DecodeError
    from onnx2torch import convert

    try:
        model = onnx.load(str(path))
        module = build(convert(model))
    except (OSError, ValueError, NotImplementedError, DecodeError,
            onnx.onnx_cpp2py_export.checker.ValidationError) as exc:
        raise CheckpointError(f"{path}: cannot be converted to a torch module ({exc})") from exc
    return module, _skeleton(model)


def _skeleton(model: Any) -> bytes:
    """`model` serialized with each initializer over `SKELETON_BYTES` emptied and marked external
    (`model` is changed: the caller no longer needs it)."""
    from onnx import TensorProto

    for tensor in model.graph.initializer:
        if tensor.ByteSize() > SKELETON_BYTES:
            for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                tensor.ClearField(field)
            tensor.data_location = TensorProto.EXTERNAL
            del tensor.external_data[:]
            tensor.external_data.add(key="location", value="left-out")
    return bytes(model.SerializeToString())


@contextlib.contextmanager
def _lazy_external_tensors() -> Iterator[None]:
    """While converting a skeleton, each left-out initializer becomes zeros of its shape and type
    without reading anything (calloc'd pages, untouched until the kept tensors replace them).
    onnx2torch reads every initializer through ``OnnxTensor.to_numpy``; the original is restored
    on exit. Engines load one at a time (`Runtime.engine` holds its loading lock)."""
    import numpy as np
    from onnx import TensorProto, helper
    from onnx2torch.onnx_tensor import OnnxTensor

    original = OnnxTensor.to_numpy

    def to_numpy(self: Any) -> Any:
        proto = self.proto
        if proto.data_location == TensorProto.EXTERNAL:
            return np.zeros(tuple(proto.dims), dtype=helper.tensor_dtype_to_np_dtype(proto.data_type))
        return original(self)

    OnnxTensor.to_numpy = to_numpy  # type: ignore[method-assign]
    try:
        yield
    finally:
        OnnxTensor.to_numpy = original  # type: ignore[method-assign]


def _from_entry(entry: Path, digest: str, build: Build) -> nn.Module | None:
    """The module kept in `entry`, or None (the entry dropped) when it cannot be used."""
    import onnx
    from google.protobuf.message import DecodeError
    from onnx2torch import convert

    try:
        with safe_open(str(entry), "pt") as f:
            meta = f.metadata() or {}
        if meta.get("format") != FORMAT or meta.get("onnx_sha256") != digest:
            raise ValueError("written for another file or format")
        if meta.get("converter") != _converter_version():
            raise ValueError(f"written by {meta.get('converter')}, this is {_converter_version()}")
        skeleton = onnx.load_model_from_string(base64.b64decode(meta["skeleton"]))
        with _lazy_external_tensors():
            module = build(convert(skeleton))
        module.load_state_dict(load_file(entry), strict=True, assign=True)
    except (SafetensorError, OSError, ValueError, KeyError, RuntimeError, DecodeError) as exc:
        log.warning("Mizuoto: dropped the kept conversion %s (%s); converting the ONNX file again", entry, exc)
        entry.unlink(missing_ok=True)
        return None
    return module


def _write(entry: Path, module: nn.Module, skeleton: bytes, digest: str) -> None:
    """Keep `module`'s tensors and the skeleton in `entry` (written whole or not at all), then
    drop the least recently used entries past `KEEP`."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    # safetensors needs contiguous tensors (a contiguous one is itself, not a copy)
    tensors = {name: t.detach().contiguous() for name, t in module.state_dict().items()}
    meta = {"format": FORMAT, "onnx_sha256": digest, "converter": _converter_version(),
            "skeleton": base64.b64encode(skeleton).decode("ascii")}
    save_whole(entry, tensors, meta)
    _touch(entry)
    entries = sorted(entry.parent.glob("*.safetensors"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in entries[KEEP:]:
        old.unlink(missing_ok=True)
        log.debug("Mizuoto: dropped the least recently used kept conversion %s", old.name)


def _touch(entry: Path) -> None:
    now = time.time_ns()
    os.utime(entry, ns=(now, now))
