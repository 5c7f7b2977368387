"""`kafka-scorer bench --workload open-loop`: the latency table serving engines are compared by.

Requests arrive as a Poisson process at each of a list of rates, whatever the worker is doing (open
loop: a slow answer never holds the next request back, so a saturated worker shows as a growing
latency, not as a lower offered rate). Each request is a fresh job, its own random query and items, so
no cache can serve it. The jobs are produced to an embedded broker and answered by `kafka-scorer worker`
in a process of its own (`worker_process.py`); latency is from the request's arrival (its produce) to its
reply being read back. Per rate: offered and served items/s, p50/p90/p99/max latency, errors; and the
highest rate whose p99 stays under a bound, the figure the table is read for.

The default job is SGLang's benchmark/score shape: a 120-token query, 10 items of 180 tokens, label ids
[9454, 2753] (Qwen3's "Yes"/"No"), the softmax over the two labels. Ids beyond a small model's
vocabulary are folded into it. The model: qwen3-0.6b on CUDA, cpu-small on the CPU, tiny with `quick`.

Before the first timed rate the worker is warmed by bursts of jobs that fill a fraction of the token
budget up to two budgets, so every batch size the rates produce has run once; these are not counted.
Rates run from the lowest; once a rate leaves requests unanswered past its drain time the worker is
saturated, and the higher rates are skipped rather than measured on top of that backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kafka_scorer.wire.protocol import Job, encode_job
from kafka_scorer_bench.models import FIRST_REGULAR_ID, SHAPES
from kafka_scorer_bench.open_loop_client import RateRun, Replies, send_poisson
from kafka_scorer_bench.probes import others_cpu
from kafka_scorer_bench.worker_process import WorkerProcess


@dataclass(frozen=True)
class JobShape:
    query_len: int
    num_items: int
    item_len: int
    label_ids: tuple[int, ...]
    apply_softmax: bool = True

    @property
    def tokens(self) -> int:
        return self.query_len + self.num_items * self.item_len


SGLANG_SHAPE = JobShape(120, 10, 180, (9454, 2753))
"""SGLang's benchmark/score shape (the MIS benchmark users compare by)."""
QUICK_SHAPE = JobShape(16, 4, 12, (9454, 2753))

DEFAULT_RATES = {"cuda": (25.0, 50.0, 100.0, 150.0, 200.0, 300.0, 400.0), "cpu": (0.1, 0.2, 0.3, 0.4)}
QUICK_RATES = (4.0, 8.0)
"""Requests per second; offered items/s is the rate times the job's items."""
DEFAULT_SECONDS = {"cuda": 10.0, "cpu": 30.0}
QUICK_SECONDS = 1.5
DEFAULT_P99_BOUND_MS = 300.0
WORKER_BUDGET = 8192
"""The token budget assumed until the worker's start-up line names the one it serves with (it sizes the
warm-up bursts and is reported)."""


@dataclass(frozen=True)
class OpenLoopConfig:
    device: str = "auto"
    dtype: str = "auto"
    model_shape: str | None = None
    quick: bool = False
    rates: tuple[float, ...] | None = None
    seconds: float | None = None
    """Arrivals per rate last this long; None: 10 s on CUDA, 30 s on the CPU, 1.5 s with `quick`."""
    p99_bound_ms: float = DEFAULT_P99_BOUND_MS
    max_batch_tokens: int | None = None
    """The worker's token budget; None: the worker's own default."""
    backend: str | None = None
    """The worker's attention backend; None: its own choice (auto)."""
    cuda_graph_tokens: int | None = None
    """The worker's `cuda_graph_tokens` (0: no CUDA graphs); None: its own default."""
    fetch_max_wait_ms: int = 10
    """Both consumers' fetch wait. tansu answers a waiting fetch only at its deadline (Kafka answers as
    data arrives), so a long wait would add up to its length to every hop; 10 ms keeps the broker's
    share of the latency near Kafka's at the cost of polling."""
    start_timeout_s: float = 600.0
    seed: int = 0
    model_dir: str | None = None


