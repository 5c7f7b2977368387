"""`python -m kafka_scorer_bench.profile_forward`: where one served forward's device time goes.

Issue 24 was filed from such a profile (matmuls 22 %, unfused elementwise two thirds); this is the same
measurement as a command, so each GPU day starts from the current split instead of an old one. The
engine as served (the fused decoder, the chosen backend, the label heads) scores `--requests` fresh
requests of SGLang's shape (`open_loop.py`; with the default 8 about 15,000 tokens, one forward
within the CUDA budget, larger than the CUDA graphs' buckets so every kernel shows) under
`torch.profiler`, after a warm-up and an untimed pass. The report sums self time per kernel (CUDA) or per
operator (CPU) and groups it: matmuls, attention, elementwise (inductor's fused kernels and ATen's
unfused ones), copies, concatenations and gathers, the rest.
"""

from __future__ import annotations

import re

import torch

from kafka_scorer.engine.api import Scorer
from kafka_scorer.wire.protocol import Job
from kafka_scorer_bench.engine_alone import engine_parser, resolve_run, write_report
from kafka_scorer_bench.open_loop import QUICK_SHAPE, SGLANG_SHAPE, JobMaker

CATEGORIES = (
    ("attention", re.compile(r"flex|attention|sdpa|flash|triton_tem")),
    ("matmul", re.compile(r"gemm|cutlass|nvjet|xmma|cublas|^aten::(mm|addmm|bmm|linear|matmul)$")),
    (
        "elementwise",  # inductor's fused kernels, ATen's unfused ones on CUDA, the CPU's operators
        re.compile(
            r"^triton_(poi|red|per)|elementwise_kernel|reduce_kernel"
            r"|^aten::(mul|add|sub|div|silu|gelu|pow|mean|rsqrt|neg|exp|tanh|softmax|_to_copy|to)_?$"
        ),
    ),
    ("label head", re.compile(r"label")),
    ("copy / cat", re.compile(r"copy|memcpy|memset|cat\b|index")),
)
"""First match wins. `triton_tem` kernels here are FlexAttention's (the matmuls go to cuBLAS)."""


def category(name: str) -> str:
    lowered = name.lower()
    return next((label for label, pattern in CATEGORIES if pattern.search(lowered)), "other")


def run(args) -> dict:
    run_ = resolve_run(args, "profile")
    scorer = Scorer(str(run_.checkpoint()), dtype=run_.dtype, device=run_.device, prefix_cache_mb=0)
    scorer.engine.warm_up()
    shape = QUICK_SHAPE if args.quick else SGLANG_SHAPE
    maker = JobMaker(shape, 0, run_.shape.vocab_size)

    def jobs() -> list[Job]:
        return [maker.job(f"profile-{n}") for n in range(args.requests)]

    scorer.score_jobs(jobs())  # untimed: the same shapes once more before the profile
    cuda = scorer.describe().loaded.device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU]
    activities += [torch.profiler.ProfilerActivity.CUDA] if cuda else []
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(args.forwards):
            scorer.score_jobs(jobs())
        if cuda:
            torch.cuda.synchronize()
    rows = _rows(profile.key_averages(), cuda)
    total = sum(ms for _, ms, _ in rows) or 1.0
    shares: dict[str, float] = {}
    for name, ms, _ in rows:
        shares[category(name)] = shares.get(category(name), 0.0) + ms / total
    return {
        "device": run_.device,
        "dtype": run_.dtype,
        "shape": run_.shape.name,
        "backend": scorer.describe().attention_backend,
        "tokens_per_forward": args.requests * shape.tokens,
        "forwards": args.forwards,
        "ms_per_forward": total / args.forwards,
        "categories": dict(sorted(shares.items(), key=lambda item: -item[1])),
        "top": [
            {"name": name[:90], "ms": ms, "calls": calls, "share": ms / total, "category": category(name)}
            for name, ms, calls in rows[: args.top]
        ],
    }


def _rows(events, cuda: bool) -> list[tuple[str, float, int]]:
    """(name, self milliseconds, calls), largest first: device kernels on CUDA, operators on the CPU."""
    rows = []
    for event in events:
        micros = event.self_device_time_total if cuda else event.self_cpu_time_total
        if cuda and getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        if micros > 0:
            rows.append((event.key, micros / 1000, int(event.count)))
    return sorted(rows, key=lambda row: -row[1])


def format_profile(report: dict) -> str:
    lines = [
        f"{report['device']}, {report['dtype']}, {report['shape']}, backend {report['backend']}: "
        f"{report['tokens_per_forward']:,} tokens per forward, {report['ms_per_forward']:.2f} ms of "
        f"{'device' if report['device'].startswith('cuda') else 'CPU'} time each",
        "",
        "| category | share |",
        "| --- | ---: |",
        *(f"| {name} | {share:.1%} |" for name, share in report["categories"].items()),
        "",
        "| kernel / operator | category | ms | calls | share |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for row in report["top"]:
        name = row["name"].replace("|", "/")
        lines.append(
            f"| `{name}` | {row['category']} | {row['ms']:.2f} | {row['calls']} | {row['share']:.1%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = engine_parser("python -m kafka_scorer_bench.profile_forward", __doc__)
    parser.add_argument("--requests", type=int, default=8, help="requests of SGLang's shape per forward")
    parser.add_argument("--forwards", type=int, default=3, help="forwards profiled")
    parser.add_argument("--top", type=int, default=20, help="kernels listed")
    args = parser.parse_args(argv)
    report = run(args)
    print(format_profile(report), flush=True)
    write_report(args, report)


if __name__ == "__main__":
    main()
