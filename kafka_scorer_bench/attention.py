"""`python -m kafka_scorer_bench.attention`: one layer's attention alone, every backend on the same input.

The whole-engine benches time a forward, where the projections hide what attention costs. Here each
backend (`engine/attention/registry.py`) attends the same random q/k/v of one layout, the model's head
counts, and its time is the fastest of `--repeats` calls after one untimed call (which builds, and on
CUDA compiles, what the backend needs); its metadata is built beforehand, as the packing thread does.
The layouts are the bench's shapes: rerank (4 jobs of a 256-token query and 32 items of 32), many-items
(512 + 200 × 16), SGLang's shape (4 requests of 120 + 10 × 180) and 64 plain pairs of 100 tokens. The
report gives milliseconds per call and each backend's largest difference from the dense path, the
reference. On the CPU flex and spans are left out (flex runs there uncompiled, spans is a CUDA kernel).
"""

from __future__ import annotations

import argparse

import torch

from kafka_scorer.engine.attention.layout import AttentionLayout
from kafka_scorer.engine.attention.registry import BACKENDS, attend, prepare_attention
from kafka_scorer.errors import first_line
from kafka_scorer_bench.engine_alone import engine_parser, resolve_run, write_report
from kafka_scorer_bench.probes import fastest_call

LAYOUTS = {
    "rerank": ((256, (32,) * 32), 4),
    "many-items": ((512, (16,) * 200), 1),
    "sglang": ((120, (180,) * 10), 4),
    "pairs": ((100, ()), 64),
}
"""Name -> ((query tokens, item lengths), sequences); a sequence without items is a plain pair."""
QUICK_LAYOUTS = {"rerank": ((24, (6,) * 4), 2), "pairs": ((20, ()), 4)}
CPU_SKIPS = ("flex", "spans", "deterministic-spans", "varlen")


def layout_of(sequence: tuple[int, tuple[int, ...]], count: int) -> AttentionLayout:
    prefix, items = sequence
    length = prefix + sum(items)
    starts = [n * length for n in range(count)]
    return AttentionLayout(starts, [length] * count, [prefix] * count, [items] * count)


def run(args: argparse.Namespace) -> dict:
    run_ = resolve_run(args, "attention")  # the device, dtype and shape rule of the engine-alone benches
    device, dtype, shape = torch.device(run_.device), getattr(torch, run_.dtype), run_.shape
    skips = CPU_SKIPS if device.type == "cpu" else ()
    backends = [name for name in args.backend or sorted(BACKENDS) if name not in skips]
    report: dict = {"device": run_.device, "dtype": run_.dtype, "shape": shape.name, "layouts": {}}
    for name, (sequence, count) in (QUICK_LAYOUTS if args.quick else LAYOUTS).items():
        layout = layout_of(sequence, count)
        q, k, v = (
            torch.randn(heads, layout.total_tokens, shape.head_dim, device=device, dtype=dtype)
            for heads in (shape.num_heads, shape.num_kv_heads, shape.num_kv_heads)
        )
        timings, errors = {}, {}
        for backend in backends:  # one backend failing at these shapes must not cost the others' figures
            try:
                timings[backend] = _time(q, k, v, layout, backend, args.repeats)
            except Exception as exc:
                errors[backend] = f"{type(exc).__name__}: {first_line(str(exc), 'no message')[:200]}"
                print(f"{name}: {backend} failed: {errors[backend]}", flush=True)
        if not timings:
            raise RuntimeError(f"every backend failed on {name}: {errors}")
        reference = timings.get("dense", next(iter(timings.values())))[1]
        report["layouts"][name] = {
            "tokens": layout.total_tokens,
            "errors": errors,
            "ms": {backend: seconds * 1e3 for backend, (seconds, _) in timings.items()},
            "max_abs_diff": {
                backend: float((out.float() - reference.float()).abs().max())
                for backend, (_, out) in timings.items()
            },
        }
        print(format_row(name, report["layouts"][name]), flush=True)
    return report


def _time(q, k, v, layout, backend: str, repeats: int) -> tuple[float, torch.Tensor]:
    metadata = prepare_attention(layout, backend, q.device.type == "cuda").to(q.device)
    scale = q.shape[-1] ** -0.5
    return fastest_call(lambda: attend(q, k, v, metadata, scale), q.device, repeats, warm=1)


def format_row(name: str, row: dict) -> str:
    times = "  ".join(f"{backend} {ms:8.1f} ms" for backend, ms in row["ms"].items())
    return f"{name:10s} {row['tokens']:6d} tokens  {times}"


def main(argv: list[str] | None = None) -> None:
    parser = engine_parser("python -m kafka_scorer_bench.attention", __doc__)
    parser.add_argument("--backend", action="append", choices=sorted(BACKENDS))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    write_report(args, run(args))


if __name__ == "__main__":
    main()
