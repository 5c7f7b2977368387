"""The demo's tables on an 80-column terminal (issue 21 item 6): squeezed to fit, nothing cut off."""

from __future__ import annotations

import pytest
from rich.cells import cell_len

from tests.cli.helpers import cli_env, run_cli

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("extra", [(), ("--template", "qwen3-reranker")])
def test_the_tables_fit_80_columns(extra: tuple[str, ...]) -> None:
    done = run_cli("demo", "--short", "--no-progress", *extra, env=cli_env(COLUMNS="80"), timeout=240)
    assert done.returncode == 0, done.stderr
    assert max(cell_len(line) for line in done.stdout.splitlines()) <= 80
    # the last column is there, header and figures, not cropped at the edge
    assert "latency ms" in done.stdout, done.stdout
