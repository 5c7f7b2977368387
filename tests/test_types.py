"""The package type-checks: `mypy` (configured in pyproject.toml, `[tool.mypy]`) over kafka_scorer and
the bench beside it (kafka_scorer_bench, outside the wheel) exits 0, so the typed seam between the
worker and the engine (and every `# type: ignore`, which `warn_unused_ignores` keeps honest) is checked
on every run instead of hoped for."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

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


IGNORE = re.compile(r"# type: ignore(\[[\w, -]+\])?(?P<rest>.*)$")


def test_every_type_ignore_names_its_code_and_why() -> None:
    """An ignore is a claim the checker cannot verify (issue 40): it names the error it silences and,
    after it, why the code is right anyway, so a reader can judge the claim without running mypy."""
    bare = []
    for path in sorted(
        [*(ROOT / "kafka_scorer").rglob("*.py"), *(ROOT / "kafka_scorer_bench").rglob("*.py")]
    ):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found = IGNORE.search(line)
            if found and (not found.group(1) or not found.group("rest").strip().startswith("# ")):
                bare.append(f"{path.relative_to(ROOT)}:{number}")
    assert not bare, "say why after each: " + ", ".join(bare)


def test_no_product_module_has_its_errors_silenced() -> None:
    """Issue 47: every module of the product is type-checked; only the bench (outside the wheel) may keep
    a backlog of modules whose errors are switched off."""
    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    silenced = [
        module
        for override in overrides
        if override.get("ignore_errors")
        for module in ([override["module"]] if isinstance(override["module"], str) else override["module"])
        if module == "kafka_scorer" or module.startswith("kafka_scorer.")
    ]
    assert not silenced, "type-check these instead of silencing them: " + ", ".join(silenced)