@dataclass
class Plan:
    """What the run resolved from the config and the device."""

    device: str
    dtype: str
    model_shape: str
    job: JobShape
    rates: tuple[float, ...]
    seconds: float
    budget: int
    labels: list[int] = field(default_factory=list)


def plan_for(config: OpenLoopConfig) -> Plan:
    from kafka_scorer.engine.api import resolve_device, resolve_dtype

    device = resolve_device(config.device)
    kind = "cuda" if device.type == "cuda" else "cpu"
    shape_name = config.model_shape or (
        "tiny" if config.quick else ("qwen3-0.6b" if kind == "cuda" else "cpu-small")
    )
    job = QUICK_SHAPE if config.quick else SGLANG_SHAPE
    vocab = SHAPES[shape_name].vocab_size
    rates = tuple(sorted(config.rates or (QUICK_RATES if config.quick else DEFAULT_RATES[kind])))
    seconds = config.seconds or (QUICK_SECONDS if config.quick else DEFAULT_SECONDS[kind])
    return Plan(
        device=str(device),
        dtype=str(resolve_dtype(config.dtype, device)).removeprefix("torch."),
        model_shape=shape_name,
        job=job,
        rates=rates,
        seconds=seconds,
        budget=config.max_batch_tokens or WORKER_BUDGET,
        labels=fold_into_vocab(job.label_ids, vocab),
    )


def fold_into_vocab(ids: Sequence[int], vocab: int) -> list[int]:
    """Ids a small model's vocabulary lacks are folded into its regular range (distinct ids stay
    distinct there as long as the range is wide enough, as it is for every bench shape)."""
    span = vocab - FIRST_REGULAR_ID
    return [i if i < vocab else FIRST_REGULAR_ID + i % span for i in ids]


class JobMaker:
    """Fresh jobs: every request its own random query and items (no prefix or cache can serve it).
    Also the engine-alone GPU benches' jobs (`graphs.py`, `profile_forward.py`)."""

    def __init__(self, shape: JobShape, seed: int, vocab: int) -> None:
        self.shape = shape
        self.labels = fold_into_vocab(shape.label_ids, vocab)
        self.rng = random.Random(f"open-loop:{seed}")
        self.ids = range(FIRST_REGULAR_ID, vocab)

    def _tokens(self, n: int) -> list[int]:
        # choices, not randrange per token: thousands of jobs per rate are made before it starts
        return self.rng.choices(self.ids, k=n)

    def job(self, job_id: str, items: int | None = None) -> Job:
        """One request of the shape (`items`: another item count)."""
        shape = self.shape
        return Job(
            id=job_id,
            query=self._tokens(shape.query_len),
            items=[self._tokens(shape.item_len) for _ in range(items or shape.num_items)],
            label_token_ids=self.labels,
            apply_softmax=shape.apply_softmax,
        )

    def encoded(self, job_id: str) -> bytes:
        return encode_job(self.job(job_id))


def run_open_loop_bench(
    config: OpenLoopConfig, log=print, on_rate: Callable[[dict], None] | None = None
) -> dict:
    """The table. `on_rate` gets the report so far (`partial: true`) after each rate: a run killed at
    its time limit (a step of `./dev gpu-check`) still leaves the rates it measured."""
    from kafka_scorer_bench.models import build_shaped_model

    plan = plan_for(config)
    shape = SHAPES[plan.model_shape]
    with contextlib.ExitStack() as stack:
        root = Path(
            config.model_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="kafka-scorer-ol-"))
        )
        path = root / f"{shape.name}-causal-{plan.dtype}"
        if not (path / "config.json").exists():
            log(f"building a random {shape.name} checkpoint ...")
            init = "cuda" if plan.device.startswith("cuda") else "cpu"
            build_shaped_model(path, shape, "causal", dtype=plan.dtype, init_device=init)
        maker = JobMaker(plan.job, config.seed, shape.vocab_size)
        started = time.time()

        def so_far(measured: dict, rates: list[dict]) -> None:
            if on_rate is not None:
                on_rate(_report(config, plan, started, measured, rates, partial=True))

        measured = asyncio.run(_measure(config, plan, str(path), maker, log, so_far))
    rates = measured.pop("rates")
    return _report(config, plan, started, measured, rates, partial=False)


