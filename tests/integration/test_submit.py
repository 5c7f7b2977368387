"""`kafka-scorer submit` as a user runs it: a child process against a real broker and a running worker.

Scores are checked against the independent reference (a plain transformers forward of one pair at a
time, tests/engine/reference.py), never against the worker's own engine.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

import msgspec
import pytest

from kafka_scorer.protocol import Job, Result
from tests.integration.jobs import MODEL_VOCAB, Reference, max_abs_diff
from tests.integration.kafka_helpers import (
    ROOT,
    InProcessWorker,
    create_topics,
    fresh_topics,
    read_topic,
    unique,
)

pytestmark = pytest.mark.integration

BAD_LABEL = MODEL_VOCAB + 5  # outside the model's output vocabulary: an `invalid_request` reply


def _jobs() -> list[dict]:
    """Text and token ids, MIS on and off, both softmax modes, pooled states, no id, one bad job."""
    return [
        {"id": "text-mis", "query": "What is the capital of California?", "items": ["Sacramento", "fox"],
         "label_token_ids": [5, 17], "multi_item": True},
        {"id": "text-single-softmax", "query": "Is this review positive?", "items": ["great food", "dog"],
         "label_token_ids": [40, 41, 42], "apply_softmax": True, "multi_item": False},
        {"id": "ids-mis-softmax", "query": [5, 17, 42, 99], "items": [[7, 8], [120, 121, 122], [9]],
         "label_token_ids": [3, 300], "apply_softmax": True, "multi_item": True},
        {"id": "ids-pooled", "query": [7, 8, 9], "items": [[10, 11]], "label_token_ids": [12],
         "return_pooled_hidden_states": True},
        {"query": [120, 121], "items": [[5], [6, 7]], "label_token_ids": [8, 9]},  # no id
        {"id": "empty-items", "query": "Kafka", "items": [], "label_token_ids": [1]},
        {"id": "bad-labels", "query": "Kafka", "items": ["offsets"], "label_token_ids": [BAD_LABEL]},
    ]  # fmt: skip


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_SCORER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


async def _submit(*args: str, stdin: bytes | None = None) -> tuple[int, bytes, str, float]:
    """Run `python -m kafka_scorer submit ARGS` without blocking the loop the worker runs on."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kafka_scorer",
        "submit",
        *args,
        cwd=ROOT,
        env=_env(),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), 120)
    return proc.returncode or 0, out, err.decode(), time.monotonic() - started


def _results(data: bytes) -> list[Result]:
    return [msgspec.json.decode(line, type=Result) for line in data.splitlines() if line.strip()]


def _check_results(results: list[Result], jobs: list[dict], reference: Reference) -> None:
    """One result per job, each id accounted for, every score as the reference computes it."""
    assert len(results) == len(jobs)
    by_id = {r.id: r for r in results}
    assert len(by_id) == len(jobs), "duplicate or missing result ids"
    given = {j["id"] for j in jobs if "id" in j}
    generated = set(by_id) - given
    assert len(generated) == 1, "the job without an id must get exactly one generated id"
    uuid.UUID(generated.pop())  # a correlation uuid, not a made-up label
    for spec in jobs:
        result = by_id[spec["id"]] if "id" in spec else next(r for r in results if r.id not in given)
        job = msgspec.convert(spec, Job)
        if spec.get("id") == "bad-labels":
            assert result.error is not None and result.error.code.value == "invalid_request"
            assert result.scores is None
            continue
        assert result.error is None, (result.id, result.error)
        assert result.scores is not None
        assert max_abs_diff(result.scores, reference.scores(job)) <= 1e-4, result.id
        assert result.prompt_tokens >= 0
        if job.return_pooled_hidden_states:
            pooled = result.pooled_hidden_states
            assert pooled is not None and pooled.shape[0] == len(job.items)


