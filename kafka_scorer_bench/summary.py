"""From a contender's raw `RunRecord` to the figures the report prints, and the cross-check of its scores.

Every contender is summarised by the same arithmetic, so the columns compare like with like. Scores of
(a), (b) and (d) are compared with (c) on every job: a benchmark that silently measured a broken path
would show it here, and the run exits non-zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kafka_scorer_bench.models import ModelShape
from kafka_scorer_bench.records import RunRecord, Scores
from kafka_scorer_bench.steady import steady_state
from kafka_scorer_bench.workloads import Workload, packed_tokens, pair_tokens


@dataclass
class ContenderSummary:
    label: str
    jobs: int
    items: int
    errors: int
    wall_s: float
    items_per_s: float
    tokens_per_s: float
    """Tokens the contender itself ran through the model, per second."""
    pair_tokens_per_s: float
    """Tokens of the `query + item` pairs scored, per second: the same numerator for every contender."""
    forward_tokens: int
    latency_p50_s: float
    latency_p99_s: float
    peak_memory_bytes: int
    floor_s: float
    floor_fraction: float
    foreign_cpu_load: float | None = None
    runs: int = 1
    """Timed runs made; the figures are those of the fastest (the one least disturbed)."""
    max_abs_diff_vs_baseline: float | None = None
    first_error: str | None = None
    steady: dict | None = None
    """Steady-state contenders only: the stream's and the span's job counts, the span's length, and the
    fill (time to first result) and drain around it, in seconds; for (d), the event loop's CPU time per
    job of the whole run (`loop_cpu_us_per_job`: the worker's and the bench client's, sharing the loop)."""


STEADY_ENGINE = "b:steady"
"""The engine (default backend, MIS on) on (d)'s steady stream: what (d) is divided by."""
LAYERS = "b:layers"
"""(b) on transformers' own decoder layers instead of the engine's fused ones (same Scorer)."""
EAGER = "b:eager"
"""(b) on the same fused layers run eagerly, where the served ones are compiled: what compiling buys."""


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: with few jobs p99 is simply the slowest)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarise(
    label: str, record: RunRecord, workload: Workload, shape: ModelShape, peak_flops: float
) -> ContenderSummary:
    """The whole run: every job, first submission to last answer."""
    return _summary(label, record, workload, shape, peak_flops, range(len(workload.jobs)), record.wall_s)


def summarise_steady(
    label: str, record: RunRecord, workload: Workload, shape: ModelShape, peak_flops: float
) -> ContenderSummary:
    """Only the steady span (`steady.py`): the jobs answered inside it, over its length; fill and drain
    are reported beside the figures. A run with no steady span (its window held every job) falls back
    to the whole run, and says so with `steady: None`."""
    state = steady_state(record)
    if state is None:
        return summarise(label, record, workload, shape, peak_flops)
    summary = _summary(label, record, workload, shape, peak_flops, state.indices, state.span_s, state.settled)
    summary.steady = {
        "stream_jobs": len(workload.jobs),
        "span_jobs": len(state.indices),
        "span_s": state.span_s,
        "fill_s": state.fill_s,
        "drain_s": state.drain_s,
    }
    if record.loop_cpu_s is not None:
        summary.steady["loop_cpu_us_per_job"] = record.loop_cpu_s / max(1, len(workload.jobs)) * 1e6
    return summary


