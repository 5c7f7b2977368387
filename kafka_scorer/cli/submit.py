"""`kafka-scorer submit`: a plain Kafka client that sends jobs and waits for their results.

It is what a caller of the service does, in one command: read jobs as JSON Lines and send each through
the `ScoringClient` (kafka_scorer/client/), the project's one request-reply implementation (correlation
ids, the reply topic read from its end, a deadline per job; SPEC §2, §3, §9). It talks to any cluster
through the same settings as the worker, and the demo reuses `submit_jobs` so the demo's numbers come
from the path a user takes.

Choices where the contract is silent (also in docs/submit.md):
- `--timeout` counts from the first send, and is every job's deadline: each job carries `timeout_ms`
  ending at that instant, so a worker need not compute what submit no longer waits for.
- All lines are validated before anything is sent: a file with a bad line sends nothing, unless
  `--skip-invalid` asks to send the valid ones (the bad ones listed, exit status 1).
- A reader of stdout that goes away (`| head`) ends the run quietly with status 141, as a shell
  reports a command killed by SIGPIPE; no traceback.
- A job without an `id` gets its correlation id as `id`; the record key is the job id.
- Results are written as they arrive (not in input order), one JSON object per line, exactly the
  worker's Result; the exit status says whether every job got a successful one.
- `--top-n`, `--label-tokens` and `--instruction` fill those fields in every job that does not set
  them (a job's own value wins; `--label-tokens` skips jobs with `label_token_ids`, since both is an
  error): a file of plain query/items lines becomes a reranking run without editing it.
- The summary on stderr shows rankings readably (rank, index, score, the item's text) and the
  provenance once (`result_view.py`); stdout stays the results, clean for a pipe.

Heavy imports (aiokafka, rich) happen inside functions: `kafka-scorer --help` imports this module.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import msgspec
from pydantic import ValidationError

from kafka_scorer import errors
from kafka_scorer.cli.help_style import add_env_file, add_setting_flag, flag_name
from kafka_scorer.cli.progress import ProgressBar
from kafka_scorer.cli.submission import Submission
from kafka_scorer.cli.submit_summary import EXIT_JOBS_FAILED, MAX_LISTED, PROG, summarize
from kafka_scorer.wire.content import dec_hook
from kafka_scorer.wire.protocol import Job, WireFormat, shape_problem

if TYPE_CHECKING:
    from kafka_scorer.config import Settings

EXIT_PIPE_CLOSED = 141  # what a shell reports for a command that SIGPIPE ended


# Settings fields that are also flags here (help text from Settings, the worker's style); flags override
# KAFKA_SCORER_* variables, which override --env-file, which overrides defaults.
CONNECTION_FLAGS: tuple[str, ...] = (
    "bootstrap_servers",
    "security_protocol",
    "sasl_mechanism",
    "sasl_username",
    "sasl_password",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
    "client_id",
)
SETTING_FLAGS: dict[str, str] = {
    **{name: flag_name(name) for name in CONNECTION_FLAGS},
    "request_topics": "--request-topic",
    "reply_topic": "--reply-topic",
}
"""The settings this command takes as flags, by flag: a settings error names no flag it lacks."""


def new_submission(job: Job, line: int = 0) -> Submission:
    """Give the job a correlation id, and an `id` if it has none, so results can be matched and read."""
    correlation_id = str(uuid.uuid4())
    if job.id is None:
        job = msgspec.structs.replace(job, id=correlation_id)
    return Submission(line=line, job=job, correlation_id=correlation_id)


@dataclass(frozen=True)
class JobDefaults:
    """Job fields the command line fills in for every job that does not set them itself."""

    top_n: int | None = None
    label_tokens: list[str] | None = None
    instruction: str | None = None

    def apply(self, job: Job) -> Job:
        """The job with the unset fields filled; a job's own value always wins. `label_tokens` is left
        out where the job names `label_token_ids` (giving both is an error, SPEC §8)."""
        changes: dict[str, object] = {}
        if self.top_n is not None and job.top_n is None:
            changes["top_n"] = self.top_n
        if self.label_tokens is not None and job.label_tokens is None and job.label_token_ids is None:
            changes["label_tokens"] = list(self.label_tokens)
        if self.instruction is not None and job.instruction is None:
            changes["instruction"] = self.instruction
        return msgspec.structs.replace(job, **changes) if changes else job


def label_list(text: str) -> list[str]:
    """`--label-tokens`: `yes,no` (split at commas, spaces kept: ` yes` is another token than `yes`), or
    a JSON array of strings for labels that hold a comma."""
    if text.lstrip().startswith("["):
        try:
            labels = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"not a JSON array of strings: {exc}") from None
    else:
        labels = text.split(",")
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) and x for x in labels):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give one or more non-empty labels, as yes,no or as a JSON array of strings"
        )
    return labels


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 or more")
    return value


def read_jobs(
    lines: Iterable[bytes | str], defaults: JobDefaults | None = None
) -> tuple[list[Submission], list[str]]:
    """Parse JSON Lines into submissions; every bad line becomes an error naming its line number."""
    decoder = msgspec.json.Decoder(Job, dec_hook=dec_hook)  # image parts: base64 or data URIs
    submissions: list[Submission] = []
    problems: list[str] = []
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        try:
            job = decoder.decode(text)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError too
            problems.append(f"line {number}: {exc}")
            continue
        problem = shape_problem(job)  # items or documents: what the worker's decoder checks too
        if problem is not None:
            problems.append(f"line {number}: {problem}")
            continue
        submissions.append(new_submission(defaults.apply(job) if defaults else job, number))
    return submissions, problems


async def submit_jobs(
    settings: Settings,
    submissions: Sequence[Submission],
    *,
    request_topic: str,
    reply_topic: str,
    fmt: WireFormat = "json",
    timeout_s: float = 60.0,
    on_result: Callable[[Submission], None] | None = None,
    on_sending: Callable[[], None] | None = None,
) -> None:
    """Send every job through one `ScoringClient` and wait until each has a result or `timeout_s` has
    passed since the first send (every job's deadline is that same instant).

    Fills in `sent_at`, `result`, `received_at` and `send_error` on the submissions. Raises only for a
    failure of the whole run (broker unreachable, missing topic, the reply reader failing); a job's own
    failure is its result. `on_sending` runs once, when the client is connected and the first job is
    about to go out, so a throughput clock can leave connection set-up out.
    """
    from kafka_scorer.client import NotSent, ScoringClient, ScoringTimeout

    client = ScoringClient(  # connect_timeout=0: a person is waiting, an unreachable broker is one line
        settings=settings, request_topic=request_topic, reply_topic=reply_topic, format=fmt, connect_timeout=0
    )
    async with client:
        if on_sending is not None:
            on_sending()
        deadline = time.monotonic() + timeout_s

        async def one(submission: Submission) -> None:
            submission.sent_at = time.monotonic()
            try:
                submission.result = await client.request(
                    submission.job,
                    timeout=max(deadline - submission.sent_at, 0.001),
                    correlation_id=submission.correlation_id,
                )
            except ScoringTimeout:
                return
            except NotSent as exc:
                submission.send_error = exc.reason
            else:
                submission.received_at = time.monotonic()
            if on_result is not None:
                on_result(submission)

        calls = [asyncio.create_task(one(submission)) for submission in submissions]
        try:
            await asyncio.gather(*calls)
        finally:  # a failure of the whole run: no call outlives the client
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)


# ---------------------------------------------------------------------------------------------------
# command line


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Produce jobs read as JSON Lines to the request topic, wait for their results on the reply "
        "topic (matched by correlation_id) and write the results as JSON Lines. Exit status: 0 every "
        "job scored, 1 a job failed or timed out (or a line was skipped), 2 bad input or settings, 141 "
        "the reader of the results went away."
    )
    parser.add_argument(
        "input", nargs="?", default="-", help="JSON Lines file of jobs, one per line; '-' or none: stdin"
    )
    parser.add_argument(
        "-o", "--output", default="-", metavar="PATH", help="where to write result lines; '-': stdout"
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS", help="time to wait for all results"
    )
    parser.add_argument(
        "--format",
        choices=("json", "msgpack"),
        default="json",
        help="wire format of the jobs (results come back in the same); output is always JSON Lines",
    )
    parser.add_argument(
        "--request-topic",
        metavar="TOPIC",
        help="topic to send jobs to (default: the first of request_topics; env: KAFKA_SCORER_REQUEST_TOPICS)",
    )
    parser.add_argument(
        "--reply-topic",
        metavar="TOPIC",
        help="topic to read results from (default: reply_topic; env: KAFKA_SCORER_REPLY_TOPIC)",
    )
    parser.add_argument(
        "--top-n",
        type=non_negative,
        metavar="N",
        help="ask every job that sets no top_n for a ranking of its best N items (default: each job's own)",
    )
    parser.add_argument(
        "--label-tokens",
        type=label_list,
        metavar="A,B,...",
        help="labels by text for every job that names no labels, e.g. yes,no (spaces count; a JSON array "
        "for labels with commas) (default: each job's own, else the worker's template's)",
    )
    parser.add_argument(
        "--instruction",
        metavar="TEXT",
        help="the template's {instruction} for every job that sets none (default: each job's own, else the "
        "template's)",
    )
    add_env_file(parser)
    for field in CONNECTION_FLAGS:
        add_setting_flag(parser, field)
    parser.add_argument(
        "--skip-invalid",
        action="store_true",
        help="send the valid lines when some are invalid (listed on stderr; exit status 1) instead of "
        "sending nothing",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logs and full tracebacks")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Flags given on the command line win over KAFKA_SCORER_* variables and .env."""
    from kafka_scorer.config import Settings

    # argparse's values (Any, as `Namespace` holds them), checked by pydantic when `Settings` validates
    overrides: dict[str, Any] = {
        field: getattr(args, field) for field in CONNECTION_FLAGS if getattr(args, field, None) is not None
    }
    if getattr(args, "request_topic", None):
        overrides["request_topics"] = [args.request_topic]
    if getattr(args, "reply_topic", None):
        overrides["reply_topic"] = args.reply_topic
    return Settings(_env_file=getattr(args, "env_file", ".env"), **overrides)  # type: ignore[call-arg]  # pydantic-settings takes _env_file at init; mypy does not see it without the plugin


def warn_unknown_variables(stream: IO[str]) -> None:
    """Misspelt `KAFKA_SCORER_*` variables, each with the closest setting, before anything else: a
    typo would otherwise be ignored in silence and the default used (env_check.py, as the worker)."""
    from kafka_scorer.config import Settings
    from kafka_scorer.env_check import unknown_variables

    for line in unknown_variables(os.environ, Settings.model_fields):
        print(f"{PROG}: warning: {line}", file=stream)


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    errors.quiet_client_loggers(verbose)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.verbose)
    warn_unknown_variables(sys.stderr)
    bootstrap = getattr(args, "bootstrap_servers", None)
    try:
        settings = settings_from_args(args)
        bootstrap = settings.bootstrap_servers
        defaults = JobDefaults(
            top_n=getattr(args, "top_n", None),
            label_tokens=getattr(args, "label_tokens", None),
            instruction=getattr(args, "instruction", None),
        )
        with _open_input(args.input) as lines:
            submissions, problems = read_jobs(lines, defaults)
        skip = getattr(args, "skip_invalid", False) and bool(submissions)
        if problems:
            _report_invalid(problems, skip)
            if not skip:
                return errors.EXIT_USER_ERROR
        if not settings.request_topics:
            raise errors.UserFacingError(
                "no request topic: set --request-topic or KAFKA_SCORER_REQUEST_TOPICS"
            )
        with (
            _open_output(args.output) as out,
            ProgressBar(len(submissions), "scoring", enabled=not args.no_progress) as bar,
        ):

            def write(submission: Submission) -> None:
                if submission.result is not None:
                    out.write(msgspec.json.encode(submission.result) + b"\n")
                    out.flush()
                bar.advance(len(submission.job.inputs))

            asyncio.run(
                submit_jobs(
                    settings,
                    submissions,
                    request_topic=settings.request_topics[0],
                    reply_topic=settings.reply_topic,
                    fmt=args.format,
                    timeout_s=args.timeout,
                    on_result=write,
                    on_sending=bar.restart_clock,
                )
            )
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of the results went away (`| head`): nobody reads the rest
        _drop_stdout()
        return EXIT_PIPE_CLOSED
    except ValidationError as exc:  # a setting: worded as the worker words it, naming only our flags
        from kafka_scorer.cli.worker import describe_errors

        print(describe_errors(exc, PROG, SETTING_FLAGS), file=sys.stderr)
        return errors.EXIT_USER_ERROR
    except Exception as exc:
        return errors.report(exc, bootstrap_servers=bootstrap, verbose=args.verbose, prog=PROG)
    status = summarize(submissions, args.timeout, sys.stderr)
    if problems:
        print(f"{PROG}: {len(problems)} invalid job line(s) skipped (listed above)", file=sys.stderr)
        return max(status, EXIT_JOBS_FAILED)
    return status


def _report_invalid(problems: list[str], skipped: bool) -> None:
    for problem in problems[:MAX_LISTED]:
        print(f"{PROG}: {problem}", file=sys.stderr)
    more = len(problems) - MAX_LISTED
    tail = f" (and {more} more)" if more > 0 else ""
    outcome = "warning: {}; skipped, the valid lines are sent" if skipped else "error: {}; nothing was sent"
    print(f"{PROG}: " + outcome.format(f"{len(problems)} invalid job line(s){tail}"), file=sys.stderr)


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's own flush at exit cannot fail again."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@contextlib.contextmanager
def _open_input(path: str) -> Iterator[Iterable[bytes]]:
    if path == "-":
        yield sys.stdin.buffer
        return
    with open(path, "rb") as fh:
        yield fh


@contextlib.contextmanager
def _open_output(path: str) -> Iterator[IO[bytes]]:
    if path == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    with open(path, "wb") as fh:
        yield fh
