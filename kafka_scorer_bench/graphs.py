"""`python -m kafka_scorer_bench.graphs`: what CUDA graphs gain per forward, the engine alone.

Requests of SGLang's shape (`open_loop.py`: a 120-token query, 10 items of 180, fresh ids per
request, so no prefix is cached) scored in batches of 1, 2 and 4 requests (and one lone item) by two
Scorers of one checkpoint: graphs off (`cuda_graph_tokens=0`) and on (the setting's value). Runs
alternate between the two; the median of `--repeats` is kept per batch size. The report gives
milliseconds per batch for each and the ratio (off / on: above 1 means the graphs are faster), and the
largest score difference between the two. Off CUDA the "on" Scorer runs the padded static buffers
without a capture (what the CPU tier checks), so the CPU ratio is the padding's cost, not a graph's gain.
"""

from __future__ import annotations

import argparse
import statistics

from kafka_scorer.engine.api import Scorer
from kafka_scorer_bench.engine_alone import engine_parser, resolve_run, timed, write_report
from kafka_scorer_bench.open_loop import QUICK_SHAPE, SGLANG_SHAPE, JobMaker

BATCHES = ((1, 1), (1, None), (2, None), (4, None))
"""(requests, items per request: None = the shape's) per measured batch; the first is one lone item."""


def run(args: argparse.Namespace) -> dict:
    run_ = resolve_run(args, "graphs")
    device, dtype, shape = run_.device, run_.dtype, run_.shape
    path = run_.checkpoint()
    job_shape = QUICK_SHAPE if args.quick else SGLANG_SHAPE
    budget = max(args.graph_tokens, job_shape.tokens * max(r for r, _ in BATCHES))
    scorers = {
        tokens: Scorer(
            str(path),
            dtype=dtype,
            device=device,
            max_batch_tokens=budget,
            prefix_cache_mb=0,
            attention_backend="flex",  # auto on CUDA; on the CPU the graphs' backend, run eagerly
            cuda_graph_tokens=tokens,
        )
        for tokens in (0, args.graph_tokens)
    }
    for scorer in scorers.values():
        scorer.engine.warm_up()
    on = scorers[args.graph_tokens]
    report = {
        "device": device,
        "dtype": dtype,
        "shape": shape.name,
        "graphs": on.describe().fields["cuda_graphs"],
    }
    maker = JobMaker(job_shape, 0, shape.vocab_size)
    report["batches"] = [_measure(scorers, maker, batch, args) for batch in BATCHES]
    return report


def _measure(scorers: dict[int, Scorer], maker: JobMaker, batch, args) -> dict:
    requests, items = batch
    seconds: dict[int, list[float]] = {tokens: [] for tokens in scorers}
    worst = 0.0
    for _ in range(args.repeats):
        jobs = [maker.job(f"graphs-{n}", items) for n in range(requests)]
        results = {}
        for tokens, scorer in scorers.items():
            elapsed, results[tokens] = timed(scorer, jobs)
            seconds[tokens].append(elapsed)
        off, on = results.values()
        worst = max(
            [worst]
            + [
                abs(a - b)
                for x, y in zip(off, on)
                for ra, rb in zip(x.scores, y.scores)
                for a, b in zip(ra, rb)
            ]
        )
    off_ms, on_ms = (1000 * statistics.median(s) for s in seconds.values())
    job = maker.shape
    tokens = requests * (job.query_len + (items or job.num_items) * job.item_len)
    row = {
        "requests": requests,
        "tokens": tokens,
        "off_ms": off_ms,
        "on_ms": on_ms,
        "ratio": off_ms / on_ms,
        "max_abs_diff": worst,
    }
    print(
        f"{requests} request(s), {tokens:6d} tokens: graphs off {off_ms:8.2f} ms  on {on_ms:8.2f} ms  "
        f"ratio {row['ratio']:.3f}  max|diff| {worst:.1e}",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> None:
    parser = engine_parser("python -m kafka_scorer_bench.graphs", __doc__)
    parser.add_argument("--graph-tokens", type=int, default=8192, help="cuda_graph_tokens of the 'on' Scorer")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    write_report(args, run(args))


if __name__ == "__main__":
    main()
