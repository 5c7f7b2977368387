"""`kafka-scorer bench --workload open-loop --quick`: Poisson arrivals through the embedded broker to a real
`kafka-scorer worker` process, one row per rate. Nothing is timed here (the speeds are the benchmark's
output): what is checked is that every request is answered and counted, that the figures are the ones
the table promises, and that the helpers the figures rest on (arrivals, percentiles, the best rate)
mean what they say."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devtools.gpu_check.run import Outcome
from devtools.gpu_check.tables import step_markdown
from kafka_scorer.cli import main
from kafka_scorer_bench.open_loop import (
    QUICK_RATES,
    QUICK_SECONDS,
    QUICK_SHAPE,
    best_rate,
    fold_into_vocab,
    poisson_arrivals,
)
from kafka_scorer_bench.open_loop_client import percentile

RATE_KEYS = {
    "rate_rps",
    "requests",
    "offered_items_per_s",
    "served_items_per_s",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "max_ms",
    "errors",
    "lost",
    "first_error",
    "client_lag_max_ms",
    "others_cpu",
    "meets_bound",
    "skipped",
}


@pytest.mark.integration
def test_quick_open_loop_answers_every_request_at_every_rate(tmp_path: Path, capsys, monkeypatch) -> None:
    """Through the flex backend with CUDA graphs asked for: on the CPU the worker serves from the padded
    static buffers (engine/graphs/), which the report names. The report is written after each rate too
    (a run killed at its limit keeps the rates it measured), marked partial."""
    from kafka_scorer_bench import named

    written: list[dict] = []
    real_write = named.write_report

    def recording(path, report: dict) -> None:
        written.append(json.loads(json.dumps(report)))
        real_write(path, report)

    monkeypatch.setattr(named, "write_report", recording)
    out = tmp_path / "open-loop.json"
    flags = ["--backend", "flex", "--cuda-graph-tokens", "512", "--max-batch-tokens", "1024"]
    assert main(["bench", "--workload", "open-loop", "--quick", *flags, "--json", str(out)]) == 0
    report = json.loads(out.read_text())["open-loop"]
    meta = report["meta"]
    assert meta["served_backend"] == "flex" and meta["served_cuda_graphs"] == "128..512:uncaptured"
    assert meta["model_shape"] == "tiny" and meta["device"] == "cpu"
    assert meta["job_tokens"] == QUICK_SHAPE.tokens and meta["rates"] == list(QUICK_RATES)
    assert meta["worker_start_s"] > 0 and meta["warmup_jobs"] > 0  # warmed before the first timed rate
    # what the seconds to ready went to, from the worker's log: its warm-up; the rest is CUDA's
    steps = meta["start_up_steps"]
    assert 0 < steps["warm_up_s"] < meta["worker_start_s"]
    assert steps["label_kernels_s"] is None and steps["cuda_graphs_s"] is None
    assert [r["rate_rps"] for r in report["rates"]] == list(QUICK_RATES)
    for r in report["rates"]:
        assert set(r) == RATE_KEYS
        assert not r["skipped"] and r["errors"] == r["lost"] == 0, r["first_error"]
        assert r["requests"] >= 1
        assert r["offered_items_per_s"] == pytest.approx(
            r["requests"] * QUICK_SHAPE.num_items / QUICK_SECONDS
        )
        assert 0 < r["served_items_per_s"] <= r["offered_items_per_s"] + 1e-9
        assert 0 < r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] <= r["max_ms"]
        assert r["meets_bound"] == (r["p99_ms"] <= meta["p99_bound_ms"])
    assert report["best"] == best_rate(report["rates"], meta["p99_bound_ms"])
    partials, final = [w["open-loop"] for w in written[:-1]], written[-1]["open-loop"]
    assert [len(p["rates"]) for p in partials] == list(range(1, len(QUICK_RATES) + 1))
    assert all(p["partial"] for p in partials) and final["partial"] is False and final == report
    assert partials[-1]["rates"] == report["rates"] and partials[0]["meta"]["worker_start_s"] > 0
    killed = Outcome("open-loop", "timeout", 9.0, note="killed after 9 s", report={"open-loop": partials[0]})
    first = f"{QUICK_RATES[0]:g}/s"
    assert f"**partial** (timeout: killed after 9 s): the rates measured before it: {first}\n" in (
        step_markdown(killed)
    )
    printed = capsys.readouterr().out
    assert (
        f"worker ready in {meta['worker_start_s']:.1f} s (its warm-up {steps['warm_up_s']:.1f} s);" in printed
    )
    assert (
        "| requests/s | offered items/s | served items/s | p50 ms | p90 ms | p99 ms | max ms | errors |"
        in printed
    )


@pytest.mark.parametrize("rates", ["", "0,1", "1,x", "-2"])
def test_bad_rates_are_one_line_naming_the_flag(rates: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--workload", "open-loop", "--rates", rates])
    assert exc.value.code == 2
    assert "--rates" in capsys.readouterr().err


@given(st.floats(0.5, 500), st.floats(0.1, 5), st.integers(0, 2**32))
def test_poisson_arrivals_lie_in_the_window_in_order(rate: float, seconds: float, seed: int) -> None:
    times = poisson_arrivals(random.Random(seed), rate, seconds)
    assert times and times == sorted(times) and times[0] >= 0 and times[-1] < seconds


def test_poisson_arrivals_average_the_rate() -> None:
    """Over many windows the count averages rate x seconds (the sum of 400 Poisson(50) draws has a
    standard deviation of 141 around 20,000: 5% is over seven of them)."""
    rng = random.Random(0)
    total = sum(len(poisson_arrivals(rng, 100.0, 0.5)) for _ in range(400))
    assert total == pytest.approx(400 * 50, rel=0.05)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7 and percentile([], 50) is None


@given(st.lists(st.integers(0, 200_000), min_size=1, max_size=4, unique=True), st.integers(400, 200_000))
def test_label_ids_fold_into_the_regular_vocabulary(ids: list[int], vocab: int) -> None:
    folded = fold_into_vocab(ids, vocab)
    assert all(0 <= i < vocab for i in folded)
    assert [f for i, f in zip(ids, folded) if i < vocab] == [i for i in ids if i < vocab]


def test_the_sglang_labels_stay_distinct_on_every_bench_shape() -> None:
    from kafka_scorer_bench.models import SHAPES

    for shape in SHAPES.values():
        assert len(set(fold_into_vocab([9454, 2753], shape.vocab_size))) == 2, shape.name


def _rate(rate: float, p99: float | None, errors: int = 0, skipped: bool = False) -> dict:
    return {"rate_rps": rate, "p99_ms": p99, "meets_bound": not skipped and not errors and p99 <= 300,
            "skipped": skipped}  # fmt: skip


def test_best_rate_is_the_highest_within_the_bound_without_errors() -> None:
    rates = [
        _rate(10, 50),
        _rate(20, 250),
        _rate(40, 280, errors=1),
        _rate(80, 900),
        _rate(160, None, skipped=True),
    ]
    assert best_rate(rates, 300)["rate_rps"] == 20
    assert best_rate([_rate(10, 400)], 300) is None
