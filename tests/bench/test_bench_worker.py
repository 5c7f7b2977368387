"""(d) of `kafka-scorer bench`: the real worker through the embedded tansu broker, in steady state beside
the engine on the same stream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kafka_scorer.cli import main
from kafka_scorer_bench.steady import QUICK_MAX_JOBS, ROUNDS


@pytest.mark.integration
def test_quick_bench_runs_the_worker_through_a_broker(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    rc = main(["bench", "--quick", "--workload", "rerank", "--skip-label-kernel", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0
    w = report["workloads"]["rerank"]
    d, engine = w["contenders"]["d"], w["contenders"]["b:steady"]
    assert d["errors"] == 0, d["first_error"]
    assert d["max_abs_diff_vs_baseline"] <= 1e-4 and engine["max_abs_diff_vs_baseline"] <= 1e-4
    # The steady stream: the workload cycled, long enough for a span between a fill and a drain of one
    # window each (--quick caps it at QUICK_MAX_JOBS).
    steady = w["steady"]
    assert steady["jobs"] == QUICK_MAX_JOBS and steady["jobs"] >= 3 * steady["window"]
    assert d["jobs"] == engine["jobs"] == steady["jobs"] and d["items"] == steady["jobs"] * 4
    # Every job came back through Kafka, packed exactly as the engine packs it in-process.
    assert d["forward_tokens"] == engine["forward_tokens"]
    for c in (d, engine):
        span = c["steady"]
        assert span is not None, c["label"]
        # The span leaves out the fill (time to first result) and the drain, reported beside it.
        assert 0 < span["span_jobs"] < span["stream_jobs"] == steady["jobs"]
        assert span["fill_s"] > 0 and span["drain_s"] >= 0 and span["span_s"] > 0
        assert span["span_s"] + span["fill_s"] <= c["wall_s"] + 1e-6
        assert c["items_per_s"] > 0 and 0 < c["latency_p50_s"] <= c["latency_p99_s"]
    assert d["runs"] == engine["runs"] == ROUNDS  # they took turns on the stream
    # the event loop's CPU per job (worker and client): some, and less than the run's wall time per job
    assert 0 < d["steady"]["loop_cpu_us_per_job"] < d["wall_s"] / d["jobs"] * 1e6
    assert "loop_cpu_us_per_job" not in engine["steady"]
    assert w["ratios"]["d_over_b"] == pytest.approx(d["items_per_s"] / engine["items_per_s"])
    (target,) = [t for t in report["targets"] if t["target"].startswith("rerank: (d)/(b) items/s")]
    assert target["value"] == pytest.approx(w["ratios"]["d_over_b"])
