"""What `kafka-scorer demo` prints once its jobs are answered: one row per job with its scores (or the
rankings, when a template is served: `demo_rerank.py`), the throughput and latency summary, the models'
provenance, and the banner that says random models' scores mean nothing.

rich is imported inside `render`: `--help` imports the demo.
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Any

from kafka_scorer.cli.demo_parts import DemoJob, DemoModel, print_fitted, results_table
from kafka_scorer.cli.submission import Submission

RANDOM_BANNER = (
    "RANDOM MODELS: no --model was given or it could not be loaded, so the demo built tiny "
    "random-initialised models. Their scores are MEANINGLESS; they only show the pipeline working."
)


def render(jobs: list[DemoJob], models: list[DemoModel], elapsed_s: float, max_rows: int) -> None:
    """The results table (rankings when a template is served), the summary, provenance, the banner."""
    from rich.console import Console

    # Piped output gets a wide table instead of rich's 80-column fallback; COLUMNS still wins.
    wide = sys.stdout.isatty() or "COLUMNS" in os.environ
    console = Console(width=None if wide else 140)
    provenance: list[str] = []
    if any(m.template for m in models):
        from kafka_scorer.cli.demo_rerank import render_rankings

        provenance = render_rankings(console, jobs, max_rows)
    else:
        _scores_table(console, jobs, max_rows)
    done = [j.submission for j in jobs if j.submission.result is not None]
    latencies = sorted(s.latency_s * 1000 for s in done if s.latency_s is not None)
    items = sum(len(s.job.inputs) for s in done)
    failed = sum(1 for s in done if s.result is not None and s.result.error is not None)
    p50 = statistics.median(latencies) if latencies else 0.0
    p95 = latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))] if latencies else 0.0
    console.print(
        f"{len(done)}/{len(jobs)} jobs answered ({failed} with an error reply), {items} items in "
        f"{elapsed_s:.2f}s: {len(done) / max(elapsed_s, 1e-9):.1f} jobs/s, "
        f"{items / max(elapsed_s, 1e-9):.1f} items/s; latency p50 {p50:.0f} ms, p95 {p95:.0f} ms"
    )
    console.print("models: " + ", ".join(f"{m.label}: {m.scorer.describe().model_name}" for m in models))
    for line in provenance:
        console.print(line, markup=False, highlight=False)
    if any(m.random for m in models):
        console.print(f"[bold red]{RANDOM_BANNER}[/]")


def _scores_table(console: Any, jobs: list[DemoJob], max_rows: int) -> None:
    """One row per job, one line of (rounded) scores per item."""
    scores = "scores, one row per item (rounded)"
    columns = [("job id", "left"), ("model", "left"), ("MIS", "center"), ("input", "left")]
    columns += [("items", "right"), (scores, "left"), ("latency ms", "right")]
    table = results_table("kafka-scorer demo results", columns, scores, 22, wraps="input")  # 3 labels
    for job in jobs[:max_rows]:
        s = job.submission
        mis = {True: "yes", False: "no", None: "auto"}[s.job.multi_item]
        kind = "tokens" if isinstance(s.job.query, list) else "text"
        if s.job.apply_softmax:
            kind += ", softmax"
        latency = f"{s.latency_s * 1000:.0f}" if s.latency_s is not None else "-"  # produce to result
        table.add_row(s.job_id, job.model.label, mis, kind, str(len(s.job.inputs)), _outcome(s), latency)
    if len(jobs) > max_rows:
        table.caption = f"first {max_rows} of {len(jobs)} jobs"
    print_fitted(console, table)


def _outcome(s: Submission) -> str:
    result = s.result
    if result is None:
        return "TIMED OUT" if s.send_error is None else f"NOT SENT: {s.send_error}"
    if result.error is not None:
        return f"ERROR {result.error.code.value}: {result.error.message}"
    rows = ["[" + " ".join(f"{v:.3f}" for v in row) + "]" for row in result.scores or []]
    if result.pooled_hidden_states is not None:
        shape = "x".join(str(d) for d in result.pooled_hidden_states.shape)
        rows.append(f"+ pooled hidden states {shape}")
    return "\n".join(rows) if rows else "[] (no items)"  # one line per item
