"""No module or package under tests/ is named like something importable from outside the repository.

A test that runs a helper script by its path (`python tests/engine/_script.py`) puts the script's folder
first on `sys.path`, so a test package there named like an installed distribution hides it from every
library that imports it in that process. That broke a fresh clone once: transformers 5.25 began to
import the `kernels` distribution, and `tests/engine/kernels` answered instead. The names below are the
ones that folder offers; any that the interpreter could also find outside the repository (a
distribution, a namespace portion such as NVIDIA's `cuda`, or the standard library) fails here, with
the name and what it would hide, before it fails a library somewhere else."""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def _outside_paths() -> list[str]:
    """sys.path without the checkout's own source folders (the venv's site-packages may live inside
    the checkout and stays: that is where distributions are)."""
    keep = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if path == ROOT or path.is_relative_to(TESTS) or path.is_relative_to(ROOT / "kafka_scorer"):
            continue
        keep.append(entry)
    return keep


def _importable_names(folder: Path) -> Iterator[tuple[str, Path]]:
    """What `import NAME` would find in `folder` if it were first on sys.path: modules and regular
    packages (a folder without __init__.py is only a namespace portion, which never hides anything)."""
    for child in sorted(folder.iterdir()):
        if child.suffix == ".py":
            yield child.stem, child
        elif child.is_dir() and (child / "__init__.py").exists():
            yield child.name, child


def _shadowed(name: str, outside: list[str]) -> str | None:
    if name in sys.stdlib_module_names:
        return "the standard library"
    spec = importlib.machinery.PathFinder.find_spec(name, outside)
    if spec is None:
        return None
    return spec.origin or ", ".join(spec.submodule_search_locations or []) or "a namespace package"


def shadowing_names(root: Path) -> list[str]:
    """Every name under `root` that hides something importable from outside the checkout."""
    outside = _outside_paths()
    folders = [root, *(p for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    found = []
    for folder in folders:
        for name, path in _importable_names(folder):
            hidden = _shadowed(name, outside)
            if hidden:
                found.append(f"{path.relative_to(ROOT)} hides `import {name}` ({hidden}): rename it")
    return found


def test_no_test_module_hides_an_importable_name() -> None:
    assert shadowing_names(TESTS) == []


def test_the_guard_finds_a_shadowing_name(tmp_path: Path) -> None:
    """The check itself: a test package named like an installed distribution (msgspec, which the
    product imports) and a module named like the standard library are both reported."""
    (tmp_path / "msgspec").mkdir()
    (tmp_path / "msgspec" / "__init__.py").write_text("")
    (tmp_path / "json.py").write_text("")
    (tmp_path / "fine_name_for_a_helper.py").write_text("")
    outside = _outside_paths()
    hits = {name: _shadowed(name, outside) for name, _ in _importable_names(tmp_path)}
    assert hits["msgspec"] and "msgspec" in hits["msgspec"]
    assert hits["json"] == "the standard library"
    assert hits["fine_name_for_a_helper"] is None
