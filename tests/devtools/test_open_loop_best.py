"""gpu-check's `open-loop-best` step: which backend the attention step's report crowns, and that the
open-loop bench then runs on it (or nothing runs, with the reason written where the table would be)."""

from __future__ import annotations

import json
from pathlib import Path

from devtools.gpu_check import open_loop_best
from devtools.gpu_check.open_loop_best import best_backend


def report(ms: dict[str, float], diff: dict[str, float], layout: str = "sglang") -> dict:
    return {"layouts": {layout: {"tokens": 7680, "ms": ms, "max_abs_diff": diff}}}


def test_the_fastest_backend_within_the_tolerance_of_dense_wins() -> None:
    ms = {"cascade": 0.2, "dense": 9.0, "flex": 0.7, "spans": 0.5, "varlen": 0.3}
    diff = {"cascade": 0.0, "dense": 0.0, "flex": 1e-2, "spans": 1e-2, "varlen": 0.5}
    best, why = best_backend(report(ms, diff))
    assert best == "spans"  # varlen is faster but wrong; cascade is no candidate (flex's fallback)
    assert "varlen" in why and "outside the tolerance" in why


def test_no_candidate_or_no_layout_names_the_reason() -> None:
    assert best_backend(report({"dense": 1.0}, {"dense": 0.0}))[0] is None
    best, why = best_backend(report({"flex": 1.0}, {"flex": 0.0}, layout="pairs"))
    assert best is None and "no SGLang-shaped layout" in why


def test_the_bench_runs_on_the_winner_and_the_report_says_which(tmp_path: Path, monkeypatch) -> None:
    attention, out = tmp_path / "attention.json", tmp_path / "best.json"
    attention.write_text(json.dumps(report({"flex": 0.7, "varlen": 0.3}, {"flex": 1e-2, "varlen": 1e-2})))
    calls: list[list[str]] = []

    def bench(args: list[str]) -> int:
        calls.append(args)
        Path(args[args.index("--json") + 1]).write_text(json.dumps({"open-loop": {"best": None}}))
        return 0

    monkeypatch.setattr("kafka_scorer.cli.main", bench)
    argv = ["--attention-json", str(attention), "--json", str(out), "--", "bench", "--workload", "open-loop"]
    assert open_loop_best.main(argv) == 0
    assert calls == [["bench", "--workload", "open-loop", "--backend", "varlen", "--json", str(out)]]
    written = json.loads(out.read_text())
    assert written["backend"] == "varlen" and "varlen 0.30 ms" in written["why"] and "open-loop" in written


def test_when_flex_is_fastest_nothing_runs(tmp_path: Path, monkeypatch) -> None:
    attention, out = tmp_path / "attention.json", tmp_path / "best.json"
    attention.write_text(json.dumps(report({"flex": 0.2, "varlen": 0.3}, {"flex": 1e-2, "varlen": 1e-2})))
    monkeypatch.setattr("kafka_scorer.cli.main", lambda args: (_ for _ in ()).throw(AssertionError(args)))
    assert open_loop_best.main(["--attention-json", str(attention), "--json", str(out), "--", "bench"]) == 0
    assert "the open-loop step measured it" in json.loads(out.read_text())["skipped"]
    assert open_loop_best.main(["--attention-json", str(tmp_path / "none"), "--json", str(out), "--"]) == 0
    assert "no " in json.loads(out.read_text())["skipped"]
