"""Micro-benchmark: label scores from hidden states, fused paths vs full logits + `log_softmax` + gather.

Three ways to turn `[rows, hidden]` final hidden states into `[rows, labels]` scores, timed and
memory-profiled side by side on the same inputs:

- `baseline`: what a transformers user writes: `lm_head(h)` in the model dtype, `.float()`,
  `log_softmax` over the vocabulary, gather the labels.
- `logprobs` (`apply_softmax: false`): `label_logprobs`: streamed full-vocabulary log-sum-exp (Triton
  on CUDA, chunked torch on CPU) minus the label logits.
- `label_softmax` (`apply_softmax: true`): `label_logits` then a softmax over the labels only.

Peak memory is what the path allocates beyond its inputs: `torch.cuda.max_memory_allocated` on CUDA;
on CPU the torch profiler's allocation events, replayed in time order (timed runs are not profiled).

`python -m kafka_scorer_bench.label_kernel [--device cuda] [--json out.json]`; the `kafka-scorer bench`
harness calls `run_label_kernel_bench`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch

from kafka_scorer.engine.kernels.label_scores import label_logits, label_logprobs
from kafka_scorer_bench.report_file import write_report

# The shape (4,096 rows x 151,936 vocab) with Qwen3-0.6B's hidden size on both devices; the CPU
# takes fewer repeats (about two minutes on two cores, most of it the baseline's 4.7 GB of logits).
GPU_DEFAULTS = {"rows": 4096, "vocab": 151_936, "hidden": 1024, "repeats": 20, "dtype": "bfloat16"}
CPU_DEFAULTS = {"rows": 4096, "vocab": 151_936, "hidden": 1024, "repeats": 3, "dtype": "float32"}


@dataclass
class PathResult:
    name: str
    median_s: float
    min_s: float
    peak_bytes: int
    max_abs_diff: float  # against the baseline's scores (float32 log-probs or label softmax)


def run_label_kernel_bench(
    device: str | torch.device = "cpu",
    rows: int | None = None,
    vocab: int | None = None,
    hidden: int | None = None,
    labels: int = 2,
    repeats: int | None = None,
    dtype: str | None = None,
    seed: int = 0,
    verbose: bool = True,
) -> dict:
    """Time (round-robin, median of `repeats`) and profile the three paths on one set of inputs.

    Returns a JSON-ready dict: per-path median/min seconds, peak bytes and max |diff| against the
    baseline, plus the speed-up and memory ratios against the baseline.
    """
    device = torch.device(device)
    defaults = GPU_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS
    rows = rows or defaults["rows"]
    vocab = vocab or defaults["vocab"]
    hidden = hidden or defaults["hidden"]
    repeats = repeats or defaults["repeats"]
    torch_dtype = getattr(torch, dtype or defaults["dtype"])

    gen = torch.Generator(device="cpu").manual_seed(seed)
    h = torch.randn(rows, hidden, generator=gen).to(device, torch_dtype)
    w = (torch.randn(vocab, hidden, generator=gen) / hidden**0.5).to(device, torch_dtype)
    ids = torch.randint(0, vocab, (rows, labels), generator=gen).to(device)

    def baseline() -> torch.Tensor:
        logits = torch.nn.functional.linear(h, w)
        return torch.log_softmax(logits.float(), dim=-1).gather(1, ids)

    def logprobs() -> torch.Tensor:
        return label_logprobs(h, w, None, ids)

    def label_softmax() -> torch.Tensor:
        return torch.softmax(label_logits(h, w, None, ids), dim=-1)

    reference = baseline()
    expected = {"baseline": reference, "logprobs": reference, "label_softmax": torch.softmax(reference, -1)}
    del reference
    paths = {"baseline": baseline, "logprobs": logprobs, "label_softmax": label_softmax}
    diffs = {name: float((fn() - expected[name]).abs().max()) for name, fn in paths.items()}  # + warm-up
    times = _time_interleaved(paths, repeats, device)
    results = [
        PathResult(
            name=name,
            median_s=statistics.median(times[name]),
            min_s=min(times[name]),
            peak_bytes=_peak_bytes(fn, device),
            max_abs_diff=diffs[name],
        )
        for name, fn in paths.items()
    ]
    by_name = {r.name: r for r in results}
    base = by_name["baseline"]
    report = {
        "device": _device_name(device),
        "shape": {
            "rows": rows,
            "vocab": vocab,
            "hidden": hidden,
            "labels": labels,
            "dtype": str(torch_dtype),
        },
        "repeats": repeats,
        "paths": {r.name: asdict(r) for r in results},
        "speedup_vs_baseline": {r.name: base.median_s / r.median_s for r in results if r is not base},
        # Fastest-run ratio: on a shared machine the minimum is the run least disturbed by neighbours.
        "speedup_vs_baseline_min": {r.name: base.min_s / r.min_s for r in results if r is not base},
        "memory_ratio_vs_baseline": {
            r.name: base.peak_bytes / max(r.peak_bytes, 1) for r in results if r is not base
        },
        "baseline_logits_bytes": rows * vocab * 4,
    }
    if verbose:
        print(format_report(report))
    return report


def format_report(report: dict) -> str:
    shape = report["shape"]
    lines = [
        f"label kernel bench on {report['device']}: rows={shape['rows']} vocab={shape['vocab']} "
        f"hidden={shape['hidden']} labels={shape['labels']} {shape['dtype']}, {report['repeats']} repeats",
        f"{'path':<14}{'median ms':>11}{'min ms':>10}{'peak MiB':>10}{'speedup':>9}{'(min)':>9}"
        f"{'mem ratio':>11}{'max|diff|':>11}",
    ]
    for name, r in report["paths"].items():
        speed = report["speedup_vs_baseline"].get(name, 1.0)
        speed_min = report["speedup_vs_baseline_min"].get(name, 1.0)
        mem = report["memory_ratio_vs_baseline"].get(name, 1.0)
        lines.append(
            f"{name:<14}{r['median_s'] * 1e3:>11.2f}{r['min_s'] * 1e3:>10.2f}{r['peak_bytes'] / 2**20:>10.1f}"
            f"{speed:>8.2f}x{speed_min:>8.2f}x{mem:>10.1f}x{r['max_abs_diff']:>11.2e}"
        )
    return "\n".join(lines)


def peak_cpu_bytes(fn: Callable[[], object]) -> int:
    """Highest CPU bytes torch held at once while `fn` ran, counting only what `fn` allocated.

    CPU torch has no `max_memory_allocated`; the profiler's memory events (+bytes on alloc, -bytes on
    free, timestamped) replayed in order give the same number.
    """
    from torch.profiler import ProfilerActivity, profile

    with (
        _kineto_start_stop_lines_hidden(),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


@contextlib.contextmanager
def _kineto_start_stop_lines_hidden() -> Iterator[None]:
    """torch's profiler backend writes `USDT: ... profiler_start/stop` lines straight to file
    descriptor 2; in a benchmark report they are noise, so fd 2 points at /dev/null meanwhile.
    Python-level errors still propagate as exceptions."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    if device.type != "cuda":
        return peak_cpu_bytes(fn)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def _time_interleaved(
    paths: dict[str, Callable[[], object]], repeats: int, device: torch.device
) -> dict[str, list[float]]:
    """Round-robin over the paths, so a noisy neighbour slows all of them alike, not just one."""
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, fn in paths.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times[name].append(time.perf_counter() - start)
    return times


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", type=int)
    parser.add_argument("--vocab", type=int)
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--labels", type=int, default=2)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--json", help="also write the report to this file")
    args = parser.parse_args(argv)
    report = run_label_kernel_bench(
        args.device, args.rows, args.vocab, args.hidden, args.labels, args.repeats, args.dtype
    )
    if args.json:
        write_report(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
