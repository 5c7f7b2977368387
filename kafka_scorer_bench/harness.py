"""The benchmark: the same jobs through every contender, in one process and one run, side by side.

Contenders:
- (a) our engine with MIS off (`multi_item: false`): every item is its own `query + item` pair;
- (b) our engine with MIS on, once per attention backend (`b:dense`, `b:cascade`, ...);
- (c) the transformers baseline (`baseline.py`): padded pairs, full logits, log_softmax;
- (d) the full worker through a real Kafka-protocol broker (embedded tansu), same scorer in-process,
  timed in steady state against the engine on the same long stream (`b:steady`, `steady.py`).

This module is the run's order of events: build or load the models, measure the matmul peak, then per
workload time every contender, summarise and cross-check them, and finally judge the targets. Where
each step happens:
- `contenders.py`: (a), (b), (c) and the closed-loop client that times them (warm-up slice, window);
- `worker_contender.py`: (d), the worker and a closed-loop Kafka client;
- `steady.py`: (d)'s stream, sized from (b)'s measured time per job, and its steady span;
- `probes.py`: peak memory a run adds and the CPU other processes took meanwhile;
- `matmul_peak.py`: the peak FLOP rate the compute floor is measured against;
- `summary.py`: figures per contender and the cross-check of every score against (c);
- `targets.py`: the issue's targets, measured against their goals.
"""

from __future__ import annotations

import contextlib
import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kafka_scorer.engine.api import layer_choices
from kafka_scorer.wire.protocol import Job
from kafka_scorer_bench.contenders import (
    BaselineContender,
    Contender,
    EngineContender,
    drive,
    warmup_jobs,
    window_for,
)
from kafka_scorer_bench.environment import Environment
from kafka_scorer_bench.matmul_peak import measure_matmul_peak
from kafka_scorer_bench.models import SHAPES, ModelShape
from kafka_scorer_bench.probes import RunProbe, cpu_model
from kafka_scorer_bench.records import RunRecord, repeated
from kafka_scorer_bench.steady import MAX_JOBS, QUICK_MAX_JOBS, ROUNDS, steadiest, steady_stream
from kafka_scorer_bench.summary import (
    EAGER,
    LAYERS,
    STEADY_ENGINE,
    cross_check,
    max_abs_diff,
    ratios,
    summarise,
    summarise_steady,
)
from kafka_scorer_bench.targets import evaluate_targets
from kafka_scorer_bench.worker_contender import run_worker_contender
from kafka_scorer_bench.workloads import WORKLOADS, Workload, build_workload, with_multi_item, workload_spec


@dataclass
class BenchConfig:
    device: str = "auto"
    dtype: str = "auto"
    workloads: tuple[str, ...] = WORKLOADS
    model_shape: str | None = None
    """None: cpu-small on CPU, qwen3-0.6b on CUDA."""
    backends: tuple[str, ...] | None = None
    """MIS attention backends for (b); None: every backend that applies to the device."""
    quick: bool = False
    skip_worker: bool = False
    skip_label_kernel: bool = False
    max_batch_tokens: int = 8192
    num_jobs: int | None = None
    repeats: int = 3
    """Most timed runs per contender; the fastest is reported (noise on a shared machine only slows)."""
    repeat_budget_s: float = 15.0
    """No further run once a contender's timed runs took this long: a slow contender runs once."""
    steady_seconds: float | None = None
    """Engine time the steady stream of (d) is sized for, between its fill and drain (`steady.py`);
    None: 10 s (engine and worker take two turns each), or 0.25 s with `quick`."""
    seed: int = 0
    model_dir: str | None = None
    """Where to keep the generated checkpoints between runs; None: a temp dir removed at the end."""
    template: str = ""
    decoder_forward: str = "auto"
    """The engine's decoder layers (`--decoder-forward`): its fused ones, or transformers' for the ratio."""
    """A prompt template for the causal scorer (`--template`): the rerank workload is then sent as text
    (`templated.py`) and reports the template's token counts."""
    verbose: bool = True


