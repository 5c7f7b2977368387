"""The text table `kafka-scorer bench` prints for the decoder workloads (and gpu-check quotes).

It lives with the bench, not the command line: the GPU check's tables and the command both print it, and
the bench must not import the CLI (the CLI is the layer above it)."""

from __future__ import annotations


def _fmt_bytes(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def fmt_load(load: float | None) -> str:
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
                f"{'' if diff is None else f'{diff:.1e}':>11}{fmt_load(c['foreign_cpu_load']):>8}"
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
        from kafka_scorer_bench.label_kernel import format_report as format_kernel

        lines += ["", format_kernel(kernel)]
    return "\n".join(lines)
