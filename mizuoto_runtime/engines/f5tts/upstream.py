"""The `f5-tts` package's model code, imported without its training stack (issue 11).

``f5_tts/model/__init__.py`` imports ``f5_tts.model.trainer``, which imports wandb, accelerate,
ema_pytorch and datasets at module level: about 1 GB of packages an inference pack must not
pull into ComfyUI's environment (datasets alone pins fsspec and pyarrow). The modules we use
(``cfm``, ``backbones.dit``, ``modules``, ``utils``) import none of them. `import_upstream`
registers the ``f5_tts.model`` package object without running its ``__init__``, imports those
modules, and gives the package the names its ``__init__`` exports, the trainer lazily (PEP 562):
other code that imports ``f5_tts.model`` later sees the same package, and only
``f5_tts.model.Trainer`` would need the training stack. No upstream file is changed or copied.
The one warning those modules draw at import (`TORCH_JIT_SCRIPT`, from ``x_transformers``) is
dropped (`F5TTS_NOISE`).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

from ..checkpoint_files import read_yaml
from ..upstream import TORCH_JIT_SCRIPT, ImportNoise, drop_noise

F5TTS_NOISE = ImportNoise(warnings=(TORCH_JIT_SCRIPT,))


@dataclasses.dataclass(frozen=True)
class Upstream:
    CFM: type
    DiT: type
    MelSpec: type
    convert_char_to_pinyin: Any


_upstream: Upstream | None = None


def _package_dir() -> Path:
    spec = importlib.util.find_spec("f5_tts")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("No module named 'f5_tts' (the f5tts extra)")
    return Path(next(iter(spec.submodule_search_locations)))


def import_upstream() -> Upstream:
    """CFM, DiT, MelSpec and the text front end of `f5_tts`, without its trainer's imports."""
    global _upstream
    if _upstream is not None:
        return _upstream
    drop_noise(F5TTS_NOISE)
    if "f5_tts.model" not in sys.modules:
        package = types.ModuleType("f5_tts.model")
        package.__path__ = [str(_package_dir() / "model")]  # type: ignore[attr-defined]
        package.__package__ = "f5_tts.model"

        def lazy(name: str) -> Any:
            if name == "Trainer":
                return importlib.import_module("f5_tts.model.trainer").Trainer
            raise AttributeError(f"module 'f5_tts.model' has no attribute {name!r}")

        package.__getattr__ = lazy  # type: ignore[attr-defined]
        sys.modules["f5_tts.model"] = package
    from f5_tts.model.backbones.dit import DiT
    from f5_tts.model.backbones.mmdit import MMDiT
    from f5_tts.model.backbones.unett import UNetT
    from f5_tts.model.cfm import CFM
    from f5_tts.model.modules import MelSpec
    from f5_tts.model.utils import convert_char_to_pinyin

    package = sys.modules["f5_tts.model"]
    for name, value in (("CFM", CFM), ("DiT", DiT), ("MMDiT", MMDiT), ("UNetT", UNetT)):
        setattr(package, name, value)
    _upstream = Upstream(CFM=CFM, DiT=DiT, MelSpec=MelSpec, convert_char_to_pinyin=convert_char_to_pinyin)
    return _upstream


def package_config(name: str) -> dict[str, Any]:
    """One of the package's own model configs (``f5_tts/configs/<name>.yaml``)."""
    return read_yaml(_package_dir() / "configs" / f"{name}.yaml")


def vocos_classes() -> dict[str, type]:
    """The only classes a Vocos ``config.yaml`` may name (it is not a license to import)."""
    from vocos.feature_extractors import MelSpectrogramFeatures
    from vocos.heads import ISTFTHead
    from vocos.models import VocosBackbone

    return {"vocos.feature_extractors.MelSpectrogramFeatures": MelSpectrogramFeatures,
            "vocos.models.VocosBackbone": VocosBackbone, "vocos.heads.ISTFTHead": ISTFTHead}
