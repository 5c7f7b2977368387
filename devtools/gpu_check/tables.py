"""Each `./dev gpu-check` step's section of gpu-check.md, from the JSON report the step wrote.

The tables come from the same formatters the bench commands print with, so the check's file and a
bench run read alike; the goals and the floor fractions are pulled out as markdown tables of their own.
"""

from __future__ import annotations

from typing import Any

TITLES = {
    "cuda-tier": "CUDA tier",
    "label-kernel": "Label kernel",
    "open-loop": "Open loop (SGLang's shape)",
    "graphs": "CUDA graphs on and off (SGLang's shape, engine alone)",
    "profile": "Where a served forward's time goes",
    "bench-0.6b": "Rerank and many-items, 0.6B",
    "floor-8b": "Many-items floor fraction, 8B",
    "deterministic": "What deterministic mode costs (engine alone)",
    "attention": "One layer's attention alone, every backend",
    "open-loop-best": "Open loop on the fastest correct attention backend (SGLang's shape)",
    "fixed-matmul": "Deterministic mode's projections, per block, batched or one Triton launch",
}


def step_markdown(outcome: Any) -> str:
    lines = [f"## {TITLES.get(outcome.name, outcome.name)}", ""]
    if outcome.name == "cuda-tier":
        lines.append(outcome.summary or f"{outcome.status}: {outcome.note}")
        lines += [f"- failed: `{name}`" for name in outcome.failures]
        return "\n".join(lines)
    report = outcome.report
    if report is None:
        return "\n".join([*lines, f"no report ({outcome.status}: {outcome.note or 'see its log'})"])
    lines += _partial(outcome, report)
    if outcome.name == "open-loop-best" and "skipped" in report:
        return "\n".join([*lines, f"not run: {report['skipped']}"])
    if outcome.name == "label-kernel":
        from kafka_scorer_bench.label_kernel import format_report

        lines += _text(format_report(report))
    elif outcome.name in ("open-loop", "open-loop-best"):
        from kafka_scorer_bench.open_loop_report import format_open_loop_report

        if "backend" in report:
            lines += [f"attention backend `{report['backend']}`: {report['why']}", ""]
        lines.append(format_open_loop_report(report["open-loop"]))
    elif outcome.name == "graphs":
        lines += _graph_table(report)
    elif outcome.name == "profile":
        from kafka_scorer_bench.profile_forward import format_profile

        lines.append(format_profile(report))
    elif outcome.name == "deterministic":
        lines += _determinism_table(report)
    elif outcome.name == "attention":
        lines += _attention_table(report)
    elif outcome.name == "fixed-matmul":
        from kafka_scorer_bench.fixed_matmul import format_table

        lines += format_table(report)
    else:
        lines += _bench_tables(report)
    return "\n".join(lines)


def _partial(outcome: Any, report: dict) -> list[str]:
    """The line over a report its step was killed before finishing (the benches rewrite theirs after
    each workload or rate): what it holds."""
    inner = report.get("open-loop", report)
    if not inner.get("partial"):
        return []
    if "rates" in inner:
        done = "the rates measured before it: " + ", ".join(f"{r['rate_rps']:g}/s" for r in inner["rates"])
    else:
        done = "the workloads finished before it: " + ", ".join(inner.get("workloads", {}))
    return [f"**partial** ({outcome.status}: {outcome.note}): {done}", ""]


