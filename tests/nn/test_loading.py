"""M27: half precision without a float32 copy; clear errors for bad checkpoints."""
from __future__ import annotations

import json
import random
import struct
import tracemalloc
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mizuoto_runtime import CheckpointError, build_on_meta, load_safetensors

from support.models import TinyLM


def write(tmp_path: Path, model: torch.nn.Module, name: str = "model.safetensors", drop: str = "",
          extra: dict | None = None) -> Path:
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight" and k != drop}
    state.update(extra or {})
    path = tmp_path / name
    save_file(state, str(path))
    return path


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_meta_then_copy_equals_load_then_convert(tmp_path: Path, dtype: torch.dtype) -> None:
    source = TinyLM(layers=2)
    path = write(tmp_path, source)
    model = load_safetensors(build_on_meta(lambda: TinyLM(layers=2), dtype), path)
    expected = TinyLM(layers=2)
    expected.load_state_dict(source.state_dict())
    expected = expected.to(dtype)
    for (name, a), (_, b) in zip(model.state_dict().items(), expected.state_dict().items()):
        assert a.dtype == dtype and torch.equal(a, b), name
    assert model.head.weight is model.embed.weight  # tied weights stay tied


def test_bf16_file_into_bf16_model(tmp_path: Path) -> None:
    source = TinyLM(layers=2).to(torch.bfloat16)
    path = write(tmp_path, source)
    model = load_safetensors(build_on_meta(lambda: TinyLM(layers=2), torch.bfloat16), path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), source.state_dict().values()))


def test_missing_unexpected_and_mismatched_tensors_are_named(tmp_path: Path) -> None:
    source = TinyLM(layers=2)
    path = write(tmp_path, source, drop="layers.1.up.weight", extra={
        "layers.9.extra": torch.zeros(2), "norm.weight": torch.zeros(3)})
    with pytest.raises(CheckpointError) as err:
        load_safetensors(build_on_meta(lambda: TinyLM(layers=2)), path)
    text = str(err.value)
    assert "missing layers.1.up.weight (1024, 256)" in text
    assert "unexpected layers.9.extra" in text
    assert "shape of norm.weight: checkpoint (3,), model (256,)" in text
    assert str(path) in text


def test_missing_file_and_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        load_safetensors(build_on_meta(TinyLM), tmp_path / "nope.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(CheckpointError, match="not a valid safetensors file: header is not JSON"):
        load_safetensors(build_on_meta(TinyLM), bad)


def test_prefix_selects_a_component(tmp_path: Path) -> None:
    source = TinyLM(layers=1)
    state = {f"talker.{k}": v for k, v in source.state_dict().items() if k != "head.weight"}
    save_file(state, str(tmp_path / "all.safetensors"))
    model = load_safetensors(build_on_meta(lambda: TinyLM(layers=1)), tmp_path / "all.safetensors", prefix="talker.")
    assert torch.equal(model.layers[0].qkv.weight, source.layers[0].qkv.weight)


def test_demo_engine_loads_its_checkpoint_layout(tmp_path: Path) -> None:
    from mizuoto_runtime import Runtime
    from mizuoto_runtime.engines.demo.tiny import write

    write(tmp_path, seed=1234, dtype=torch.bfloat16)
    rt = Runtime()
    loaded = rt.engine("demo", tmp_path, "bfloat16")
    fresh = rt.engine("demo", None, "bfloat16")
    for a, b in zip(loaded.handles(), fresh.handles()):
        for (n, x), (_, y) in zip(a.module.state_dict().items(), b.module.state_dict().items()):
            assert x.dtype == torch.bfloat16 and torch.equal(x, y), n


def test_non_persistent_buffers_are_built_for_real(tmp_path: Path) -> None:
    class Rotary(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)
            self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)), persistent=False)

    source = Rotary()
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(tmp_path / "r.safetensors"))
    model = load_safetensors(build_on_meta(Rotary, torch.bfloat16), tmp_path / "r.safetensors")
    assert model.proj.weight.dtype == torch.bfloat16
    assert model.inv_freq.dtype == torch.float32 and torch.equal(model.inv_freq, source.inv_freq)


