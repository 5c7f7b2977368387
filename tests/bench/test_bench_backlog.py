"""`kafka-scorer bench --workload backlog --quick`: both runs happen on the real worker and broker, every
interactive job is answered in each (scored, or expired), the backlog drains in both, and the report
carries the figures the goal is judged on. Nothing is timed here: the speeds are the benchmark's output."""

from __future__ import annotations

import json
from pathlib import Path

from kafka_scorer.cli import main
from kafka_scorer_bench.backlog import QUICK


def test_the_backlog_bench_runs_lanes_on_and_off_and_answers_everything(tmp_path: Path, capsys) -> None:
    out = tmp_path / "backlog.json"
    assert main(["bench", "--workload", "backlog", "--quick", "--json", str(out)]) == 0
    report = json.loads(out.read_text())["backlog"]
    assert set(report["runs"]) == {"lanes on", "lanes off"}
    for run in report["runs"].values():
        assert 0 <= run["expired"] <= QUICK.live_jobs
        assert run["p50_s"] <= run["p99_s"] <= run["max_s"]
        assert run["bulk_done_s"] > 0 and run["forwards"] > 0 and run["forward_mean_s"] > 0
    assert report["p99_off_over_on"] is not None and report["p99_on_in_forwards"] is not None
    assert "lanes off / lanes on" in capsys.readouterr().out
