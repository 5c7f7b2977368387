"""submit's summary on stderr (no broker): counts in words a person reads, warnings shown beside an
"ok", results counted per checkpoint when several answered."""

from __future__ import annotations

import io

from kafka_scorer.cli.submission import Submission
from kafka_scorer.cli.submit_summary import summarize
from kafka_scorer.wire.protocol import Job, Result


def _done(job_id: str, line: int, **result: object) -> Submission:
    job = Job(id=job_id, query=[1], items=[[2]])
    return Submission(
        line=line, job=job, correlation_id=job_id, result=Result(id=job_id, scores=[[0.5]], **result)
    )


def _summary(submissions: list[Submission]) -> tuple[int, list[str]]:
    stream = io.StringIO()
    status = summarize(submissions, 60.0, stream)
    return status, stream.getvalue().splitlines()


def test_one_job_is_one_job_and_its_warning_is_shown() -> None:
    warning = "instruction: ignored, the job sends token ids and no template applies to them"
    status, lines = _summary([_done("ids", 1, warnings=[warning], model_revision="sha256:a")])
    assert status == 0
    assert lines[0] == "kafka-scorer submit: 1 job: 1 ok, 0 failed, 0 timed out"
    assert f"  warning: ids (line 1): {warning}" in lines


def test_results_are_counted_per_model_revision_when_they_differ() -> None:
    jobs = [_done("a", 1, model_revision="sha256:a"), _done("b", 2, model_revision="sha256:b")]
    jobs.append(_done("c", 3, model_revision="sha256:a"))
    _, lines = _summary(jobs)
    provenance = [line.strip() for line in lines if "provenance:" in line]
    assert provenance == [
        "provenance: template none, model_revision sha256:a, dtype unknown (2 results)",
        "provenance: template none, model_revision sha256:b, dtype unknown (1 result)",
    ]