def _steady_seconds(config: BenchConfig) -> float:
    if config.steady_seconds is not None:
        return config.steady_seconds
    return 0.25 if config.quick else 10.0


PAIR_KERNELS = ("varlen",)
"""Backends that also get an (a) of their own when measured: pairs are where flash's varlen kernel,
which walks each sequence's own keys, should beat FlexAttention's 128-token blocks most (a 16-token
pair fills an eighth of its block), and the default backend's (a) alone cannot say whether serving
pairs through it would pay. (spans is built for MIS items; one more (a) would cost the GPU check's
bench step another minute.)"""


def default_backends(device: torch.device) -> tuple[str, ...]:
    """FlexAttention compiles on CUDA only; on CPU it would run its eager reference (not a contender), and
    the spans and varlen kernels need CUDA (on the CPU they are the dense path and a loop of runs)."""
    from kafka_scorer.engine.api import BACKENDS

    on_cuda = ("dense", "cascade", "flex", "spans", "varlen")
    wanted = on_cuda if device.type == "cuda" else ("dense", "cascade")
    return tuple(b for b in wanted if b in BACKENDS)


def run_workload(
    env: Environment, workload: Workload, config: BenchConfig, backends: Sequence[str], log: Callable
) -> dict:
    kind = workload.spec.model_kind
    scorer = env.scorer(kind, config.max_batch_tokens)
    baseline = env.baseline(kind)
    window = window_for(workload, config.max_batch_tokens)
    no_mis = with_multi_item(workload.requests, False)
    mis = with_multi_item(workload.requests, True)
    peak_flops = env.peak["flops_per_s"]

    def timed(make: Callable[[], Contender], jobs: list[Job]) -> RunRecord:
        drive(make(), warmup_jobs(jobs), window, env.probe)
        return repeated(
            lambda _: drive(make(), jobs, window, env.probe), config.repeats, config.repeat_budget_s
        )

    runs: dict[str, tuple[str, RunRecord]] = {}
    default_backend = scorer.describe().attention_backend
    log("  (c) baseline ...")
    runs["c"] = (
        "transformers baseline",
        timed(
            lambda: BaselineContender(baseline, config.max_batch_tokens),
            with_multi_item(workload.jobs, False),
        ),
    )
    log(f"  (a) engine, MIS off [{default_backend}] ...")
    runs["a"] = (
        f"engine, MIS off [{default_backend}]",
        timed(lambda: EngineContender(scorer, None), no_mis),
    )
    for backend in PAIR_KERNELS:  # pairs through the kernels that walk each sequence's own keys
        if backend in backends and backend != default_backend:
            log(f"  (a) engine, MIS off [{backend}] ...")
            runs[f"a:{backend}"] = (
                f"engine, MIS off [{backend}]",
                timed(lambda backend=backend: EngineContender(scorer, backend), no_mis),
            )
    for backend in backends:
        log(f"  (b) engine, MIS on [{backend}] ...")
        runs[f"b:{backend}"] = (
            f"engine, MIS on [{backend}]",
            timed(lambda backend=backend: EngineContender(scorer, backend), mis),
        )
    choices = {layers.value for layers in layer_choices(scorer.describe().loaded)}
    if "transformers" in choices:  # the fused layers against transformers' own, same Scorer and backend
        log(f"  (b) engine, MIS on, transformers' layers [{default_backend}] ...")
        runs[LAYERS] = (
            f"MIS on, HF layers [{default_backend}]",
            timed(lambda: EngineContender(scorer, None, "transformers"), mis),
        )
    if "eager" in choices:  # what compiling the fused layers buys: the same layers run eagerly
        log(f"  (b) engine, MIS on, fused layers eager [{default_backend}] ...")
        runs[EAGER] = (
            f"MIS on, eager layers [{default_backend}]",
            timed(lambda: EngineContender(scorer, None, "eager"), mis),
        )
    stream = None
    if not config.skip_worker:
        measured = runs.get(f"b:{default_backend}", runs[f"b:{backends[0]}"])[1]
        stream = steady_stream(
            mis,
            measured.wall_s / len(mis),
            window,
            _steady_seconds(config),
            QUICK_MAX_JOBS if config.quick else MAX_JOBS,
        )
        log(
            f"  steady stream: {len(stream.jobs)} jobs (the workload cycled), window {stream.window}, "
            f"~{stream.seconds:g} s of engine time between fill and drain"
        )
        drive(EngineContender(scorer, None), warmup_jobs(stream.jobs), stream.window, env.probe)
        engine_runs, worker_runs = [], []
        for turn in range(ROUNDS):
            log(f"  (b) engine on the steady stream [{default_backend}], turn {turn + 1} of {ROUNDS} ...")
            engine_runs.append(drive(EngineContender(scorer, None), stream.jobs, stream.window, env.probe))
            log(f"  (d) worker through the broker on the steady stream, turn {turn + 1} of {ROUNDS} ...")
            worker_runs.append(
                run_worker_contender(scorer, stream.jobs, stream.window, env.probe, quick=config.quick)
            )
        runs[STEADY_ENGINE] = (
            f"engine, steady stream [{default_backend}]",
            steadiest(engine_runs, stream.jobs),
        )
        runs["d"] = (f"worker via broker [{default_backend}]", steadiest(worker_runs, stream.jobs))

    reference = runs["c"][1].scores
    steady_workload = Workload(workload.spec, stream.jobs) if stream else workload
    if stream and workload.sent is not None:  # the stream cycles the text jobs: count on their token view
        steady_workload = Workload(
            workload.spec, [workload.jobs[k % len(workload.jobs)] for k in range(len(stream.jobs))]
        )
    contenders = {}
    for key, (label, record) in runs.items():
        if key in (STEADY_ENGINE, "d"):
            summary = summarise_steady(label, record, steady_workload, env.shape, peak_flops)
            want = [reference[k % len(reference)] for k in range(len(record.scores))]
        else:
            summary = summarise(label, record, workload, env.shape, peak_flops)
            want = reference
        if key != "c":
            summary.max_abs_diff_vs_baseline = max_abs_diff(record.scores, want)
        contenders[key] = asdict(summary)

    return {
        "spec": asdict(workload.spec),
        "jobs": len(workload.jobs),
        "items": workload.num_items,
        "pair_tokens": workload.pair_tokens,
        "packed_tokens": workload.packed_tokens,
        "template": _template_tokens(workload, scorer),
        "window": window,
        "steady": None
        if stream is None
        else {
            "jobs": len(stream.jobs),
            "window": stream.window,
            "seconds": stream.seconds,
            "engine_per_job_s": stream.per_job_s,
        },
        "contenders": contenders,
        "ratios": ratios(contenders, backends, default_backend),
        "cross_check": cross_check(contenders, env.dtype),
    }


