"""The floors tier checks what pyproject declares: constraints/floors.txt must pin every direct
dependency to exactly its declared lower bound, or `./dev floors` would test something else."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _declared() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = {}
    for dep in deps:
        name, floor = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", dep.replace(" ", "")).groups()
        floors[name.lower().replace("_", "-")] = floor
    return floors


def _pinned() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints" / "floors.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    return pins


def _same(floor: str, pin: str) -> bool:
    """`>=5.0` is pinned as `==5.0.0`: trailing zeros mean nothing."""
    trim = lambda v: [int(p) for p in v.split(".")]  # noqa: E731
    a, b = trim(floor), trim(pin)
    width = max(len(a), len(b))
    return a + [0] * (width - len(a)) == b + [0] * (width - len(b))


def test_every_direct_dependency_is_pinned_at_its_declared_floor() -> None:
    declared, pinned = _declared(), _pinned()
    assert set(declared) == set(pinned), "a dependency without a floor pin (or a pin of no dependency)"
    wrong = {
        name: (declared[name], pinned[name]) for name in declared if not _same(declared[name], pinned[name])
    }
    assert not wrong, f"pyproject floor vs constraints/floors.txt: {wrong}"


@pytest.mark.parametrize("gpu", ["0", "1"])
def test_the_floors_tier_installs_the_torch_floor(gpu: str) -> None:
    """`./dev floors` asks pip for torch at its floor first (the CPU build where the CPU index answers),
    not for the dev venv's newer torch that the constraints would then take back down."""
    env = {**os.environ, "KAFKA_SCORER_ASSUME_GPU": gpu, "KAFKA_SCORER_ASSUME_CPU_INDEX": "reachable"}
    done = subprocess.run(
        ["bash", str(ROOT / "dev"), "torch-plan", "floors"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    first = done.stdout.splitlines()[1]
    assert first.split()[2] == f"torch=={_pinned()['torch']}", done.stdout
    dev_venv = subprocess.run(
        ["bash", str(ROOT / "dev"), "torch-plan"], env=env, capture_output=True, text=True
    )
    assert dev_venv.stdout.splitlines()[1] != first  # the dev venv keeps its own (newer) torch


def test_the_floors_tier_holds_numpy_where_triton_3_6_interprets_the_kernels() -> None:
    """torch 2.11's index wheels pin triton 3.6, whose interpreter fails every kernel test on numpy 2.4."""
    lines = (ROOT / "constraints" / "floors-tests.txt").read_text().splitlines()
    assert "numpy<2.4" in lines
    assert "constraints/floors-tests.txt" in (ROOT / "dev").read_text()
