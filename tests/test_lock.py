"""constraints/lock.txt, the versions `./dev` installs, holds what pyproject asks for: a pin for every
direct dependency of the product and of its extras, each pin inside pyproject's bounds, so a floor or
cap raised in pyproject without `./dev lock` fails here instead of at a user's install; and the torch
`./dev` installs is the lock's."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import tomllib
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "constraints" / "lock.txt"


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        deps += extra
    return [Requirement(dep) for dep in deps]


def _pins() -> dict[str, list[tuple[str, Marker | None]]]:
    """name -> every (version, marker) the universal lock gives it (one per Python/platform range)."""
    pins: dict[str, list[tuple[str, Marker | None]]] = {}
    for line in LOCK.read_text().splitlines():
        found = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)\s*(?:;\s*(.+))?$", line)
        if found:
            name, version, marker = found.groups()
            pins.setdefault(canonicalize_name(name), []).append((version, Marker(marker) if marker else None))
    return pins


def test_every_declared_dependency_is_locked_within_its_bounds() -> None:
    pins, wrong = _pins(), []
    for req in _requirements():
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # e.g. triton on Linux only: checked where it applies
        versions = pins.get(canonicalize_name(req.name))
        if not versions:
            wrong.append(f"{req.name}: not in the lock")
            continue
        here = [v for v, marker in versions if marker is None or marker.evaluate()]
        wrong += [f"{req.name}=={v} is outside {req}" for v in here if not req.specifier.contains(v)]
    assert wrong == [], "run ./dev lock: " + "; ".join(wrong)


def test_dev_installs_the_locked_torch() -> None:
    (torch,) = [v for v, marker in _pins()["torch"] if marker is None or marker.evaluate()]
    done = subprocess.run(
        ["bash", str(ROOT / "dev"), "torch-plan"],
        env={**os.environ, "KAFKA_SCORER_ASSUME_GPU": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert f"pip install torch=={torch}" in done.stdout.splitlines()
