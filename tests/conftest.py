"""Shared fixtures: the simulated strict device of M55–M56."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mizuoto_runtime import DeviceService, ModelManager, VramPolicy  # noqa: E402

MB = 1 << 20


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
