"""The end of a `kafka-scorer submit` run for people, on stderr: counts, what failed or timed out, the
warnings results carry, the provenance once, and readable rankings. stdout stays the results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, TYPE_CHECKING

from kafka_scorer.cli.result_view import provenance_lines, ranked_entries, ranking_lines

if TYPE_CHECKING:
    from kafka_scorer.cli.submission import Submission

MAX_LISTED = 10
"""Failed, timed-out, warned and ranked jobs listed in the summary, each; the rest are counted."""
EXIT_OK = 0
EXIT_JOBS_FAILED = 1
PROG = "kafka-scorer submit"


def summarize(submissions: Sequence[Submission], timeout_s: float, stream: IO[str]) -> int:
    """One line of counts, then which jobs failed or timed out; the exit status follows from them."""
    failed = [s for s in submissions if s.state == "failed"]
    timed_out = [s for s in submissions if s.state == "pending"]
    ok = len(submissions) - len(failed) - len(timed_out)
    print(
        f"{PROG}: {count(len(submissions), 'job')}: {ok} ok, {len(failed)} failed, "
        f"{len(timed_out)} timed out",
        file=stream,
    )
    for submission in failed[:MAX_LISTED]:
        error = submission.result.error if submission.result is not None else None
        if submission.send_error is not None or error is None:  # a failure with no answer: not sent
            reason = f"not sent: {submission.send_error}"
        else:
            reason = f"{error.code.value}: {error.message}"
        print(f"  failed: {submission.job_id} (line {submission.line}): {reason}", file=stream)
    if timed_out:
        ids = ", ".join(s.job_id for s in timed_out[:MAX_LISTED])
        more = f" and {len(timed_out) - MAX_LISTED} more" if len(timed_out) > MAX_LISTED else ""
        print(
            f"  timed out after {timeout_s:g}s with no result: {ids}{more} "
            "(is a worker consuming the request topic? raise --timeout for slow models)",
            file=stream,
        )
    print_warnings(submissions, stream)
    for line in provenance_lines([s.result for s in submissions]):
        print(f"  {line}", file=stream)
    print_rankings(submissions, stream)
    return EXIT_JOBS_FAILED if failed or timed_out else EXIT_OK


def print_warnings(submissions: Sequence[Submission], stream: IO[str]) -> None:
    """What the worker accepted but ignored, per job (a template not applied to token ids, labels sent
    to a classification model): an "ok" whose request was not read as meant must say so."""
    warned = [s for s in submissions if s.result is not None and s.result.warnings]
    for submission in warned[:MAX_LISTED]:
        for warning in submission.result.warnings:  # type: ignore[union-attr]  # only answered submissions reach the summary
            print(f"  warning: {submission.job_id} (line {submission.line}): {warning}", file=stream)
    if len(warned) > MAX_LISTED:
        print(f"  ({count(len(warned) - MAX_LISTED, 'more job')} with warnings in the results)", file=stream)


def count(n: int, noun: str) -> str:
    """`1 job`, `2 jobs`."""
    return f"{n} {noun}{'s' * (n != 1)}"


def print_rankings(submissions: Sequence[Submission], stream: IO[str]) -> None:
    """The rankings of the first MAX_LISTED jobs that have one, in input order, one line per item."""
    ranked = [s for s in submissions if s.result is not None and ranked_entries(s.result) is not None]
    for submission in ranked[:MAX_LISTED]:
        print(f"  ranking {submission.job_id} (line {submission.line}):", file=stream)
        for line in ranking_lines(submission.job, submission.result) or ["(no items)"]:  # type: ignore[arg-type]  # only answered submissions reach the summary
            print(f"    {line}", file=stream)
    if len(ranked) > MAX_LISTED:
        print(f"  ({len(ranked) - MAX_LISTED} more rankings in the results)", file=stream)
