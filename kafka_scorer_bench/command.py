"""`kafka-scorer bench`: engine without and with MIS, the transformers baseline and the worker, one run.

Kept light at import (no torch): `kafka-scorer --help` imports every subcommand module.
"""

from __future__ import annotations

import argparse
import sys

from kafka_scorer.cli.help_style import add_device_arguments
from kafka_scorer_bench.named import DEFAULT_BUDGET, NAMED_ONLY, budget
from kafka_scorer_bench.report_file import write_report
from kafka_scorer_bench.report_text import format_report

WORKLOAD_CHOICES = (
    "rerank",
    "many-items",
    "short",
    "mixed",
    "cross-encoder",
    "backlog",
    "long-docs",
    "judge",
    "open-loop",
    "late-interaction",
    "images",
    "bf16-floor",
    "listwise",
    "all",
)
"""`all`: the decoder workloads; these run only when named: `cross-encoder` (a real MiniLM cross-encoder
against sentence-transformers on the CPU, `cross_encoder.py`), `backlog` (interactive jobs behind a
bulk backlog, priority lanes on and off, `backlog.py`), `long-docs` (documents longer than a pair,
scored with `chunking`, `long_docs.py`) and `judge` (the prefix cache on and off: a judge's rubric,
the rerank template, no shared prefix; `prefix.py`), `open-loop` (Poisson arrivals at a list of
rates to `kafka-scorer worker` in its own process, latency percentiles per rate; `open_loop.py`) and
`late-interaction` (a ColBERT reranker against sentence-transformers' MultiVectorEncoder, and its embedding
cache on and off; `late_interaction.py`), `images` (a Qwen3-VL reranker over photo documents:
MIS, pairs and transformers pair by pair; `images.py`), `bf16-floor` (the cross-encoder, rerank and
late-interaction kinds in float32 and bfloat16 side by side on the CPU, each against the GEMM probe's
bf16/fp32 ratio on its own matmul shape; `precision_floor.py`) and `listwise` (a jina-reranker-v3-layout
model against the transformers reference one job at a time and against pointwise MIS on a body of the
same size; `listwise.py`)."""
SHAPE_CHOICES = ("tiny", "cpu-small", "qwen3-0.6b", "qwen3-8b", "qwen3.5-tiny", "qwen3.5-cpu-small")
BACKEND_CHOICES = ("dense", "cascade", "flex", "spans", "varlen", "all")


