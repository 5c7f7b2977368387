"""The open-loop report as text: a markdown table that reads the same in a terminal and in the docs."""

from __future__ import annotations


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}"


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


_STEP_NAMES = {"warm_up_s": "its warm-up", "label_kernels_s": "label kernels", "cuda_graphs_s": "CUDA graphs"}


def _steps(steps: dict | None) -> str:
    """What the seconds to ready went to, as the worker logged them (CUDA adds the last two)."""
    parts = [f"{_STEP_NAMES[name]} {s:.1f} s" for name, s in (steps or {}).items() if s is not None]
    return f" ({', '.join(parts)})" if parts else ""


def format_open_loop_report(report: dict) -> str:
    meta = report["meta"]
    job = meta["job"]
    budget = f"{meta['budget']}" + ("" if meta["max_batch_tokens"] else " (the worker's default)")
    lines = [
        "open loop: Poisson arrivals through the embedded broker to `kafka-scorer worker` (its own process), "
        f"{meta['device_name']} ({meta['device']}, {meta['dtype']}), model shape {meta['model_shape']}, "
        f"budget {budget}, backend {meta['served_backend'] or meta['attention_backend'] or 'auto'}, "
        f"CUDA graphs {meta.get('served_cuda_graphs') or 'off'}",
        f"each request a fresh job: query {job['query_len']}, {job['num_items']} items x {job['item_len']} "
        f"tokens, labels {meta['labels']}, apply_softmax {str(job['apply_softmax']).lower()}; "
        f"{meta['seconds']:g} s of arrivals per rate; latency from produce to reply read",
        f"worker ready in {meta['worker_start_s']:.1f} s{_steps(meta.get('start_up_steps'))}; warm-up "
        f"{meta['warmup_jobs']} jobs in "
        f"{meta['warmup_s']:.1f} s (not counted); others: the CPU share other processes took meanwhile (the "
        "worker and the broker count as the bench's own)",
        "",
        "| requests/s | offered items/s | served items/s | p50 ms | p90 ms | p99 ms | max ms | errors "
        "| others |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    notes = []
    for r in report["rates"]:
        errors = "skipped" if r["skipped"] else str(r["errors"])
        lines.append(
            f"| {r['rate_rps']:g} | {_rate(r['offered_items_per_s'])} | {_rate(r['served_items_per_s'])} | "
            f"{_ms(r['p50_ms'])} | {_ms(r['p90_ms'])} | {_ms(r['p99_ms'])} | {_ms(r['max_ms'])} | {errors} | "
            f"{_share(r.get('others_cpu'))} |"
        )
        if r["first_error"]:
            notes.append(f"{r['rate_rps']:g}/s: {r['first_error']}")
        lag = r["client_lag_max_ms"]
        if lag is not None and lag > 10:
            notes.append(f"{r['rate_rps']:g}/s: the client fell up to {lag:.0f} ms behind its arrivals")
    lines.append("")
    best = report["best"]
    bound = meta["p99_bound_ms"]
    if best is None:
        lines.append(f"no rate kept p99 within {bound:g} ms without errors")
    else:
        lines.append(
            f"highest rate with p99 <= {bound:g} ms: {best['rate_rps']:g} requests/s "
            f"({best['served_items_per_s']:,.0f} items/s served, p99 {best['p99_ms']:,.0f} ms)"
        )
    lines += notes
    return "\n".join(lines)
