"""`python -m kafka_scorer.bench.deterministic`: what deterministic mode costs, the engine alone.

The bench's decoder workloads (`bench/workloads.py`, its CPU job counts off CUDA) on the bench's model
shape, scored by two Scorers of one checkpoint: the default engine and deterministic mode
(`engine/deterministic.py`), both with the prefix cache off (the runs repeat the same jobs, as the
bench's contenders do). Runs alternate between the two, the fastest of `--repeats` is kept for each, and
the report gives items/s per workload and the ratio (deterministic / default). It also says how far the
two modes' scores are apart, and whether every job scored twice in deterministic mode, once in a batch
and once alone, got the same scores bit for bit.
"""

from __future__ import annotations

import argparse

from kafka_scorer.bench.engine_alone import engine_parser, resolve_run, timed, write_report
from kafka_scorer.bench.workloads import build_workload, workload_spec
from kafka_scorer.engine.scorer import Scorer

DECODER_WORKLOADS = ("rerank", "many-items", "short", "mixed")


def run(args: argparse.Namespace) -> dict:
    run_ = resolve_run(args, "determinism")
    device, dtype, shape = run_.device, run_.dtype, run_.shape
    report: dict = {"device": device, "dtype": dtype, "shape": shape.name, "workloads": {}}
    scorers: dict[str, dict[bool, Scorer]] = {}
    for name in args.workload or DECODER_WORKLOADS:
        spec = workload_spec(name, quick=args.quick, device_type=device.split(":")[0])
        kind = spec.model_kind
        if kind not in scorers:
            path = run_.checkpoint(kind)
            scorers[kind] = {
                mode: Scorer(
                    str(path),
                    dtype=dtype,
                    device=device,
                    max_batch_tokens=args.max_batch_tokens,
                    prefix_cache_mb=0,
                    deterministic=mode,
                )
                for mode in (False, True)
            }
            for scorer in scorers[kind].values():
                scorer.warm_up()
        jobs = build_workload(spec, shape.vocab_size, seed=0).jobs
        best = {False: float("inf"), True: float("inf")}
        results = {}
        for _ in range(args.repeats):
            for mode, scorer in scorers[kind].items():
                seconds, results[mode] = timed(scorer, jobs)
                best[mode] = min(best[mode], seconds)
        items = sum(len(job.items) for job in jobs)
        alone = [scorers[kind][True].score_jobs([job])[0].scores for job in jobs]
        diff = max(
            abs(a - b)
            for x, y in zip(results[False], results[True])
            for ra, rb in zip(x.scores, y.scores)
            for a, b in zip(ra, rb)
        )
        report["workloads"][name] = {
            "items": items,
            "default_items_per_s": items / best[False],
            "deterministic_items_per_s": items / best[True],
            "ratio": best[False] / best[True],
            "max_abs_diff": diff,
            "alone_equals_batched": all(r.scores == a for r, a in zip(results[True], alone)),
        }
        row = report["workloads"][name]
        print(
            f"{name:11s} default {row['default_items_per_s']:9.1f} items/s  deterministic "
            f"{row['deterministic_items_per_s']:9.1f} items/s  ratio {row['ratio']:.3f}  "
            f"max|diff| {diff:.1e}  alone == batched: {row['alone_equals_batched']}",
            flush=True,
        )
    return report


def main(argv: list[str] | None = None) -> None:
    parser = engine_parser("python -m kafka_scorer.bench.deterministic", __doc__)
    parser.add_argument("--workload", action="append", choices=DECODER_WORKLOADS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-batch-tokens", type=int, default=8192)
    args = parser.parse_args(argv)
    write_report(args, run(args))


if __name__ == "__main__":
    main()
