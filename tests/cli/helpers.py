"""Run `python -m kafka_scorer ...` the way a user does: a child process, a clean environment."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cli_env(**extra: str) -> dict[str, str]:
    """The caller's environment minus KAFKA_SCORER_* settings, with this checkout importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_SCORER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(extra)
    return env


def extras_only_modules() -> list[str]:
    """The importable modules of the test extras (pyproject's `test = [...]`) that the product does not
    install anyway (PyYAML is huggingface-hub's, for one): what a user's venv from `./dev demo` lacks."""
    text = (ROOT / "pyproject.toml").read_text()
    block = text[text.index("test = [") :]
    block = block[: block.index("]\n")]
    names = {_dist(m) for m in re.findall(r'^\s*"([^"]+)"', block, re.MULTILINE)} - _product_closure()
    owners = importlib.metadata.packages_distributions()
    return sorted(m for m, dists in owners.items() if dists and all(_dist(d) in names for d in dists))


def _product_closure() -> set[str]:
    """kafka-scorer's installed dependencies, transitively, extras left out."""
    seen: set[str] = set()
    todo = ["kafka-scorer"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [_dist(r) for r in requires if "extra ==" not in r]
    return seen


def _dist(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ (]", requirement.strip())[0].lower().replace("_", "-")


# `python -m kafka_scorer ARGS` with the test extras' modules marked absent (as if not installed)
_PRODUCT_ONLY = (
    "import runpy, sys; blocked = sys.argv[1].split(','); sys.modules.update(dict.fromkeys(blocked)); "
    "sys.argv = ['kafka-scorer', *sys.argv[2:]]; runpy.run_module('kafka_scorer', run_name='__main__')"
)


def start_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`kafka-scorer ARGS` started, not awaited (`.communicate()` it): for children run side by side."""
    return subprocess.Popen(
        [sys.executable, "-m", "kafka_scorer", *args],
        cwd=ROOT,
        env=env or cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def run_cli(
    *args: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    product_only: bool = False,
):
    """`product_only`: as in a venv with the product alone (`./dev demo`): no test extra importable."""
    launcher = (
        ["-c", _PRODUCT_ONLY, ",".join(extras_only_modules())] if product_only else ["-m", "kafka_scorer"]
    )
    return subprocess.run(
        [sys.executable, *launcher, *args],
        cwd=cwd or ROOT,
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
