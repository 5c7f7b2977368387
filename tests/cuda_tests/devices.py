"""The device parameter of the GPU tier: `cpu` runs in CI, `cuda` (marked) on a GPU machine."""

from __future__ import annotations

import pytest

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]


def on_cuda(device: str) -> bool:
    return device.startswith("cuda")
