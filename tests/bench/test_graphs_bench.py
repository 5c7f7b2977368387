"""`python -m kafka_scorer.bench.graphs --quick`: both Scorers run, the "on" one through its padded
static buffers, their scores agree, and the gpu-check section renders the report."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace


def test_quick_graphs_bench_reports_each_batch_and_renders_its_table(tmp_path: Path) -> None:
    from kafka_scorer.bench.gpu_check_tables import step_markdown, step_summary
    from kafka_scorer.bench.graphs import BATCHES, main

    out = tmp_path / "graphs.json"
    main(["--quick", "--device", "cpu", "--graph-tokens", "1024", "--repeats", "1", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["graphs"] == "128..1024:uncaptured"
    assert [b["requests"] for b in report["batches"]] == [r for r, _ in BATCHES]
    assert all(b["off_ms"] > 0 and b["on_ms"] > 0 and b["max_abs_diff"] <= 1e-4 for b in report["batches"])
    outcome = SimpleNamespace(name="graphs", report=report, summary="", note="", status="ok")
    markdown = step_markdown(outcome)
    assert markdown.startswith("## CUDA graphs on and off") and markdown.count("\n| 1 |") == 2
    assert step_summary(outcome).startswith("graphs off/on per forward: 28 tokens")