async def test_submit_file_to_file_every_result_checked_and_failure_reported(
    kafka, causal_model, causal_scorer, causal_reference, tmp_path: Path
) -> None:
    topics = await fresh_topics(kafka, partitions=2)
    jobs = _jobs()
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_bytes(b"".join(msgspec.json.encode(j) + b"\n" for j in jobs) + b"\n")  # blank line ok
    out_file = tmp_path / "results.jsonl"
    # The worker's own reply topic is another: the answers must follow the jobs' reply_topic header.
    settings = topics.settings(causal_model, reply_topic="unused-default")
    async with InProcessWorker(settings, causal_scorer):
        rc, stdout, stderr, _ = await _submit(
            str(jobs_file), "-o", str(out_file), "--bootstrap-servers", kafka.bootstrap,
            "--request-topic", topics.requests, "--reply-topic", topics.replies, "--timeout", "60",
            "--no-progress",
        )  # fmt: skip
    assert rc == 1, stderr  # the bad job failed, so the run did
    assert stdout == b""
    assert "Traceback" not in stderr
    assert "7 jobs: 6 ok, 1 failed, 0 timed out" in stderr
    assert "failed: bad-labels (line 7): invalid_request" in stderr
    _check_results(_results(out_file.read_bytes()), jobs, causal_reference)


async def test_submit_msgpack_from_stdin_to_stdout_all_ok(
    kafka, causal_model, causal_scorer, causal_reference
) -> None:
    topics = await fresh_topics(kafka, partitions=2)
    jobs = [j for j in _jobs() if j.get("id") != "bad-labels"]
    async with InProcessWorker(topics.settings(causal_model), causal_scorer):
        rc, stdout, stderr, _ = await _submit(
            "--format", "msgpack", "--bootstrap-servers", kafka.bootstrap, "--request-topic", topics.requests,
            "--reply-topic", topics.replies, "--no-progress",
            stdin=b"\n".join(msgspec.json.encode(j) for j in jobs),
        )  # fmt: skip
    assert rc == 0, stderr
    assert f"{len(jobs)} jobs: {len(jobs)} ok, 0 failed, 0 timed out" in stderr
    _check_results(_results(stdout), jobs, causal_reference)


async def test_submit_times_out_quickly_with_no_worker(kafka, tmp_path: Path) -> None:
    topics = await fresh_topics(kafka, partitions=1)
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_text('{"id": "lonely-1", "query": [1], "items": [[2]], "label_token_ids": [3]}\n')
    rc, stdout, stderr, elapsed = await _submit(
        str(jobs_file), "--bootstrap-servers", kafka.bootstrap, "--request-topic", topics.requests,
        "--reply-topic", topics.replies, "--timeout", "1.5", "--no-progress",
    )  # fmt: skip
    assert rc == 1, stderr
    assert stdout == b""
    assert "1 jobs: 0 ok, 0 failed, 1 timed out" in stderr
    assert "timed out after 1.5s with no result: lonely-1" in stderr
    assert elapsed < 30  # interpreter start + connect + 1.5 s, far from the 60 s default
    sent = await read_topic(
        kafka.bootstrap, topics.requests, lambda rs: len(rs) >= 1, timeout_s=10, settle_s=0.3
    )
    assert len(sent) == 1 and b"lonely-1" in sent[0].value


async def test_submit_rejects_bad_lines_by_number_and_sends_nothing(kafka, tmp_path: Path) -> None:
    requests = unique("submit-req")
    await create_topics(kafka.bootstrap, [requests], partitions=1)
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_text(
        '{"query": [1], "items": [[2]], "label_token_ids": [3]}\n'
        '{"query": [1], "items": [[2]], "label_tokens": [3]}\n'  # typo: unknown field
        "not json at all\n"
    )
    rc, stdout, stderr, _ = await _submit(
        str(jobs_file), "--bootstrap-servers", kafka.bootstrap, "--request-topic", requests, "--no-progress"
    )
    assert rc == 2
    assert stdout == b""
    assert "line 2:" in stderr and "label_tokens" in stderr
    assert "line 3:" in stderr
    assert "line 1:" not in stderr
    assert "2 invalid job line(s); nothing was sent" in stderr
    assert "Traceback" not in stderr
    assert await read_topic(kafka.bootstrap, requests, lambda rs: False, timeout_s=1.0) == []
