"""(d) of `kafka-scorer bench`: the real worker through the embedded tansu broker, same jobs as (b)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kafka_scorer.cli import main


@pytest.mark.integration
def test_quick_bench_runs_the_worker_through_a_broker(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    rc = main(["bench", "--quick", "--workload", "rerank", "--skip-label-kernel", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0
    w = report["workloads"]["rerank"]
    d = w["contenders"]["d"]
    assert d["errors"] == 0, d["first_error"]
    assert d["max_abs_diff_vs_baseline"] <= 1e-4
    # Every job came back through Kafka, packed exactly as the engine packs it in-process.
    backend = d["label"].rsplit("[", 1)[1].rstrip("]")
    assert d["forward_tokens"] == w["contenders"][f"b:{backend}"]["forward_tokens"]
    assert d["items_per_s"] > 0 and 0 < d["latency_p50_s"] <= d["latency_p99_s"]
    assert w["ratios"]["d_over_b"] == pytest.approx(
        d["items_per_s"] / w["contenders"][f"b:{backend}"]["items_per_s"]
    )
