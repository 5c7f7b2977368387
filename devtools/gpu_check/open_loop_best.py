"""gpu-check's `open-loop-best` step: the serving table again on the attention the GPU found fastest.

The `open-loop` step measures the worker as it is deployed (`auto`: flex on CUDA). The opt-in kernels
(`spans`, `varlen`) are built to compute fewer of the scores the MIS mask drops, but their speed is
unmeasured, and a GPU is lent rarely: so the same session that times one layer's attention per
backend (the `attention` step) also measures, unattended, what the fastest correct one does to the
table users compare us by. "Correct" is the attention step's own check: within `TOLERANCE` of the
dense reference on the same inputs. Nothing runs when flex is fastest (the `open-loop` step has that
table) or when the attention step left no report.

    python -m devtools.gpu_check.open_loop_best --attention-json attention.json -- BENCH ARGS...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kafka_scorer_bench.report_file import write_report

CANDIDATES = ("flex", "spans", "varlen")
"""The backends a serving worker could use on CUDA (the cascade is flex's fallback, dense the reference)."""
TOLERANCE = 6e-2
"""Largest |difference| from dense allowed in 16-bit activations: the bench's own cross-check bound."""
LAYOUTS = ("sglang", "rerank")
"""The attention step's layout read, first present: SGLang's shape on the GPU, rerank at `--quick`."""


def best_backend(report: dict) -> tuple[str | None, str]:
    """(the fastest correct candidate or None, why) from an attention step's report."""
    layout = next((name for name in LAYOUTS if name in report.get("layouts", {})), None)
    if layout is None:
        return None, "the attention report has no SGLang-shaped layout"
    row = report["layouts"][layout]
    timed = {name: ms for name, ms in row["ms"].items() if name in CANDIDATES}
    correct = {name: ms for name, ms in timed.items() if row["max_abs_diff"][name] <= TOLERANCE}
    wrong = sorted(set(timed) - set(correct))
    if not correct:
        return None, f"no candidate timed within {TOLERANCE:g} of dense on {layout} (wrong: {wrong})"
    best = min(correct, key=correct.get)
    times = ", ".join(f"{name} {ms:.2f} ms" for name, ms in sorted(correct.items(), key=lambda x: x[1]))
    return best, f"fastest on {layout}: {times}" + (f"; outside the tolerance: {wrong}" if wrong else "")


def run(attention_json: Path, bench_args: list[str], out_json: Path | None) -> int:
    from kafka_scorer.cli import main as cli_main

    report = json.loads(attention_json.read_text()) if attention_json.is_file() else None
    best, why = best_backend(report) if report is not None else (None, f"no {attention_json}")
    print(f"open-loop-best: {why}", flush=True)
    if best is None or best == "flex":
        reason = why if best is None else f"flex is fastest ({why}): the open-loop step measured it"
        if out_json is not None:
            write_report(out_json, {"skipped": reason, "backend": best})
        print(f"open-loop-best: nothing to run: {reason}", flush=True)
        return 0
    args = [*bench_args, "--backend", best]
    if out_json is not None:
        args += ["--json", str(out_json)]
    code = cli_main(args)
    if out_json is not None and out_json.is_file():
        payload = json.loads(out_json.read_text())
        write_report(out_json, {**payload, "backend": best, "why": why})
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.gpu_check.open_loop_best", description=__doc__)
    parser.add_argument("--attention-json", type=Path, required=True, help="the attention step's report")
    parser.add_argument("--json", type=Path, help="where the open-loop report (or the skip) goes")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- then `kafka-scorer` arguments")
    args = parser.parse_args(argv)
    bench = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    return run(args.attention_json, bench, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
