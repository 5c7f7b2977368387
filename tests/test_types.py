"""The package type-checks: `mypy` (configured in pyproject.toml, `[tool.mypy]`) over kafka_scorer
exits 0, so the typed seam between the worker and the engine (and every `# type: ignore`, which
`warn_unused_ignores` keeps honest) is checked on every run instead of hoped for."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.typecheck


@pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None, reason="mypy is not installed (the `test` extra has it)"
)
def test_package_type_checks() -> None:
    # ~25 s cold, a few with the cache (.mypy_cache, git-ignored); the configuration names what to check
    run = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, f"mypy found errors:\n{run.stdout}{run.stderr}"
