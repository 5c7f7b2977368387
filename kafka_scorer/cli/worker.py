"""`kafka-scorer worker`: settings from flags over environment over `.env`, then serve until a signal.

Every field of `Settings` is a flag (`max_batch_tokens` -> `--max-batch-tokens`), generated from the
model so the CLI cannot drift from it; a flag that is not given leaves the environment's value alone.
This module stays light at import (no torch, no aiokafka): `kafka-scorer --help` imports it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pydantic import ValidationError

from kafka_scorer.cli.help_style import add_env_file, add_setting_flag, env_name, flag_name
from kafka_scorer.config import Settings
from kafka_scorer.errors import EXIT_USER_ERROR
from kafka_scorer.heap import freeze_loaded_heap

if TYPE_CHECKING:
    from kafka_scorer.engine.scoring_engine import ScoringEngine
    from kafka_scorer.worker.metrics import Readiness, WorkerMetrics

log = logging.getLogger(__name__)

_PROG = "kafka-scorer worker"


def configure(parser: argparse.ArgumentParser) -> None:
    add_env_file(parser)
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logs and full tracebacks (--log-level DEBUG)"
    )
    for name in Settings.model_fields:
        add_setting_flag(parser, name)


def load_settings(args: argparse.Namespace) -> Settings:
    overrides = {name: getattr(args, name) for name in Settings.model_fields if hasattr(args, name)}
    if getattr(args, "verbose", False):
        overrides["log_level"] = "DEBUG"
    return Settings(_env_file=getattr(args, "env_file", ".env"), **overrides)  # type: ignore[call-arg]  # pydantic-settings takes _env_file at init; mypy does not see it without the plugin


def describe_errors(exc: ValidationError, prog: str = _PROG, flags: Mapping[str, str] | None = None) -> str:
    """One self-contained line per problem, each naming the setting (its flag and env var follow).

    Input values are not repeated (a secret's would be the secret); messages that need the value,
    like a missing file's path, carry it themselves. `flags` maps the settings that are flags of
    `prog` to their flag (default: every setting, as the worker has); a setting without one is named
    by its environment variable alone, never by a flag the command does not take.
    """
    lines = []
    for error in exc.errors():
        name = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        flag = flag_name(name) if flags is None else flags.get(name)
        where = f"{flag}, {env_name(name)}" if flag else env_name(name)
        if name:
            lines.append(f"{prog}: invalid setting {name} ({where}): {message}")
        else:  # checks across settings start with the names they are about
            lines.append(f"{prog}: invalid setting {message}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from kafka_scorer.env_check import unknown_variables
    from kafka_scorer.worker.logs import configure_logging, exit_without_teardown, quiet_progress_bars

    # A misspelt variable is named first: it is often why a required setting looks missing.
    misspelt = unknown_variables(os.environ, Settings.model_fields)
    said_first = [f"{_PROG}: warning: {line}" for line in misspelt]
    try:
        settings = load_settings(args)
    except ValidationError as exc:
        print("\n".join([*said_first, describe_errors(exc)]), file=sys.stderr)
        return EXIT_USER_ERROR
    if not settings.model:
        missing = f"{_PROG}: invalid setting model (--model, KAFKA_SCORER_MODEL): required to run a worker"
        print("\n".join([*said_first, missing]), file=sys.stderr)
        return EXIT_USER_ERROR
    configure_logging(settings.log_level, settings.log_format)
    quiet_progress_bars(settings.log_format)
    for line in misspelt:  # the first log lines, JSON too with --log-format json
        log.warning(line)
    code = asyncio.run(serve(settings))
    if settings.log_format == "json":
        exit_without_teardown(code)
    return code


async def serve(settings: Settings) -> int:
    """Serve the probes, load the model, then run the worker until SIGTERM/SIGINT; a second signal
    exits at once."""
    from kafka_scorer.errors import report
    from kafka_scorer.worker.metrics import ProbeServer, Readiness, WorkerMetrics

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log.warning("second %s: exiting now without draining", signal.Signals(signum).name)
            logging.shutdown()
            os._exit(128 + signum)
        log.info(
            "%s: stopping (grace %.1fs; send again to exit at once)",
            signal.Signals(signum).name,
            settings.shutdown_grace_s,
        )
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    metrics, readiness = WorkerMetrics(), Readiness("starting: checking the settings")
    probe = None
    if settings.metrics_port:
        # First of all, before the broker is asked anything and the model loads (minutes, for a large
        # one): a liveness probe sees a live process meanwhile, and /readyz says what it waits for.
        probe = ProbeServer(metrics, readiness, settings.metrics_host, settings.metrics_port)
        try:
            await probe.start()
        except OSError as exc:
            return report(_metrics_port_taken(settings, exc), prog=_PROG)
    try:
        return await _start_and_run(settings, stop, metrics, readiness)
    finally:
        if probe is not None:
            await probe.stop()


async def _start_and_run(
    settings: Settings, stop: asyncio.Event, metrics: WorkerMetrics, readiness: Readiness
) -> int:
    """The start-up checks, the model, then the worker; `readiness` says which step it is in."""
    from kafka_scorer.cli.model_source import check_model_source
    from kafka_scorer.errors import report
    from kafka_scorer.kafka.preflight import check_connection, unreachable_at_start, wait_until_accepted

    try:
        check_model_source(settings.model)  # a misspelt directory: one line now, not after hub retries
        await asyncio.to_thread(_check_schema_registry, settings)
        # TLS and SASL are proven before the model loads: a wrong CA or password is one line and
        # exit 2 in a second, not minutes later, and never an endless "unreachable" retry.
        readiness.starting(f"starting: checking the connection to Kafka at {settings.bootstrap_servers}")
        unreached: list[str] = []
        reached = await check_connection(settings, unreached=unreached)
    except Exception as exc:
        return report(exc, bootstrap_servers=settings.bootstrap_servers, prog=_PROG)
    if not reached:  # said now, not after a model load of minutes: a wrong address is the usual cause
        log.warning(unreachable_at_start(settings, unreached))
    from kafka_scorer.cli.no_triton import keep_triton_out_on_cpu

    keep_triton_out_on_cpu(settings.device)  # no triton leak report at exit on a CPU machine
    from kafka_scorer.engine.scoring_engine import (
        ScoringEngine,  # torch: seconds, after the connection check
    )
    from kafka_scorer.worker.service import Worker

    log.info("loading model %s", settings.model)
    readiness.starting(f"starting: loading model {settings.model}")
    try:
        engine = await asyncio.to_thread(ScoringEngine, settings.engine_config())
    except Exception as exc:
        # A model that cannot load is the person's to fix: one line, no traceback (unless -v/DEBUG).
        return report(exc, prog=_PROG)
    try:
        _check_tokenizer(settings, engine)
    except Exception as exc:
        return report(exc, prog=_PROG)
    if stop.is_set():
        return 0
    started = time.monotonic()
    readiness.starting(f"starting: warming up model {settings.model}")
    await asyncio.to_thread(engine.warm_up)  # compiles and autotunes now, not on the first live batch
    log.info(
        "warm-up at the served shapes took %.1fs (attention %s)",
        time.monotonic() - started,
        engine.describe().attention_backend,
    )
    freeze_loaded_heap()  # no full collection walks the model's objects while serving
    if stop.is_set():
        return 0
    if not reached:
        readiness.starting(f"starting: waiting for the Kafka broker at {settings.bootstrap_servers}")
        try:
            if not await wait_until_accepted(settings, stop):
                return 0
        except Exception as exc:
            return report(exc, bootstrap_servers=settings.bootstrap_servers, prog=_PROG)
    return await Worker(settings, engine, metrics=metrics, readiness=readiness).run(stop)


def _metrics_port_taken(settings: Settings, exc: OSError) -> Exception:
    """A metrics port someone else holds: one line naming the setting, before anything else starts."""
    from kafka_scorer.errors import SettingError

    where = f"{settings.metrics_host}:{settings.metrics_port}"
    return SettingError(
        "metrics_port",
        f"cannot serve metrics on {where} ({exc.strerror}): choose another --metrics-port "
        "(KAFKA_SCORER_METRICS_PORT), or 0 to turn the metrics server off",
    )


def _check_tokenizer(settings: Settings, engine: ScoringEngine) -> None:
    """A checkpoint without tokenizer files would answer every text job `unsupported` while reporting
    ready: a copy that lost its tokenizer looks healthy until someone reads the results. Serving token
    ids alone is a rare, deliberate choice, so it must be asked for (`allow_no_tokenizer`)."""
    from kafka_scorer.errors import SettingError

    if settings.allow_no_tokenizer or engine.describe().loaded.tokenizer is not None:
        return
    raise SettingError(
        "model",
        f"model: {settings.model} has no tokenizer files (tokenizer.json, or tokenizer_config.json and its "
        "vocabulary), so every text job would be answered unsupported: point --model (KAFKA_SCORER_MODEL) "
        "at a checkpoint with its tokenizer, or set --allow-no-tokenizer (KAFKA_SCORER_ALLOW_NO_TOKENIZER=1) "
        "to serve token-id jobs only",
    )


def _check_schema_registry(settings: Settings) -> None:
    """A registry that cannot give the Result schema's id is found before the model loads, as one line:
    later, every result to the reply topic would wait on it."""
    from kafka_scorer.errors import SettingError
    from kafka_scorer.wire.registry import RegistryError, SchemaRegistry, subject_for

    if not settings.schema_registry_url:
        return
    fix = "set --schema-registry-url (KAFKA_SCORER_SCHEMA_REGISTRY_URL) to a reachable registry, or unset it"
    try:
        registry = SchemaRegistry(settings.schema_registry_url)
    except ValueError as exc:
        raise SettingError("schema_registry_url", f"schema_registry_url: {exc}; {fix}") from None
    subject = subject_for(settings.reply_topic)
    try:
        schema_id = registry.schema_id(subject)
    except RegistryError as exc:
        if not exc.retriable:  # it answered, and said no: compatibility rules or credentials
            fix = (
                f"let subject {subject} take the Result schema (its compatibility setting, or "
                "credentials as https://user:secret@host in --schema-registry-url), or unset "
                "KAFKA_SCORER_SCHEMA_REGISTRY_URL"
            )
        raise SettingError("schema_registry_url", f"schema_registry_url: {exc}; {fix}") from None
    log.info("results framed for %s: subject %s, schema id %d", registry.shown_url(), subject, schema_id)