def _template_tokens(workload: Workload, scorer) -> dict | None:
    """Per job, the tokens MIS and no-MIS compute under the template (None: the jobs are not text)."""
    template = scorer.describe().kind.served.template
    if workload.sent is None or template is None:
        return None
    from kafka_scorer_bench.templated import template_tokens

    counts = template_tokens(workload, template.name, template.digest)
    return {**asdict(counts), "mis_tokens": counts.mis_tokens, "no_mis_tokens": counts.no_mis_tokens}


def run_bench(config: BenchConfig, on_workload: Callable[[dict], None] | None = None) -> dict:
    """Everything in one process: build/load models, measure the matmul peak, run every workload.

    `on_workload` gets the report so far (`partial: true`) after each workload: a run killed at its time
    limit (a step of `./dev gpu-check`) still leaves the tables of the workloads it finished."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-checkpoint bars would bury the benchmark's own lines
    log = print if config.verbose else (lambda *a, **k: None)
    from kafka_scorer.engine.api import resolve_device, resolve_dtype

    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    shape_name = config.model_shape or (
        "tiny" if config.quick else ("qwen3-0.6b" if device.type == "cuda" else "cpu-small")
    )
    shape = SHAPES[shape_name]
    backends = config.backends or default_backends(device)
    started = time.time()
    with contextlib.ExitStack() as stack:
        if config.model_dir:
            root = Path(config.model_dir)
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kafka-scorer-bench-")))
        log(f"measuring the {dtype} matmul peak on {device} ...")
        env = Environment(
            device=device,
            dtype=dtype,
            shape=shape,
            model_root=root,
            peak=measure_matmul_peak(device, dtype, shape, config.quick),
            probe=RunProbe(device),
            template=config.template,
            decoder_forward=config.decoder_forward,
        )
        log(f"  {env.peak['flops_per_s'] / 1e9:.1f} GFLOP/s")
        results = {}
        for name in config.workloads:
            spec = workload_spec(name, quick=config.quick, device_type=device.type, num_jobs=config.num_jobs)
            workload = build_workload(spec, shape.vocab_size, seed=config.seed)
            if config.template and name == "rerank":
                from kafka_scorer_bench.templated import templated_workload

                workload = templated_workload(
                    spec, env.scorer("causal", config.max_batch_tokens), seed=config.seed
                )
            log(f"workload {name}: {len(workload.jobs)} jobs, {workload.num_items} items")
            results[name] = run_workload(env, workload, config, backends, log)
            if on_workload is not None:
                on_workload(_report(env, config, backends, started, results, None, partial=True))
        label_kernel = None
        if not config.skip_label_kernel:
            label_kernel = _label_kernel(device, config.quick, log)
        return _report(env, config, backends, started, results, label_kernel, partial=False)


def _report(
    env: Environment,
    config: BenchConfig,
    backends: Sequence[str],
    started: float,
    results: dict,
    label_kernel: dict | None,
    *,
    partial: bool,
) -> dict:
    default_backend = (
        env.scorers[next(iter(env.scorers))].describe().attention_backend if env.scorers else None
    )
    if default_backend not in backends:  # targets are judged on a backend that was measured
        default_backend = backends[0] if backends else None
    return {
        "meta": _meta(env.device, env.dtype, env.shape, backends, config, started),
        "matmul_peak": env.peak,
        "memory_method": env.probe.method,
        "workloads": dict(results),
        "label_kernel": label_kernel,
        "targets": evaluate_targets(results, label_kernel, env.device, default_backend),
        "ok": all(w["cross_check"]["ok"] for w in results.values()),
        "partial": partial,
    }


def _label_kernel(device: torch.device, quick: bool, log: Callable) -> dict | None:
    try:
        from kafka_scorer_bench.label_kernel import run_label_kernel_bench
    except ImportError:
        return None
    log("label kernel micro-benchmark ...")
    if quick:
        return run_label_kernel_bench(device, rows=32, vocab=2048, hidden=64, repeats=1, verbose=False)
    return run_label_kernel_bench(device, verbose=False)


def _meta(
    device: torch.device,
    dtype: torch.dtype,
    shape: ModelShape,
    backends: Sequence[str],
    config: BenchConfig,
    started: float,
) -> dict:
    import transformers

    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = cpu_model()
    return {
        "device": str(device),
        "device_name": device_name,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "dtype": str(dtype).removeprefix("torch."),
        "model_shape": asdict(shape),
        "decoder_params": shape.decoder_params(),
        "lm_head_params": shape.lm_head_params(),
        "backends": list(backends),
        "max_batch_tokens": config.max_batch_tokens,
        "repeats": config.repeats,
        "repeat_budget_s": config.repeat_budget_s,
        "quick": config.quick,
        "seed": config.seed,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": time.time() - started,
    }