def _summary(
    label: str,
    record: RunRecord,
    workload: Workload,
    shape: ModelShape,
    peak_flops: float,
    indices: Sequence[int],
    seconds: float,
    timed: Sequence[int] | None = None,
) -> ContenderSummary:
    """Figures over the jobs at `indices` in `seconds`. The compute floor is 2 × matmul parameters ×
    tokens FLOPs over the measured matmul peak (attention FLOPs excluded): floor fraction = floor time /
    measured time. Forward tokens and LM-head rows of a subset are the run's, in the subset's share of
    the packed tokens (exact when every job is packed the same way, as in these workloads). Latency
    percentiles are over `timed` (default: `indices`)."""
    wall = max(seconds, 1e-9)
    jobs = workload.jobs
    share = sum(packed_tokens(jobs[k]) for k in indices) / max(1, workload.packed_tokens)
    forward_tokens = round(record.forward_tokens * share)
    flops = 2 * shape.decoder_params() * forward_tokens
    flops += 2 * shape.lm_head_params() * record.lm_head_rows * share
    floor = flops / peak_flops
    errors = [e for e in record.errors if e]
    latencies = [record.latencies[k] for k in (indices if timed is None else timed)]
    return ContenderSummary(
        label=label,
        jobs=len(jobs),
        items=workload.num_items,
        errors=len(errors),
        wall_s=record.wall_s,
        items_per_s=sum(len(jobs[k].items) for k in indices) / wall,
        tokens_per_s=forward_tokens / wall,
        pair_tokens_per_s=sum(pair_tokens(jobs[k]) for k in indices) / wall,
        forward_tokens=record.forward_tokens,
        latency_p50_s=percentile(latencies, 50),
        latency_p99_s=percentile(latencies, 99),
        peak_memory_bytes=record.peak_bytes,
        floor_s=floor,
        floor_fraction=floor / wall,
        foreign_cpu_load=record.foreign_cpu_load,
        runs=record.runs,
        first_error=errors[0] if errors else None,
    )


def max_abs_diff(got: Sequence[Scores | None], want: Sequence[Scores | None]) -> float:
    """Largest |difference| over all score cells; inf when a job is missing or shaped differently."""
    worst = 0.0
    for g, w in zip(got, want):
        if g is None or w is None or len(g) != len(w):
            return math.inf
        for row_g, row_w in zip(g, w):
            if len(row_g) != len(row_w):
                return math.inf
            for a, b in zip(row_g, row_w):
                worst = max(worst, abs(a - b))
    return worst


def tolerance(dtype: torch.dtype) -> float:
    """Scores are probabilities (or small logits): float32 differs only by summation order."""
    return 2e-3 if dtype == torch.float32 else 6e-2


def cross_check(contenders: dict[str, dict], dtype: torch.dtype) -> dict:
    """One workload's verdict: every contender answered every job, within `tolerance` of (c)."""
    diffs = [
        c["max_abs_diff_vs_baseline"]
        for c in contenders.values()
        if c["max_abs_diff_vs_baseline"] is not None
    ]
    errors = sum(c["errors"] for c in contenders.values())
    tol = tolerance(dtype)
    return {
        "max_abs_diff": max(diffs, default=0.0),
        "tolerance": tol,
        "errors": errors,
        "ok": errors == 0 and max(diffs, default=0.0) <= tol,
    }


def ratios(contenders: dict[str, dict], backends: Sequence[str], default_backend: str) -> dict:
    """Items/s of one contender over another, and the share of MIS's token saving that became speed.

    (a) runs n·(Q+I) tokens per job, (b) Q+n·I: their ratio is what MIS could at best gain, so
    `b_over_a_vs_token_ratio` near 1 means (b) turned all of the saving into throughput.
    """

    def ratio(top: str, bottom: str) -> float | None:
        if top not in contenders or bottom not in contenders:
            return None
        return contenders[top]["items_per_s"] / max(contenders[bottom]["items_per_s"], 1e-12)

    token_ratio = contenders["a"]["forward_tokens"] / max(
        1, min(contenders[f"b:{b}"]["forward_tokens"] for b in backends)
    )
    out = {
        "token_ratio_a_over_b": token_ratio,
        "b_over_a": {b: ratio(f"b:{b}", "a") for b in backends},
        "b_over_c": {b: ratio(f"b:{b}", "c") for b in backends},
        "a_over_c": ratio("a", "c"),
        "a_by_backend_over_c": {
            key.removeprefix("a:"): ratio(key, "c") for key in contenders if key.startswith("a:")
        },
    }
    default_key = f"b:{default_backend}" if f"b:{default_backend}" in contenders else f"b:{backends[0]}"
    out["b_over_a_vs_token_ratio"] = {b: (out["b_over_a"][b] or 0.0) / token_ratio for b in backends}
    if LAYERS in contenders:  # the engine's fused layers against transformers' own, same backend
        out["fused_over_layers"] = ratio(default_key, LAYERS)
    if EAGER in contenders:  # the same fused layers compiled against eager: what inductor buys
        out["compiled_over_eager"] = ratio(default_key, EAGER)
    if "d" in contenders:  # the worker against the engine on the same steady stream, when it ran
        out["d_over_b"] = ratio("d", STEADY_ENGINE if STEADY_ENGINE in contenders else default_key)
    return out
