"""VramPolicy: every compute.* setting, defaults, validation naming the key (M9–M10, M21, M29)."""
from __future__ import annotations

import pytest

from mizuoto_runtime import SettingError, VramPolicy
from mizuoto_runtime.memory.policy import _SETTINGS, GB, MB

M10_KEYS = [
    "vram_mode", "vram_reserve_mb", "vram_limit_mb", "gpu_jobs", "async_offload", "max_pinned_mb",
    "host_copies", "ram_reserve_mb", "max_resident_models", "unload_after_minutes", "oom_retry",
    "oom_fallback", "kv_cache", "cuda_allocator", "simulate_vram_mb", "cpu_allocator",
    "weights",  # issue 36: how engines loaded without a choice store their weights
]


def test_every_m10_setting_has_a_default() -> None:
    values = VramPolicy().as_dict()
    assert sorted(k.removeprefix("compute.") for k in values) == sorted(M10_KEYS)
    p = VramPolicy()
    assert (p.vram_mode, p.gpu_jobs, p.async_offload, p.host_copies) == ("normal", 1, 1, "auto")
    assert p.oom_retry is True and p.oom_fallback is False and p.kv_cache == "dynamic"


@pytest.mark.parametrize("settings, key", [
    ({"compute.vram_mod": "low"}, "compute.vram_mod"),
    ({"compute.vram_mode": "tiny"}, "compute.vram_mode"),
    ({"compute.gpu_jobs": 0}, "compute.gpu_jobs"),
    ({"compute.gpu_jobs": 1.5}, "compute.gpu_jobs"),
    ({"compute.oom_retry": "maybe"}, "compute.oom_retry"),
    ({"compute.vram_reserve_mb": -1}, "compute.vram_reserve_mb"),
    ({"compute.async_offload": True}, "compute.async_offload"),
    ({"engines.demo.pinned_models": 3}, "engines.demo.pinned_models"),
    ({"other.thing": 1}, "other.thing"),
])
def test_bad_settings_raise_naming_the_key(settings: dict, key: str) -> None:
    with pytest.raises(SettingError, match=key.replace(".", r"\.")):
        VramPolicy(settings)


def test_text_values_from_cli_and_nested_dicts() -> None:
    p = VramPolicy({"compute": {"gpu_jobs": "2", "oom_fallback": "on", "simulate_vram_mb": "12.5"}})
    assert p.gpu_jobs == 2 and p.oom_fallback is True and p.simulate_vram_mb == 12.5


def test_update_validates_everything_before_changing_anything() -> None:
    p = VramPolicy()
    with pytest.raises(SettingError):
        p.update({"compute.vram_mode": "low", "compute.gpu_jobs": -3})
    assert p.vram_mode == "normal"
    p.update({"compute.vram_mode": "low"})
    assert p.vram_mode == "low"


def test_pinned_models_and_computed_defaults() -> None:
    p = VramPolicy({"engines.qwen3tts.pinned_models": "talker, decoder"})
    assert p.is_pinned("qwen3tts", "talker") and not p.is_pinned("qwen3tts", "encoder")
    assert p.reserve_bytes(simulated=True) == 0 and p.reserve_bytes(simulated=False) == 400 * MB
    assert p.ram_reserve_bytes() >= 2 * GB  # M29: max(2 GB, RAM / 10)
    assert p.pinned_budget_bytes() > 0  # M21: ComfyUI's formula
    assert VramPolicy({"compute.max_pinned_mb": 10}).pinned_budget_bytes() == 10 * MB
    assert VramPolicy({"compute.async_offload": 2}).copies_in_flight() == 3


def test_describe_lists_the_memory_policy() -> None:
    assert set(VramPolicy().describe()) == {
        "mode", "reserve_mb", "limit_mb", "ram_reserve_mb", "host_copies", "pinned_budget_mb",
        "copy_streams", "oom_retry", "oom_fallback",
    }


NUMERIC_KEYS = [k for k, spec in _SETTINGS.items()
                if set(spec.kind if isinstance(spec.kind, tuple) else (spec.kind,)) & {int, float}]


@pytest.mark.parametrize("key", NUMERIC_KEYS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), "nan", "inf", "Infinity"])
def test_non_finite_numbers_are_refused_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(SettingError, match=rf"'compute\.{key}'"):
        VramPolicy({f"compute.{key}": value})


def test_numeric_settings_are_all_checked() -> None:
    assert {"vram_reserve_mb", "vram_limit_mb", "gpu_jobs", "max_pinned_mb", "unload_after_minutes",
            "simulate_vram_mb"} <= set(NUMERIC_KEYS)


@pytest.mark.parametrize("value", ["auto", "hugepages", "no_hugepages"])
def test_cpu_allocator_is_accepted_now_that_training_applies_it(value: str) -> None:
    """M10, M62: compute.cpu_allocator acts on training processes (training/cpu_allocator.py)."""
    assert VramPolicy({"compute.cpu_allocator": value}).cpu_allocator == value
    with pytest.raises(SettingError, match=r"'compute\.cpu_allocator' must be one of auto, hugepages, no_hugepages"):
        VramPolicy({"compute.cpu_allocator": "big"})


def _reads() -> tuple[set[str], dict[str, set[str]]]:
    """Attribute names the pack's code reads outside policy.py, and per `VramPolicy` method the
    settings it reads (`self._values["key"]`)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = [*(root / "mizuoto_runtime").rglob("*.py"), *(root / "nodes").rglob("*.py"), root / "__init__.py"]
    read: set[str] = set()
    methods: dict[str, set[str]] = {}
    for path in files:
        tree = ast.parse(path.read_text())
        if path.name == "policy.py" and path.parent.name == "memory":
            cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "VramPolicy")
            for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                methods[fn.name] = {n.slice.value for n in ast.walk(fn) if isinstance(n, ast.Subscript)
                                    and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str)}
            continue
        read |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    return read, methods


def test_every_setting_is_read_by_the_runtime_or_refused() -> None:
    """Issue 9, item 5: no setting is accepted and then ignored. Each is read by the runtime's
    code (as `policy.<key>`, or through a `VramPolicy` method the runtime calls), or it is listed
    as not yet in effect, which refuses any value but its default."""
    from mizuoto_runtime.memory import policy

    read, methods = _reads()
    through = {key for name, keys in methods.items() if name in read for key in keys}
    ignored = [k for k in _SETTINGS if k not in read and k not in through and k not in policy._NOT_YET]
    assert ignored == [], f"settings nothing reads: {ignored}"


def test_a_setting_not_yet_in_effect_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from mizuoto_runtime.memory import policy

    monkeypatch.setitem(policy._NOT_YET, "kv_cache", "no engine reads it")
    assert VramPolicy({"compute.kv_cache": "dynamic"}).kv_cache == "dynamic"  # the default is fine
    with pytest.raises(SettingError, match=r"'compute\.kv_cache' has no effect yet \(no engine reads it\)"):
        VramPolicy({"compute.kv_cache": "static"})