# ---- hostile and damaged files: one CheckpointError naming the file (M27) -------------------------

class Small(torch.nn.Module):
    """Three dtypes and a tied pair: the fuzz target is small, so thousands of cases run in seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 2)
        self.embed = torch.nn.Embedding(4, 2).to(torch.bfloat16)
        self.register_buffer("steps", torch.arange(3, dtype=torch.int64))


def small_file(tmp_path: Path) -> bytes:
    path = tmp_path / "small.safetensors"
    save_file({k: v.contiguous() for k, v in Small().state_dict().items()}, str(path))
    return path.read_bytes()


def raw_file(header: object, data: bytes = b"", length: int | None = None) -> bytes:
    """A file with an arbitrary JSON header (and header length, when given)."""
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def split(blob: bytes) -> tuple[dict, bytes]:
    (size,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + size]), blob[8 + size:]


def load_bytes(tmp_path: Path, blob: bytes, name: str = "case.safetensors") -> torch.nn.Module:
    path = tmp_path / name
    path.write_bytes(blob)
    return load_safetensors(build_on_meta(Small), path)


F32_2x3 = {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}


@pytest.mark.parametrize("case, blob, says", [
    ("random bytes", bytes(random.Random(1).getrandbits(8) for _ in range(300)), "header length"),
    ("header length 2^62", struct.pack("<Q", 2**62) + b"{}", "header length 4611686018427387904"),
    ("header length 2^64-1", struct.pack("<Q", 2**64 - 1) + b"{}", "header length 18446744073709551615"),
    ("empty", b"", "shorter than the 8-byte header length"),
    ("a JSON list header", raw_file([1, 2, 3]), "header is a list, not a JSON object"),
    ("not UTF-8", struct.pack("<Q", 4) + b"{\xff\xfe}", "header is not JSON"),
    ("deeply nested", struct.pack("<Q", 200_000) + b"[" * 200_000, "header is not JSON"),
    ("entry without dtype", raw_file({"proj.weight": {"shape": [2, 3], "data_offsets": [0, 24]}}, bytes(24)),
     "tensor 'proj.weight' has no dtype"),
    ("entry not an object", raw_file({"proj.weight": [0, 24]}, bytes(24)),
     "entry 'proj.weight' is a list, not a JSON object"),
    ("unknown dtype", raw_file({"proj.weight": {**F32_2x3, "dtype": "F4"}}, bytes(24)), "unsupported dtype 'F4'"),
    ("shape not integers", raw_file({"proj.weight": {**F32_2x3, "shape": [2, "3"]}}, bytes(24)), "shape [2, '3']"),
    ("negative dimension", raw_file({"proj.weight": {**F32_2x3, "shape": [-2, -3]}}, bytes(24)), "shape [-2, -3]"),
    ("offsets not matching the shape", raw_file({"proj.weight": {**F32_2x3, "data_offsets": [0, 20]}}, bytes(24)),
     "needs 24 bytes; its data_offsets [0, 20] span 20"),
    ("offsets reversed", raw_file({"proj.weight": {**F32_2x3, "data_offsets": [24, 0]}}, bytes(24)),
     "data_offsets [24, 0]"),
    ("offsets overlapping", raw_file({"a": F32_2x3, "b": F32_2x3}, bytes(48)), "overlap or leave a gap"),
    ("offsets past the end", raw_file({"proj.weight": {**F32_2x3, "shape": [2**40, 3],
                                                        "data_offsets": [0, 12 * 2**40]}}, bytes(24)),
     "cut short: its tensors need 13194139533312 bytes of data, the file has 24"),
])
def test_a_hostile_file_is_one_checkpoint_error_naming_it(tmp_path: Path, case: str, blob: bytes, says: str) -> None:
    with pytest.raises(CheckpointError) as err:
        load_bytes(tmp_path, blob)
    assert str(tmp_path / "case.safetensors") in str(err.value) and says in str(err.value), (case, str(err.value))


def test_a_file_cut_short_is_named(tmp_path: Path) -> None:
    blob = small_file(tmp_path)
    for cut in (4, 9, len(blob) // 2, len(blob) - 1):
        with pytest.raises(CheckpointError, match="cut short|shorter than|does not fit"):
            load_bytes(tmp_path, blob[:cut])
    header, _ = split(blob)
    with pytest.raises(CheckpointError, match=r"cut short: its tensors need \d+ bytes of data, the file has 0"):
        load_bytes(tmp_path, raw_file(header))


def test_no_allocation_is_sized_by_an_untrusted_header_length(tmp_path: Path) -> None:
    """A header length larger than the file is refused before anything of that size is read."""
    blob = struct.pack("<Q", 64 << 20) + b'{"a": 1}'
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="does not fit in the file's 16 bytes"):
            load_bytes(tmp_path, blob)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak / 2**20:.1f} MB allocated reading a 16-byte file"


MUTATIONS = ("flip bits", "overwrite bytes", "truncate", "insert bytes", "header length", "entry field",
             "entry type", "drop key")


def mutate(blob: bytes, rng: random.Random) -> bytes:
    """One seeded mutation of a valid file: raw-byte damage, or a well-formed JSON header whose
    entries lie (wrong dtype, shape, offsets; missing keys; entries that are not objects)."""
    kind = rng.choice(MUTATIONS)
    data = bytearray(blob)
    if kind == "flip bits":
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        return bytes(data)
    if kind == "overwrite bytes":
        i = rng.randrange(len(data))
        data[i:i + rng.randint(1, 16)] = rng.randbytes(rng.randint(1, 16))
        return bytes(data)
    if kind == "truncate":
        return blob[:rng.randrange(len(blob))]
    if kind == "insert bytes":
        i = rng.randrange(len(data))
        return bytes(data[:i] + rng.randbytes(rng.randint(1, 16)) + data[i:])
    header, rest = split(blob)
    if kind == "header length":
        (size,) = struct.unpack("<Q", blob[:8])
        length = rng.choice([rng.getrandbits(64), 2**62, 2**64 - 1, size + rng.randint(-8, 8), 0])
        return struct.pack("<Q", max(0, length)) + blob[8:]
    name = rng.choice([k for k in header if k != "__metadata__"])
    values: list[object] = [None, True, -1, 0, 2**64, 1.5, "F32", "X", [], [1], [0, 2**63], {}, [-1, 4],
                            [[1]], "BF16", "I64", "BOOL", [3, 2], [2, 3], [4, 2], [0, 0], [24, 48]]
    if kind == "entry field":
        header[name][rng.choice(["dtype", "shape", "data_offsets"])] = rng.choice(values)
    elif kind == "entry type":
        header[name] = rng.choice(values)
    else:
        header[name].pop(rng.choice(["dtype", "shape", "data_offsets"]))
    return raw_file(header, rest)


def test_fuzz_every_mutated_file_loads_or_is_a_checkpoint_error(tmp_path: Path) -> None:
    """M27 fuzz: 3,000 seeded mutations of a valid file; each ends in a model or a CheckpointError."""
    valid = small_file(tmp_path)
    rng = random.Random(20260)
    outcomes = {"loaded": 0, "CheckpointError": 0}
    for case in range(3000):
        blob = mutate(valid, rng)
        try:
            load_bytes(tmp_path, blob)
            outcomes["loaded"] += 1
        except CheckpointError as exc:
            assert "case.safetensors" in str(exc), str(exc)
            outcomes["CheckpointError"] += 1
        except Exception as exc:  # noqa: BLE001 — the test's point: any other type is a failure
            pytest.fail(f"case {case}: {type(exc).__name__}: {exc}\nfile: {blob!r}")
    assert outcomes["loaded"] > 100 and outcomes["CheckpointError"] > 1000, outcomes


# ---- tensors kept as the file's pages (issue 34) ----------------------------------------------------

def write_aligned(path: Path, state: dict[str, torch.Tensor], lead: int = 0) -> Path:
    """A safetensors file whose data starts 64-byte aligned (its header padded with spaces, as the
    format allows), after `lead` bytes of a uint8 tensor that shift everything behind it."""
    tensors = ({"lead": torch.zeros(lead, dtype=torch.uint8)} if lead else {}) | state
    header, offset = {}, 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": {torch.float32: "F32", torch.bfloat16: "BF16", torch.uint8: "U8"}[t.dtype],
                        "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-(8 + len(raw)) % 64)
    data = b"".join(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for t in tensors.values())
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def tiny_lm_state(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {k: v for k, v in TinyLM(layers=2).to(dtype).state_dict().items() if k != "head.weight"}


def test_an_aligned_tensor_in_the_models_dtype_is_kept_as_the_files_pages(tmp_path: Path) -> None:
    """No copy: the parameters lie in the file's mapping and equal what was saved. A write to one
    changes only this process's copy of the page, never the file."""
    from mizuoto_runtime.memory.mapped import file_backed

    state = tiny_lm_state(torch.bfloat16)
    path = write_aligned(tmp_path / "aligned.safetensors", state)
    before = path.read_bytes()
    model = load_safetensors(build_on_meta(lambda: TinyLM(layers=2), torch.bfloat16), path)
    for name, tensor in model.state_dict().items():
        assert file_backed(tensor), name
        assert torch.equal(tensor, state.get(name, state["embed.weight"])), name
    assert model.head.weight is model.embed.weight
    with torch.no_grad():
        model.layers[0].qkv.weight.add_(1)
    assert path.read_bytes() == before
    assert torch.equal(model.layers[0].qkv.weight, state["layers.0.qkv.weight"] + 1)


