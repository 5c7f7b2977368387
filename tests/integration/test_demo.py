"""`kafka-scorer demo --short`, the README's first command, end to end as a child process.

It starts its own embedded broker and workers, so this test needs no fixture: what it checks is
what a newcomer sees — scored rows for both model kinds, the deliberate error row, the RANDOM label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from tests.cli.helpers import cli_env, run_cli

pytestmark = pytest.mark.integration

SCORE_ROW = re.compile(r"^\[(-?\d+\.\d{3}(?: -?\d+\.\d{3})*)\]$")


@dataclass
class Row:
    job_id: str
    model: str
    mis: str
    input: str
    items: int
    cells: list[str] = field(default_factory=list)  # the scores column, one entry per printed line

    @property
    def scores(self) -> list[list[float]]:
        return [[float(v) for v in m[1].split()] for c in self.cells if (m := SCORE_ROW.match(c))]


def table_lines(out: str, columns: int) -> dict[str, list[list[str]]]:
    """Rows of rich's box table by job id, each as its printed lines' cells: a line with a job id starts
    a row, blank-id lines continue it (border and header lines use other box characters)."""
    rows: dict[str, list[list[str]]] = {}
    current: list[list[str]] | None = None
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) != columns + 2:
            continue
        if cells[1]:
            current = rows[cells[1]] = []
        assert current is not None
        current.append(cells[1:-1])
    return rows


def parse_table(out: str) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    for job_id, lines in table_lines(out, 7).items():
        _, model, mis, kind, items, _, _ = lines[0]
        rows[job_id] = Row(job_id, model, mis, kind, int(items), [line[5] for line in lines if line[5]])
    return rows


def test_demo_short_shows_scored_results_for_both_kinds_and_the_error_row() -> None:
    # Without the test extras, as `./dev demo` installs it (issue 26: they are 2.6 GB, triton included)
    done = run_cli("demo", "--short", env=cli_env(COLUMNS="120"), timeout=240, product_only=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "leaked" not in done.stderr
    out = done.stdout
    rows = parse_table(out)
    assert len(rows) == 12, out

    bad = rows.pop("bad-job")
    assert " ".join(bad.cells).startswith("ERROR invalid_request")
    by_kind: dict[str, list[Row]] = {"causal LM": [], "classifier": []}
    for row in rows.values():
        by_kind[row.model].append(row)
        assert len(row.scores) == row.items, f"{row.job_id}: one score row per item expected"
        width = {len(r) for r in row.scores}
        assert width == ({2} if row.model == "causal LM" else {3}), row  # 2 label tokens; 3 classes
        if row.model == "causal LM" and "softmax" in row.input:
            for r in row.scores:  # softmax over the label tokens: rows sum to 1 (3-decimal rounding)
                assert abs(sum(r) - 1.0) <= 0.0021, row
    for kind, kind_rows in by_kind.items():
        assert len(kind_rows) >= 5, kind
        assert {r.mis for r in kind_rows} == {"yes", "no", "auto"}, kind
        assert {r.input.split(",")[0] for r in kind_rows} == {"text", "tokens"}, kind
    assert out.count("+ pooled hidden states") == 2
    assert "12/12 jobs answered (1 with an error reply)" in out
    assert "RANDOM" in out and "MEANINGLESS" in out
    assert "jobs/s" in done.stderr  # the progress bar's live throughput
