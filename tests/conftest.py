"""Shared fixtures: the simulated strict device of M55–M56."""
from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

sys.path.insert(0, str(Path(__file__).resolve().parent))
_PATH_AT_START = list(sys.path)
REPO = Path(__file__).resolve().parents[1]

from mizuoto_runtime import DeviceService, ModelManager, VramPolicy  # noqa: E402
from mizuoto_runtime.memory.intra_op import intra_op_threads  # noqa: E402

MB = 1 << 20


@pytest.fixture(scope="session", autouse=True)
def _checkout_parent_off_sys_path() -> None:
    """The repository root is a package (the pack's `__init__.py`), so before the first test
    pytest imports it with the folder *above* the checkout put first on `sys.path`. There every
    sibling folder is importable by its name and shadows a real package of that name: a
    `voxcpm/` checkout beside this one hid the `voxcpm` package from the tests that import it
    first. This runs after that import (collectors are set up before any fixture, autouse
    session fixtures before all others) and takes the entry out again."""
    parent = str(REPO.parent)
    if parent not in _PATH_AT_START:
        while parent in sys.path:
            sys.path.remove(parent)


@pytest.fixture
def strict_device() -> DeviceService:
    """A 64 MB simulated GPU in strict mode (M55, M56)."""
    return DeviceService(simulate={"cpu": 64 * MB}, strict=True)


def make_manager(mb: int = 64, **settings: object) -> ModelManager:
    devices = DeviceService(simulate={"cpu": mb * MB}, strict=True)
    return ModelManager(devices, VramPolicy({f"compute.{k}": v for k, v in settings.items()}))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def link_checkpoint(folder: Path, dest: Path, skip: tuple[str, ...] = ()) -> Path:
    """Link every file of checkpoint `folder` into `dest`, except `skip` (relative paths): a
    copy to break one file of."""
    for path in folder.rglob("*"):
        rel = path.relative_to(folder)
        if path.is_file() and str(rel) not in skip:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).symlink_to(path)
    return dest


def missing_requirement(engine: str) -> str | None:
    """The first package of requirements/<engine>.txt (environment markers evaluated) that is not
    installed here, or None (also for an engine without a requirements file, the demo). That file
    is the one list of what an engine's code and its tiny writer import beyond the ComfyUI
    environment (tools/install.sh installs it whole); what is checked is presence, not version."""
    listed = REPO / "requirements" / f"{engine}.txt"
    if not listed.is_file():
        return None
    for line in listed.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            return requirement.name
    return None


def require_engine(engine: str) -> None:
    """Skip the test (or, called at import, its module) unless every package `engine` needs is
    installed; the reason names the first one missing. An engine's tests skip, never fail, in an
    environment with only some engines installed."""
    missing = missing_requirement(engine)
    if missing is not None:
        pytest.skip(f"{missing} is not installed (requirements/{engine}.txt)", allow_module_level=True)


def require_qwen_tts() -> None:
    """Skip where the `qwen3tts` extra is not installed; else import it the engine's way (adapted
    to the transformers installed: a bare `import qwen_tts` fails on transformers 5.x)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read when huggingface_hub is imported
    require_engine("qwen3tts")
    from mizuoto_runtime.engines.qwen3tts.checkpoint import import_upstream

    import_upstream()


@pytest.fixture(scope="session")
def qwen3tts_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Tiny Qwen3-TTS checkpoints in the official layout, each written once per session on first
    use (`model_type`: base, custom_voice, voice_design). Skips where `qwen_tts` is not installed."""
    require_qwen_tts()
    from mizuoto_runtime.engines.qwen3tts.tiny import write

    root = tmp_path_factory.mktemp("qwen3tts")
    written: dict[str, Path] = {}

    def checkpoint(model_type: str = "base") -> Path:
        if model_type not in written:
            written[model_type] = write(root / model_type, version=model_type)
        return written[model_type]

    return checkpoint


def _tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory, engine: str,
                      writer_module: str) -> Callable[[str], Path]:
    """Tiny checkpoints of `engine` in its published layout, each dtype written once per session
    on first use; skips where a package the engine needs is not installed."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    require_engine(engine)
    writer = importlib.import_module(writer_module).write
    root = tmp_path_factory.mktemp(engine)
    written: dict[str, Path] = {}

    def checkpoint(dtype: str = "float32") -> Path:
        if dtype not in written:
            written[dtype] = writer(root / dtype, dtype=getattr(torch, dtype))
        return written[dtype]

    return checkpoint


@pytest.fixture(scope="session")
def f5tts_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Tiny F5-TTS folders (`dtype` of the DiT weights: float32, bfloat16, float16)."""
    return _tiny_checkpoints(tmp_path_factory, "f5tts", "mizuoto_runtime.engines.f5tts.tiny")


@pytest.fixture(scope="session")
def chatterbox_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Tiny Chatterbox folders (`dtype` of T3's weights)."""
    return _tiny_checkpoints(tmp_path_factory, "chatterbox", "mizuoto_runtime.engines.chatterbox.tiny")


@pytest.fixture(scope="session")
def omnivoice_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Tiny OmniVoice folders (`dtype` of the LLM weights)."""
    return _tiny_checkpoints(tmp_path_factory, "omnivoice", "mizuoto_runtime.engines.omnivoice.tiny")


@pytest.fixture(scope="session")
def higgsaudio_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Tiny Higgs Audio v2 folders (`dtype` of the LLM's shards)."""
    return _tiny_checkpoints(tmp_path_factory, "higgsaudio", "mizuoto_runtime.engines.higgsaudio.tiny")


@pytest.fixture(scope="session")
def dia_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Tiny Dia folders with their DAC codec folder inside (`dtype` of the Dia weights)."""
    return _tiny_checkpoints(tmp_path_factory, "dia", "mizuoto_runtime.engines.dia.tiny")


@pytest.fixture(scope="session")
def csm_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Tiny CSM folders, Mimi inside (`dtype` of the backbone and depth decoder weights)."""
    return _tiny_checkpoints(tmp_path_factory, "csm", "mizuoto_runtime.engines.csm.tiny")


@pytest.fixture(scope="session")
def voxcpm2_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Tiny VoxCPM 2 folders (`dtype` of the main weights: float32 or bfloat16)."""
    return _tiny_checkpoints(tmp_path_factory, "voxcpm2", "mizuoto_runtime.engines.voxcpm2.tiny")


@pytest.fixture(scope="session")
def vibevoice_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Tiny VibeVoice ``-hf`` folders (`dtype` of the weights; `version`: 1.5b (tied head) or 7b),
    each written once per session on first use."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    require_engine("vibevoice")
    from mizuoto_runtime.engines.vibevoice.tiny import write

    root = tmp_path_factory.mktemp("vibevoice")
    written: dict[tuple[str, str], Path] = {}

    def checkpoint(dtype: str = "float32", version: str = "1.5b") -> Path:
        if (dtype, version) not in written:
            written[dtype, version] = write(root / f"{version}-{dtype}", version=version, dtype=getattr(torch, dtype))
        return written[dtype, version]

    return checkpoint


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for the test. On a shared 2-core machine, torch's pool waiting for
    busy cores made the Qwen3-TTS tests 20x slower. Results can depend on the count (Intel MKL
    splits a long sum across its threads on its Intel code path), so a test's threads and
    requests take it too (`threads.py`, `mizuoto_runtime.memory.intra_op`; issue 31)."""
    with intra_op_threads(1):
        yield
