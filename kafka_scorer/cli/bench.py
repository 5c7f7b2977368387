"""`kafka-scorer bench`: engine without and with MIS, the transformers baseline and the worker, one run.

Kept light at import (no torch): `kafka-scorer --help` imports every subcommand module.
"""

from __future__ import annotations

import argparse
import sys

from kafka_scorer.bench.report_file import write_report
from kafka_scorer.cli.bench_named import DEFAULT_BUDGET, NAMED_ONLY, budget
from kafka_scorer.cli.help_style import add_device_arguments

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
    "all",
)
"""`all`: the decoder workloads; these run only when named: `cross-encoder` (a real MiniLM cross-encoder
against sentence-transformers on the CPU, `bench/cross_encoder.py`), `backlog` (interactive jobs behind a
bulk backlog, priority lanes on and off, `bench/backlog.py`), `long-docs` (documents longer than a pair,
scored with `chunking`, `bench/long_docs.py`) and `judge` (the prefix cache on and off: a judge's rubric,
the rerank template, no shared prefix; `bench/prefix.py`), `open-loop` (Poisson arrivals at a list of
rates to `kafka-scorer worker` in its own process, latency percentiles per rate; `bench/open_loop.py`) and
`late-interaction` (a ColBERT reranker against sentence-transformers' MultiVectorEncoder, and its embedding
cache on and off; `bench/late_interaction.py`)."""
SHAPE_CHOICES = ("tiny", "cpu-small", "qwen3-0.6b", "qwen3-8b")
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
        "long-docs, judge and open-loop only when named)",
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
        "(default 2)",
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
    from kafka_scorer.bench.harness import BenchConfig, run_bench
    from kafka_scorer.bench.workloads import WORKLOADS

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