def _report(
    config: OpenLoopConfig, plan: Plan, started: float, measured: dict, rates: list[dict], *, partial: bool
) -> dict:
    return {
        "meta": {
            **asdict(plan),
            "device_name": _device_name(plan.device),
            "job_tokens": plan.job.tokens,
            "max_batch_tokens": config.max_batch_tokens,
            "attention_backend": config.backend,
            "fetch_max_wait_ms": config.fetch_max_wait_ms,
            "p99_bound_ms": config.p99_bound_ms,
            "seed": config.seed,
            "quick": config.quick,
            "duration_s": time.time() - started,
            **measured,
        },
        "rates": list(rates),
        "best": best_rate(rates, config.p99_bound_ms),
        "partial": partial,
    }


def best_rate(rates: list[dict], bound_ms: float) -> dict | None:
    """The highest measured rate answered in full, without errors, with p99 at or under the bound."""
    good = [r for r in rates if not r["skipped"] and r["meets_bound"]]
    return max(good, key=lambda r: r["rate_rps"], default=None)


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    from kafka_scorer_bench.probes import cpu_model

    return cpu_model()


def worker_flags(
    config: OpenLoopConfig, plan: Plan, model: str, bootstrap: str, topics: tuple[str, str]
) -> list[str]:
    flags = [
        "--model", model,
        "--bootstrap-servers", bootstrap,
        "--request-topics", topics[0],
        "--reply-topic", topics[1],
        "--group-id", "kafka-scorer-open-loop",
        "--metrics-port", "0",
        "--device", plan.device,
        "--dtype", plan.dtype,
        "--fetch-max-wait-ms", str(config.fetch_max_wait_ms),
        "--log-level", "INFO",
        # tansu settles a group join after about half the session timeout: 1.5 s of start-up, not 5 s
        "--session-timeout-ms", "3000",
        "--heartbeat-interval-ms", "500",
    ]  # fmt: skip
    if config.max_batch_tokens:
        flags += ["--max-batch-tokens", str(config.max_batch_tokens)]
    if config.backend:
        flags += ["--attention-backend", config.backend]
    if config.cuda_graph_tokens is not None:
        flags += ["--cuda-graph-tokens", str(config.cuda_graph_tokens)]
    return flags


async def _measure(
    config: OpenLoopConfig,
    plan: Plan,
    model: str,
    maker: JobMaker,
    log,
    so_far: Callable[[dict, list[dict]], None],
) -> dict:
    from kafka_scorer.embedded.broker import EmbeddedBroker
    from kafka_scorer.kafka.admin import create_topics
    from kafka_scorer.kafka.connection import new_consumer, new_producer
    from kafka_scorer.kafka.records import TopicPartition

    topics, partitions = ("bench.open-loop.requests", "bench.open-loop.results"), 4
    async with EmbeddedBroker() as broker:
        await create_topics(broker.bootstrap_servers, list(topics), partitions)
        worker = WorkerProcess(worker_flags(config, plan, model, broker.bootstrap_servers, topics)).start()
        producer = new_producer(
            None, bootstrap_servers=broker.bootstrap_servers, acks="all", max_request_size=16 << 20
        )
        consumer = new_consumer(
            None,
            bootstrap_servers=broker.bootstrap_servers,
            enable_auto_commit=False,
            fetch_max_wait_ms=config.fetch_max_wait_ms,
            max_partition_fetch_bytes=16 << 20,
        )
        try:
            log(f"starting the worker ({plan.model_shape} on {plan.device}, {plan.dtype}) ...")
            start_s = await asyncio.to_thread(worker.wait_ready, config.start_timeout_s)
            served_budget = worker.logged_setting("max_batch_tokens")
            if served_budget and served_budget.isdigit():  # the worker's own default may depend on the device
                plan.budget = int(served_budget)
            served_backend = worker.logged_setting("attention_backend")
            served_graphs = worker.logged_setting("cuda_graphs")
            start_up_steps = worker.start_up_steps()
            await producer.start()
            await consumer.start()
            reply_parts = [TopicPartition(topics[1], p) for p in range(partitions)]
            consumer.assign(reply_parts)
            await consumer.seek_to_end(*reply_parts)
            replies = Replies(consumer)
            reading = asyncio.create_task(replies.read_forever())

            def check() -> None:  # a dead worker or reader is reported at once, not after a timeout
                worker.check_alive()
                if reading.done():
                    reading.result()

            try:
                warm = await _warm_up(producer, topics[0], replies, maker, plan, check, config, log)
                served = {
                    "worker_start_s": start_s,
                    "start_up_steps": start_up_steps,
                    "served_backend": served_backend,
                    "served_cuda_graphs": served_graphs,
                    **warm,
                }
                rates = await _all_rates(
                    producer,
                    topics[0],
                    replies,
                    maker,
                    plan,
                    check,
                    config,
                    log,
                    lambda rates_so_far: so_far(served, rates_so_far),
                )
            finally:
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
        finally:
            with contextlib.suppress(Exception):
                await producer.stop()
            with contextlib.suppress(Exception):
                await consumer.stop()
            await asyncio.to_thread(worker.stop)
    return {**served, "rates": rates}


