"""The `kafka-scorer bench` workloads that run only when named, each with a report of its own.

Kept light at import (no torch), as command.py is: each runner imports its workload when it runs.
"""

from __future__ import annotations

import argparse
import sys

from kafka_scorer_bench.report_file import write_report

DEFAULT_BUDGET = 8192
"""The engine workloads' token budget unless `--max-batch-tokens` names one (fixed, so runs compare)."""


def budget(args: argparse.Namespace) -> int:
    return args.max_batch_tokens or DEFAULT_BUDGET


def _timed_run(args: argparse.Namespace) -> dict:
    """The flags every timed named workload reads the same way."""
    return dict(
        quick=args.quick,
        seed=args.seed,
        model_dir=args.model_dir,
        repeats=max(1, args.repeats),
        max_batch_tokens=budget(args),
    )


def _run_cross_encoder(args: argparse.Namespace) -> int:
    from kafka_scorer_bench.cross_encoder import format_cross_encoder_report, run_cross_encoder_bench

    report = run_cross_encoder_bench(
        num_queries=args.jobs or (1 if args.quick else 2),
        quick=args.quick,
        seed=args.seed,
        model_dir=args.model_dir,
        skip_worker=args.skip_worker,
        repeats=max(1, args.repeats),
        repeat_budget_s=args.repeat_budget,
        max_batch_tokens=budget(args),
    )
    failed = "a contender's scores disagree with CrossEncoder.predict"
    return _finish(args, "cross-encoder", report, format_cross_encoder_report(report), failed)


def _run_long_docs(args: argparse.Namespace) -> int:
    from kafka_scorer_bench.long_docs import format_long_docs_report, run_long_docs_bench

    report = run_long_docs_bench(
        quick=args.quick,
        seed=args.seed,
        model_dir=args.model_dir,
        repeats=max(1, args.repeats),
        repeat_budget_s=args.repeat_budget,
        max_batch_tokens=budget(args),
    )
    failed = "chunked scores disagree with the hand-chunked reference"
    return _finish(args, "long-docs", report, format_long_docs_report(report), failed)


def _run_backlog(args: argparse.Namespace) -> int:
    from kafka_scorer.engine.api import resolve_device
    from kafka_scorer_bench.backlog import format_backlog_report, run_backlog_bench

    report = run_backlog_bench(
        device=str(resolve_device(args.device)),
        dtype=args.dtype,
        model_shape=args.model_shape,
        quick=args.quick,
        seed=args.seed,
        model_dir=args.model_dir,
    )
    return _finish(args, "backlog", report, format_backlog_report(report))


def _run_prefix(args: argparse.Namespace) -> int:
    from kafka_scorer.engine.api import resolve_device
    from kafka_scorer_bench.prefix import format_prefix_report, run_prefix_bench

    report = run_prefix_bench(
        device=str(resolve_device(args.device)),
        dtype=args.dtype,
        model_shape=args.model_shape,
        quick=args.quick,
        seed=args.seed,
        model_dir=args.model_dir,
        repeats=max(1, args.repeats),
    )
    return _finish(args, "judge", report, format_prefix_report(report))


def _run_open_loop(args: argparse.Namespace) -> int:
    from kafka_scorer_bench.open_loop import OpenLoopConfig, run_open_loop_bench
    from kafka_scorer_bench.open_loop_report import format_open_loop_report

    backends = [b for b in (args.backend or []) if b != "all"]
    if len(backends) > 1:
        print("kafka-scorer bench: open-loop runs one worker: give at most one --backend", file=sys.stderr)
        return 2
    config = OpenLoopConfig(
        device=args.device,
        dtype=args.dtype,
        model_shape=args.model_shape,
        quick=args.quick,
        rates=args.rates,
        seconds=args.rate_seconds,
        p99_bound_ms=args.p99_bound_ms,
        max_batch_tokens=args.max_batch_tokens,
        backend=backends[0] if backends else None,
        cuda_graph_tokens=args.cuda_graph_tokens,
        seed=args.seed,
        model_dir=args.model_dir,
    )

    def so_far(partial: dict) -> None:
        if args.json:
            write_report(args.json, {"open-loop": partial})

    report = run_open_loop_bench(config, on_rate=so_far)
    return _finish(args, "open-loop", report, format_open_loop_report(report))


def _run_late_interaction(args: argparse.Namespace) -> int:
    from kafka_scorer_bench.late_interaction import format_late_interaction_report, run_late_interaction_bench

    report = run_late_interaction_bench(**_timed_run(args))
    failed = "late-interaction scores disagree with MultiVectorEncoder's"
    return _finish(args, "late-interaction", report, format_late_interaction_report(report), failed)


def _run_images(args: argparse.Namespace) -> int:
    from kafka_scorer_bench.images import format_images_report, run_images_bench

    report = run_images_bench(
        quick=args.quick, seed=args.seed, repeats=max(1, args.repeats), max_batch_tokens=budget(args)
    )
    failed = "the engine's image scores disagree with transformers pair by pair"
    return _finish(args, "images", report, format_images_report(report), failed)


def _run_precision_floor(args: argparse.Namespace) -> int:
    from kafka_scorer_bench.precision_floor import run_precision_floor_bench
    from kafka_scorer_bench.precision_floor_report import format_precision_floor_report

    report = run_precision_floor_bench(model_shape=args.model_shape, jobs=args.jobs, **_timed_run(args))
    failed = "a precision's run answered other jobs, or a float32 contender disagrees with the reference"
    return _finish(args, "bf16-floor", report, format_precision_floor_report(report), failed)


def _run_listwise(args: argparse.Namespace) -> int:
    from kafka_scorer_bench.listwise import format_listwise_report, run_listwise_bench
    from kafka_scorer_bench.models import SHAPES

    shape = SHAPES[args.model_shape or ("tiny" if args.quick else "cpu-small")]
    report = run_listwise_bench(
        model_shape=shape, jobs=args.jobs, repeat_budget_s=args.repeat_budget, **_timed_run(args)
    )
    failed = "the engine's listwise scores disagree with the transformers reference"
    return _finish(args, "listwise", report, format_listwise_report(report), failed)


def _finish(args: argparse.Namespace, name: str, report: dict, text: str, failed: str = "") -> int:
    """Print a named workload's report, write it as JSON if asked; 1 when its cross-check failed."""
    print()
    print(text)
    if args.json:
        write_report(args.json, {name: report})
    if failed and not report["ok"]:
        print(f"cross-check FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


NAMED_ONLY = {
    "open-loop": _run_open_loop,
    "long-docs": _run_long_docs,
    "backlog": _run_backlog,
    "judge": _run_prefix,
    "cross-encoder": _run_cross_encoder,
    "late-interaction": _run_late_interaction,
    "images": _run_images,
    "bf16-floor": _run_precision_floor,
    "listwise": _run_listwise,
}
"""The workloads that run only when named, in the order they run, each with its own report."""