def step_summary(outcome: Any) -> str:
    """One line for the status table: the figure each step is read for."""
    report = outcome.report
    if outcome.summary or report is None:
        return outcome.summary or outcome.note
    if outcome.name == "open-loop-best" and "skipped" in report:
        return f"not run: {report['skipped']}"
    if outcome.name in ("open-loop", "open-loop-best"):
        best, bound = report["open-loop"]["best"], report["open-loop"]["meta"]["p99_bound_ms"]
        if best is None:
            return f"no rate within p99 {bound:g} ms"
        return (
            f"best {best['rate_rps']:g} requests/s within p99 {bound:g} ms: "
            f"{best['served_items_per_s']:,.0f} items/s, p99 {best['p99_ms']:,.0f} ms"
        )
    if outcome.name == "profile":
        shares = ", ".join(f"{name} {share:.0%}" for name, share in report["categories"].items())
        return f"{report['ms_per_forward']:.1f} ms per forward: {shares}"
    if outcome.name == "graphs":
        ratios = ", ".join(f"{b['tokens']} tokens {b['ratio']:.2f}x" for b in report["batches"])
        return f"graphs off/on per forward: {ratios}"
    if outcome.name == "attention":
        fastest = {name: min(row["ms"], key=row["ms"].get) for name, row in report["layouts"].items()}
        return "fastest: " + ", ".join(f"{name} {backend}" for name, backend in fastest.items())
    if outcome.name == "deterministic":
        rows = report["workloads"]
        ratios = ", ".join(f"{name} {row['ratio']:.2f}" for name, row in rows.items())
        same = all(row["alone_equals_batched"] for row in rows.values())
        return f"deterministic / default: {ratios}; alone == batched: {'yes' if same else 'NO'}"
    if outcome.name == "fixed-matmul":
        rows = report["projections"].values()
        same = all(not row["batched_counts_differing"] for row in rows)
        per_block = sum(row["per_block_ms"] for row in rows)
        batched = sum(row["batched_ms"] for row in rows)
        summary = (
            f"batched blocks keep their bits at every count: {'yes' if same else 'NO'}; "
            f"per block / batched time {per_block / batched:.2f}x"
        )
        if all(row.get("triton_ms") is not None for row in rows):
            triton_same = all(not row["triton_counts_differing"] for row in rows)
            triton = sum(row["triton_ms"] for row in rows)
            summary += (
                f"; triton keeps them: {'yes' if triton_same else 'NO'}, per block / triton time "
                f"{per_block / triton:.2f}x"
            )
        return summary
    if "speedup_vs_baseline" in report:
        return (
            ", ".join(f"{k} {v:.1f}x" for k, v in report["speedup_vs_baseline"].items()) + " vs log_softmax"
        )
    if "workloads" in report:
        floors = [
            f"{key} floor {c['floor_fraction']:.2f}"
            for key, c in report["workloads"].get("many-items", {}).get("contenders", {}).items()
            if key.startswith("b:") and key != "b:steady"
        ]
        check = "cross-check ok" if report["ok"] else "cross-check FAILED"
        return "; ".join([check, *floors])
    return ""


def _text(block: str) -> list[str]:
    return ["```text", block, "```"]


def _graph_table(report: dict) -> list[str]:
    lines = [
        f"{report['device']}, {report['dtype']}, {report['shape']}: {report['graphs']}",
        "",
        "| requests | tokens | graphs off ms | graphs on ms | off / on | max diff |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for b in report["batches"]:
        lines.append(
            f"| {b['requests']} | {b['tokens']:,} | {b['off_ms']:.2f} | {b['on_ms']:.2f} | "
            f"{b['ratio']:.2f} | {b['max_abs_diff']:.1e} |"
        )
    return lines


def _attention_table(report: dict) -> list[str]:
    rows = report["layouts"].values()
    backends = list(dict.fromkeys(b for row in rows for b in [*row["ms"], *row.get("errors", {})]))
    lines = [
        f"{report['device']}, {report['dtype']}, {report['shape']} heads; ms per call (max diff vs dense)",
        "",
        "| layout | tokens | " + " | ".join(backends) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in backends) + " |",
    ]
    for name, row in report["layouts"].items():
        cells = [
            f"{row['ms'][b]:.2f} ({row['max_abs_diff'][b]:.0e})" if b in row["ms"] else "failed"
            for b in backends
        ]
        lines.append(f"| {name} | {row['tokens']:,} | " + " | ".join(cells) + " |")
    failures = {(b, error) for row in rows for b, error in row.get("errors", {}).items()}
    return lines + [f"- `{b}` failed: {error}" for b, error in sorted(failures)]


def _determinism_table(report: dict) -> list[str]:
    lines = [
        f"{report['device']}, {report['dtype']}, {report['shape']}",
        "",
        "| workload | default items/s | deterministic items/s | ratio | max diff | alone = batched "
        "| the mode's attention |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for name, row in report["workloads"].items():
        same = "yes" if row["alone_equals_batched"] else "NO"
        lines.append(
            f"| {name} | {row['default_items_per_s']:,.1f} | {row['deterministic_items_per_s']:,.1f} | "
            f"{row['ratio']:.2f} | {row['max_abs_diff']:.1e} | {same} | {row.get('attention', '?')} |"
        )
    return lines


def _bench_tables(report: dict) -> list[str]:
    from kafka_scorer_bench.report_text import format_report

    lines = [
        "| workload | contender | items/s | tok/s | floor | max diff vs (c) |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, workload in report["workloads"].items():
        for key, c in workload["contenders"].items():
            diff = c["max_abs_diff_vs_baseline"]
            lines.append(
                f"| {name} | {key} {c['label']} | {c['items_per_s']:,.1f} | {c['tokens_per_s']:,.0f} | "
                f"{c['floor_fraction']:.2f} | {'' if diff is None else f'{diff:.1e}'} |"
            )
    if report.get("targets") and not report["meta"].get("quick"):  # --quick goals are not judged
        lines += ["", "| goal | value | goal | verdict |", "| --- | ---: | ---: | --- |"]
        for t in report["targets"]:
            value = "?" if t["value"] is None else f"{t['value']:.2f}"
            verdict = "n/a" if t["met"] is None else ("met" if t["met"] else "NOT met")
            lines.append(f"| {t['target']} | {value} | >= {t['goal']:g} | {verdict} |")
    return [*lines, "", *_text(format_report(report))]
