"""The product wheel holds the product only: no bench code (issue 47).

The bench (`kafka_scorer_bench/`) lives beside the package in the repository, developer tooling like
`devtools/`, so an installed worker carries none of it. What goes into the wheel is setuptools' package
discovery as pyproject configures it (`[tool.setuptools.packages.find]`); this runs the same discovery
over the checkout, in milliseconds instead of a wheel build, and fails if a bench package or module would
land in it: a `kafka_scorer*` pattern, for one, takes `kafka_scorer_bench` too.
"""

from __future__ import annotations

from pathlib import Path

import tomllib
from setuptools.discovery import PackageFinder, PEP420PackageFinder

ROOT = Path(__file__).resolve().parents[1]


def wheel_packages() -> list[str]:
    """The packages setuptools puts into the wheel, found as it finds them."""
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    finder = PEP420PackageFinder if found.get("namespaces", True) else PackageFinder
    return finder.find(
        str(ROOT / found.get("where", ["."])[0]),
        exclude=tuple(found.get("exclude", ())),
        include=tuple(found.get("include", ("*",))),
    )


def wheel_modules() -> list[str]:
    """Every module of those packages, dotted."""
    return sorted(
        f"{package}.{path.stem}"
        for package in wheel_packages()
        for path in (ROOT / package.replace(".", "/")).glob("*.py")
    )


def test_the_wheel_holds_the_product_package() -> None:
    packages = wheel_packages()
    assert "kafka_scorer" in packages and "kafka_scorer.engine" in packages
    assert all(p == "kafka_scorer" or p.startswith("kafka_scorer.") for p in packages), packages


def test_no_bench_module_lands_in_the_wheel() -> None:
    bench = sorted(p.stem for p in (ROOT / "kafka_scorer_bench").glob("*.py") if p.stem != "__init__")
    assert len(bench) > 30  # the bench is where this test looks for it
    landed = [
        module
        for module in wheel_modules()
        if module.startswith("kafka_scorer_bench") or ".bench." in f"{module}." or "bench_named" in module
    ]
    assert not landed, f"bench code in the product wheel: {landed}"
