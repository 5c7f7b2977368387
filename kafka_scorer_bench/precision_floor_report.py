"""The `bf16-floor` report as text: per kind, float32 and bfloat16 side by side, the GEMM probe above."""

from __future__ import annotations

from kafka_scorer_bench.report_text import fmt_load

HEADER = (
    f"{'contender':<22}{'fp32 items/s':>14}{'bf16 items/s':>14}{'fp32 tok/s':>12}{'bf16 tok/s':>12}"
    f"{'bf16/fp32':>11}{'floor':>7}{'bf16 vs fp32':>14}{'fp32 vs ref':>13}{'others':>10}"
)


def _gemm_line(gemm: dict) -> str:
    m, k, n = gemm["shape"]
    return (
        f"GEMM probe {m}×{k} @ {k}×{n}: float32 {gemm['float32'] / 1e9:,.1f} GFLOP/s, "
        f"bfloat16 {gemm['bfloat16'] / 1e9:,.1f} GFLOP/s, bf16/fp32 {gemm['ratio']:.2f}"
    )


def _row(name: str, c: dict) -> str:
    fp32, bf16 = c["float32"], c["bfloat16"]
    others = f"{fmt_load(fp32['foreign_cpu_load'])}/{fmt_load(bf16['foreign_cpu_load'])}"
    return (
        f"{name:<22}{fp32['items_per_s']:>14,.1f}{bf16['items_per_s']:>14,.1f}"
        f"{fp32['tokens_per_s']:>12,.0f}{bf16['tokens_per_s']:>12,.0f}{c['bf16_over_fp32']:>11.2f}"
        f"{c['floor_fraction']:>7.2f}{c['max_abs_diff_bf16_vs_fp32']:>14.1e}"
        f"{c['max_abs_diff_fp32_vs_reference']:>13.1e}{others:>10}"
    )


def format_precision_floor_report(report: dict) -> str:
    lines = [
        f"bf16 floor: {report['cpu']} (native bf16: {report['native_bf16'] or 'none'}), "
        f"{report['torch_threads']} threads; float32 and bfloat16 on the same jobs, "
        f"{report['repeats']} alternating rounds each, the fastest shown",
        "bf16/fp32: items/s ratio; floor: that ratio over the GEMM probe's bf16/fp32 ratio on the kind's "
        "own MLP matmul (1.0: all of the matmul's gain kept; goal 0.8)",
        "tok/s: the tokens the engine reads for the jobs, one numerator for every contender; bf16 vs fp32: "
        "max |diff| of the scores; fp32 vs ref: against the kind's reference contender in float32; "
        "others: CPU share other processes took (fp32/bf16)",
    ]
    for name, kind in report["kinds"].items():
        lines += [
            "",
            f"{name} ({kind['model']}): {kind['jobs']} jobs, {kind['items']} items, "
            f"{kind['tokens']:,} tokens; reference {kind['reference']}; {'ok' if kind['ok'] else 'FAILED'}",
            _gemm_line(kind["gemm"]),
            HEADER,
        ]
        for contender, c in kind["contenders"].items():
            lines.append(_row(contender, c))
            for dtype in ("float32", "bfloat16"):
                if c[dtype]["errors"]:
                    lines.append(f"  {dtype}: {c[dtype]['errors']} errors, first: {c[dtype]['first_error']}")
    return "\n".join(lines)