async def _warm_up(
    producer, topic: str, replies: Replies, maker: JobMaker, plan: Plan, check, config, log
) -> dict:
    """Bursts of 1 job, then of a quarter, half, one and two token budgets of jobs, each answered before
    the next: every batch size the rates will produce has run (and compiled) once, uncounted."""
    per_budget = max(1, plan.budget // plan.job.tokens)
    sizes = sorted({1, max(1, per_budget // 4), max(1, per_budget // 2), per_budget, 2 * per_budget})
    log(f"warming the worker up: bursts of {', '.join(map(str, sizes))} jobs (not counted) ...")
    started = time.monotonic()
    count = 0
    for b, size in enumerate(sizes):
        ids = [f"warm{b}-{k}" for k in range(size)]
        for job_id in ids:
            await producer.send(topic, maker.encoded(job_id))
        count += size
        timeout = config.start_timeout_s if b == 0 else max(60.0, 10 * plan.seconds)
        await replies.wait_for(ids, timeout, check)
    return {"warmup_jobs": count, "warmup_s": time.monotonic() - started}


async def _all_rates(
    producer, topic: str, replies: Replies, maker: JobMaker, plan: Plan, check, config, log, done
) -> list[dict]:
    rates: list[dict] = []
    rng = random.Random(f"arrivals:{config.seed}")
    saturated_at: float | None = None
    for index, rate in enumerate(plan.rates):
        if saturated_at is not None:
            rates.append(RateRun.skipped(rate, plan.job.num_items, saturated_at))
            continue
        arrivals = poisson_arrivals(rng, rate, plan.seconds)
        log(f"rate {rate:g}/s: {len(arrivals)} requests over {plan.seconds:g} s ...")
        payloads = [(f"r{index}-{k}", maker.encoded(f"r{index}-{k}")) for k in range(len(arrivals))]
        with others_cpu() as load:
            run = await send_poisson(producer, topic, payloads, arrivals)
            drain_s = max(5.0, plan.seconds)
            await replies.wait_for(run.ids, drain_s, check, raise_on_timeout=False)
        summary = run.summary(rate, plan.seconds, plan.job.num_items, replies, config.p99_bound_ms)
        summary["others_cpu"] = load.foreign_cpu_load
        rates.append(summary)
        done(rates)
        if summary["lost"]:
            saturated_at = rate
    return rates


def poisson_arrivals(rng: random.Random, rate: float, seconds: float) -> list[float]:
    """Arrival offsets (s) of a Poisson process of `rate` per second over `seconds`; at least one."""
    times, t = [], rng.expovariate(rate)
    while t < seconds:
        times.append(t)
        t += rng.expovariate(rate)
    return times or [0.0]