CONTENDERS_HELP = (
    "Contenders, each scoring the same jobs: (a) this engine with multi-item scoring (MIS) off, one "
    "sequence per query-item pair; (b) this engine with MIS on, one packed sequence per job, once per "
    "attention backend (b:dense, b:cascade, b:flex, b:spans), and b:steady on the steady stream beside (d); "
    "(c) the plain transformers baseline, padded pairs in batches, whose scores every other contender "
    "must match (the cross-check); (d) the whole worker, jobs produced to an embedded broker and "
    "results read back. Columns: floor is the compute floor (the model's FLOPs at the measured matmul "
    "peak) divided by the measured time, 1.0 being the hardware's limit; others is the CPU share other "
    "processes used meanwhile (a few percent or more: the figures are disturbed); runs is the number of "
    "timed runs, the fastest shown. The goals at the end compare contenders by name, e.g. MIS engine "
    "vs. transformers baseline."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = CONTENDERS_HELP
    add_device_arguments(parser)
    parser.add_argument(
        "--workload",
        action="append",
        choices=WORKLOAD_CHOICES,
        help="repeat to pick several (default: all, the decoder workloads; cross-encoder, backlog, "
        "long-docs, judge, open-loop, late-interaction, images, bf16-floor and listwise only when named)",
    )
    parser.add_argument(
        "--model-shape",
        choices=SHAPE_CHOICES,
        help="random-initialised model shape "
        "(default: qwen3-0.6b on CUDA, cpu-small on CPU, tiny with --quick)",
    )
    parser.add_argument(
        "--backend",
        action="append",
        choices=BACKEND_CHOICES,
        help="MIS attention backend(s) for (b); repeat for several (default: all that apply to the device)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny model and workloads: proves every contender runs and agrees (about a minute on two CPU "
        "cores); its figures measure nothing, so its goals are not judged",
    )
    parser.add_argument("--skip-worker", action="store_true", help="leave out (d), the worker via a broker")
    parser.add_argument(
        "--skip-label-kernel", action="store_true", help="leave out the label-kernel micro-benchmark"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="jobs per workload (default: per workload and device); cross-encoder: queries of 100 documents "
        "(default 2); bf16-floor: queries of 100 documents for its encoder kinds, rerank jobs "
        "(default 1, 2); listwise: jobs of 32 documents (default 4)",
    )
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        metavar="N",
        help=f"token budget of one forward (default: {DEFAULT_BUDGET}; open-loop: the worker's own default)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        metavar="N",
        help="most timed runs per contender, the fastest reported",
    )
    parser.add_argument(
        "--repeat-budget",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="no further timed run once a contender's runs took this long",
    )
    parser.add_argument(
        "--steady-seconds",
        type=float,
        metavar="SECONDS",
        help="engine time that (d)'s stream is sized for between its fill and drain, timed as the steady "
        "state; engine and worker take two turns each (default: 10; 0.25 with --quick)",
    )
    parser.add_argument(
        "--template",
        metavar="PRESET_OR_FILE",
        default="",
        help="serve the causal model with this prompt template (qwen3-reranker) and send the rerank "
        "workload as text, reporting the tokens MIS and no-MIS run per job (default: none, token ids)",
    )
    parser.add_argument(
        "--decoder-forward",
        choices=["auto", "fused", "compiled", "transformers"],
        default="auto",
        help="the engine's decoder layers: auto (fused; compiled on CUDA), or transformers' own for the "
        "before/after ratio (default: auto)",
    )
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="workload seed")
    parser.add_argument(
        "--model-dir",
        metavar="PATH",
        help="keep generated checkpoints here and reuse them (default: a temporary directory)",
    )
    parser.add_argument(
        "--json", metavar="PATH", help="also write the full report as JSON (default: not written)"
    )
    parser.add_argument(
        "--rates",
        type=_rates,
        metavar="R,R,...",
        help="open-loop: request rates (requests/s, each of 10 items by default) to offer, lowest first "
        "(default: 25,50,100,150,200,300,400 on CUDA, 0.1,0.2,0.3,0.4 on the CPU, 4,8 with --quick)",
    )
    parser.add_argument(
        "--rate-seconds",
        type=float,
        metavar="SECONDS",
        help="open-loop: seconds of arrivals per rate (default: 10 on CUDA, 30 on the CPU, 1.5 with --quick)",
    )
    parser.add_argument(
        "--cuda-graph-tokens",
        type=int,
        metavar="N",
        help="open-loop: the worker's cuda_graph_tokens (0: no CUDA graphs; default: the worker's own)",
    )
    parser.add_argument(
        "--p99-bound-ms",
        type=float,
        default=300.0,
        metavar="MS",
        help="open-loop: the report names the highest rate whose p99 latency stays within this "
        "(default: 300)",
    )


def _rates(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        rates = ()
    if not rates or any(not r > 0 for r in rates):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give positive request rates separated by commas, e.g. 10,20,40"
        )
    return rates


def run(args: argparse.Namespace) -> int:
    from kafka_scorer.cli.no_triton import keep_triton_out_on_cpu

    keep_triton_out_on_cpu(args.device)  # before any model module: no triton leak report at exit on a CPU
    from kafka_scorer_bench.harness import BenchConfig, run_bench
    from kafka_scorer_bench.workloads import WORKLOADS

    workloads = tuple(args.workload or ["all"])
    for name, runner in NAMED_ONLY.items():  # each its own report; the decoder workloads after them
        if name in workloads:
            code = runner(args)
            workloads = tuple(w for w in workloads if w != name)
            if not workloads or code:
                return code
    backends = tuple(args.backend or ["all"])
    config = BenchConfig(
        device=args.device,
        dtype=args.dtype,
        workloads=WORKLOADS if "all" in workloads else tuple(dict.fromkeys(workloads)),
        model_shape=args.model_shape,
        backends=None if "all" in backends else tuple(dict.fromkeys(backends)),
        quick=args.quick,
        skip_worker=args.skip_worker,
        skip_label_kernel=args.skip_label_kernel,
        max_batch_tokens=budget(args),
        num_jobs=args.jobs,
        repeats=max(1, args.repeats),
        repeat_budget_s=args.repeat_budget,
        steady_seconds=args.steady_seconds,
        seed=args.seed,
        model_dir=args.model_dir,
        template=args.template,
        decoder_forward=args.decoder_forward,
    )
    report = run_bench(config, (lambda partial: write_report(args.json, partial)) if args.json else None)
    print()
    print(format_report(report))
    if args.json:
        write_report(args.json, report)
    if not report["ok"]:
        print("cross-check FAILED: some contender's scores disagree with the baseline", file=sys.stderr)
        return 1
    return 0
