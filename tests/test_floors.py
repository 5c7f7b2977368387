"""The floors tier checks what pyproject declares: constraints/floors.txt must pin every direct
dependency to exactly its declared lower bound, or `./dev floors` would test something else."""

from __future__ import annotations

import re
from pathlib import Path

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


def test_the_torch_floor_is_the_torch_dev_installs() -> None:
    dev = (ROOT / "dev").read_text()
    assert f"torch_version={_pinned()['torch']}" in dev