def _fmt_bytes(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _fmt_load(load: float | None) -> str:
    return "?" if load is None else f"{load:.0%}"


def _steady_line(w: dict) -> str:
    """How (d) and the engine beside it were timed, and the latency their figures leave out."""
    steady = w["steady"]
    parts = []
    for key in ("b:steady", "d"):
        span = w["contenders"].get(key, {}).get("steady")
        if span:
            loop = span.get("loop_cpu_us_per_job")
            parts.append(
                f"{key} {span['span_jobs']} jobs in {span['span_s']:.2f} s, "
                f"fill {span['fill_s']:.2f} s, drain {span['drain_s']:.2f} s"
                + ("" if loop is None else f", event loop CPU {loop:.0f} µs per job (worker and client)")
            )
        elif key in w["contenders"]:
            parts.append(f"{key} no steady span (whole run)")
    return (
        f"steady state (b:steady, d): {steady['jobs']} jobs (the workload cycled), window "
        f"{steady['window']}, timed from the first answer to the last answer before the last submission: "
        + "; ".join(parts)
    )


def _template_line(w: dict) -> str:
    """The template's shared part is computed once per job with MIS: the engine's own token counts."""
    t = w["template"]
    ran = "; ".join(
        f"{key} ran {c['forward_tokens'] / max(1, w['jobs']):,.0f}"
        for key, c in w["contenders"].items()
        if key == "a" or (key.startswith("b:") and key != "b:steady")
    )
    return (
        f"template {t['name']} (hash {t['hash']}), tokens per job: shared part {t['shared_tokens']:,.0f} "
        f"+ {t['items']:g} item parts {t['item_tokens']:,.0f}; MIS {t['mis_tokens']:,.0f} (shared part "
        f"once), no-MIS {t['no_mis_tokens']:,.0f} (once per item); {ran}"
    )


def format_report(report: dict) -> str:
    meta = report["meta"]
    peak = report["matmul_peak"]
    lines = [
        f"kafka-scorer bench: {meta['device_name']} ({meta['device']}, {meta['torch_threads']} threads), "
        f"{meta['dtype']}, model shape {meta['model_shape']['name']}, "
        f"budget {meta['max_batch_tokens']} tokens",
        f"matmul peak: {peak['flops_per_s'] / 1e9:,.1f} GFLOP/s ({peak['dtype']}, best mm of "
        f"{' x '.join(map(str, peak['shape']))}); "
        f"memory: {report['memory_method']}",
        "floor: compute floor / measured time; others: CPU share other processes used during the run "
        "(figures taken above a few % are disturbed); runs: timed runs, the fastest shown",
    ]
    header = (
        f"{'':11}{'contender':<32}{'items/s':>10}{'tok/s':>10}{'pair tok/s':>12}{'p50 s':>9}{'p99 s':>9}"
        f"{'peak mem':>11}{'floor':>7}{'max|diff|':>11}{'others':>8}{'runs':>6}"
    )
    for name, w in report["workloads"].items():
        spec = w["spec"]
        shape = spec["shape"]
        lines += [
            "",
            f"{name}: {w['jobs']} jobs × (query {shape['query_len']}, {shape['num_items']} items × "
            f"{shape['item_len']}), {w['items']} items, window {w['window']}",
            header,
        ]
        for key, c in w["contenders"].items():
            diff = c["max_abs_diff_vs_baseline"]
            lines.append(
                f"{key:<11}{c['label']:<32}{c['items_per_s']:>10,.1f}{c['tokens_per_s']:>10,.0f}"
                f"{c['pair_tokens_per_s']:>12,.0f}{c['latency_p50_s']:>9.3f}{c['latency_p99_s']:>9.3f}"
                f"{_fmt_bytes(c['peak_memory_bytes']):>11}{c['floor_fraction']:>7.2f}"
                f"{'' if diff is None else f'{diff:.1e}':>11}{_fmt_load(c['foreign_cpu_load']):>8}"
                f"{c['runs']:>6}"
            )
            if c["errors"]:
                lines.append(f"{'':11}{c['errors']} errors, first: {c['first_error']}")
        r = w["ratios"]
        parts = [f"token ratio a/b {r['token_ratio_a_over_b']:.2f}"]
        for b, v in r["b_over_a"].items():
            parts.append(f"b:{b}/a {v:.2f} ({r['b_over_a_vs_token_ratio'][b]:.2f} of token ratio)")
        for b, v in r["b_over_c"].items():
            parts.append(f"b:{b}/c {v:.2f}")
        if r.get("a_over_c") is not None:
            parts.append(f"a/c {r['a_over_c']:.2f}")
        for b, v in r.get("a_by_backend_over_c", {}).items():
            parts.append(f"a:{b}/c {v:.2f}")
        if r.get("fused_over_layers") is not None:
            parts.append(f"fused/HF layers {r['fused_over_layers']:.2f}")
        if r.get("compiled_over_eager") is not None:
            parts.append(f"compiled/eager layers {r['compiled_over_eager']:.2f}")
        if r.get("d_over_b") is not None:
            parts.append(f"d/b {r['d_over_b']:.2f}")
        lines.append("ratios (items/s): " + "; ".join(parts))
        if w.get("steady"):
            lines.append(_steady_line(w))
        if w.get("template"):
            lines.append(_template_line(w))
        check = w["cross_check"]
        lines.append(
            f"cross-check vs (c): max |diff| {check['max_abs_diff']:.2e} "
            f"(tolerance {check['tolerance']:.0e}), {check['errors']} errors: "
            + ("ok" if check["ok"] else "FAILED")
        )
    if report.get("targets") and report["meta"].get("quick"):
        lines += ["", "goals: not judged on a --quick run (tiny model and workloads); run without --quick"]
    elif report.get("targets"):
        lines += ["", "goals (measured value against the project's performance goal):"]
        for t in report["targets"]:
            verdict = "n/a" if t["met"] is None else ("met" if t["met"] else "NOT met")
            value = "?" if t["value"] is None else f"{t['value']:.2f}"
            note = f"  ({t['note']})" if t["note"] else ""
            lines.append(f"  {t['target']}: {value} (goal >= {t['goal']:g}): {verdict}{note}")
    kernel = report.get("label_kernel")
    if kernel:
        from kafka_scorer.bench.label_kernel import format_report as format_kernel

        lines += ["", format_kernel(kernel)]
    return "\n".join(lines)
