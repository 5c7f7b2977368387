"""The demo's tables on an 80-column terminal (issue 21 item 6): squeezed to fit, nothing cut off."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.cells import cell_len

from tests.cli.helpers import cli_env, run_cli

pytestmark = pytest.mark.integration


def _fits_80_columns(stdout: str) -> None:
    assert max(cell_len(line) for line in stdout.splitlines()) <= 80
    # the last column is there, header and figures, not cropped at the edge
    assert "latency ms" in stdout, stdout


def test_the_rankings_fit_80_columns() -> None:
    done = run_cli(
        "demo",
        "--short",
        "--no-progress",
        "--template",
        "qwen3-reranker",
        env=cli_env(COLUMNS="80"),
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    _fits_80_columns(done.stdout)


def test_a_missing_model_dir_is_said_and_the_fallback_tables_fit_80_columns(tmp_path: Path) -> None:
    """Two checks on one demo run (each run is seconds of start-up): a `--model` directory that does not
    exist is one line, then the demo's own random models (issue 4, item 5: was in tests/cli/test_errors.py),
    and their tables fit 80 columns, the RANDOM banner included."""
    missing = tmp_path / "no-such-model"
    done = run_cli(
        "demo", "--model", str(missing), "--short", "--no-progress", env=cli_env(COLUMNS="80"), timeout=240
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    reasons = [line for line in done.stderr.splitlines() if "cannot load --model" in line]
    assert len(reasons) == 1, done.stderr
    assert str(missing) in reasons[0] and "local checkpoint directory" in reasons[0]
    assert "RANDOM" in done.stdout
    _fits_80_columns(done.stdout)
