"""Run `python -m kafka_scorer ...` the way a user does: a child process, a clean environment."""

from __future__ import annotations

import os
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


def run_cli(*args: str, timeout: float = 120, env: dict[str, str] | None = None, cwd: Path | None = None):
    return subprocess.run(
        [sys.executable, "-m", "kafka_scorer", *args],
        cwd=cwd or ROOT,
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