def test_converted_or_misaligned_tensors_are_copied(tmp_path: Path) -> None:
    """A tensor converted to the model's dtype, or one whose bytes a fresh allocation would align
    differently, is an ordinary copy of the same values."""
    from mizuoto_runtime.memory.mapped import file_backed

    state = tiny_lm_state(torch.bfloat16)
    converted = load_safetensors(build_on_meta(lambda: TinyLM(layers=2), torch.float32),
                                 write_aligned(tmp_path / "a.safetensors", state))
    shifted = load_safetensors(build_on_meta(lambda: TinyLM(layers=2), torch.bfloat16),
                               write_aligned(tmp_path / "b.safetensors", state, lead=8), strict=False)
    for name, tensor in converted.state_dict().items():
        assert not file_backed(tensor) and torch.equal(tensor, state.get(name, state["embed.weight"]).float()), name
    for name, tensor in shifted.state_dict().items():
        assert not file_backed(tensor) and torch.equal(tensor, state.get(name, state["embed.weight"])), name


def test_a_model_on_its_files_pages_streams_exactly(tmp_path: Path) -> None:
    """M57: every placement of a model whose weights are the file's pages equals the plain run."""
    from mizuoto_runtime.memory.mapped import file_backed

    from support.placement import check_three_sizes

    torch.manual_seed(0)
    state = {k: v for k, v in TinyLM(layers=4).state_dict().items() if k != "head.weight"}
    path = write_aligned(tmp_path / "aligned.safetensors", state)
    prompt = torch.tensor([[1, 2, 3]])

    def factory() -> torch.nn.Module:
        model = load_safetensors(build_on_meta(lambda: TinyLM(layers=4), torch.float32), path)
        assert all(file_backed(t) for t in model.state_dict().values())
        return model

    def call(model: torch.nn.Module) -> torch.Tensor:
        return model.generate(prompt, 4, torch.Generator().manual_seed(0))

    check_three_sizes(factory, call, "sequence")
