"""`kafka-scorer submit` as a user runs it: a child process against a real broker and a running worker.

Scores are checked against the independent reference (a plain transformers forward of one pair at a
time, tests/engine/reference.py), never against the worker's own engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import sys
import time
import uuid
from pathlib import Path

import msgspec
import pytest

from kafka_scorer.wire.protocol import Job, Result, TemplateRef
from tests.integration.brokers import on_each_broker
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


@on_each_broker()
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
    async with InProcessWorker(settings, causal_scorer.engine):
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


@on_each_broker()
async def test_submit_msgpack_from_stdin_to_stdout_all_ok(
    kafka, causal_model, causal_scorer, causal_reference
) -> None:
    topics = await fresh_topics(kafka, partitions=2)
    jobs = [j for j in _jobs() if j.get("id") != "bad-labels"]
    async with InProcessWorker(topics.settings(causal_model), causal_scorer.engine):
        rc, stdout, stderr, _ = await _submit(
            "--format", "msgpack", "--bootstrap-servers", kafka.bootstrap, "--request-topic", topics.requests,
            "--reply-topic", topics.replies, "--no-progress",
            stdin=b"\n".join(msgspec.json.encode(j) for j in jobs),
        )  # fmt: skip
    assert rc == 0, stderr
    assert f"{len(jobs)} jobs: {len(jobs)} ok, 0 failed, 0 timed out" in stderr
    _check_results(_results(stdout), jobs, causal_reference)


@on_each_broker()
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
    assert "1 job: 0 ok, 0 failed, 1 timed out" in stderr
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
        '{"query": [1], "items": [[2]], "label_tokens": [3]}\n'  # labels by text must be strings
        "not json at all\n"
        '{"query": "q", "items": ["a"], "documents": ["b"]}\n'  # one of them (SPEC §10)
    )
    rc, stdout, stderr, _ = await _submit(
        str(jobs_file), "--bootstrap-servers", kafka.bootstrap, "--request-topic", requests, "--no-progress"
    )
    assert rc == 2
    assert stdout == b""
    assert "line 2:" in stderr and "label_tokens" in stderr
    assert "line 3:" in stderr
    assert "line 4:" in stderr and "items and documents" in stderr
    assert "line 1:" not in stderr
    assert "3 invalid job line(s); nothing was sent" in stderr
    assert "Traceback" not in stderr
    assert await read_topic(kafka.bootstrap, requests, lambda rs: False, timeout_s=1.0) == []


async def test_submit_skip_invalid_sends_the_valid_lines_and_names_the_bad_ones(
    kafka, causal_model, causal_scorer, causal_reference, tmp_path: Path
) -> None:
    topics = await fresh_topics(kafka, partitions=1)
    good = [j for j in _jobs() if j.get("id", "").startswith("ids-")]
    lines = [msgspec.json.encode(good[0]), b'{"query": [1], "items": [[2]], "label_tokens": [3]}']
    lines += [msgspec.json.encode(good[1]), b"not json at all"]
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_bytes(b"\n".join(lines) + b"\n")
    async with InProcessWorker(topics.settings(causal_model), causal_scorer.engine):
        rc, stdout, stderr, _ = await _submit(
            str(jobs_file), "--skip-invalid", "--bootstrap-servers", kafka.bootstrap,
            "--request-topic", topics.requests, "--reply-topic", topics.replies, "--no-progress",
        )  # fmt: skip
    assert rc == 1, stderr
    assert "line 2:" in stderr and "line 4:" in stderr and "line 1:" not in stderr
    assert "2 invalid job line(s); skipped" in stderr and "2 jobs: 2 ok, 0 failed" in stderr
    results = _results(stdout)
    assert sorted(r.id for r in results) == sorted(j["id"] for j in good)
    for result, job in ((r, next(j for j in good if j["id"] == r.id)) for r in results):
        assert max_abs_diff(result.scores, causal_reference.scores(msgspec.convert(job, Job))) <= 1e-4


async def test_submit_into_a_pipe_nobody_reads_ends_quietly(
    kafka, causal_model, causal_scorer, tmp_path: Path
) -> None:
    """`kafka-scorer submit ... | head`: the reader has gone when the first result is written."""
    topics = await fresh_topics(kafka, partitions=1)
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_bytes(b"".join(msgspec.json.encode(j) + b"\n" for j in _jobs()[:4]))
    read_end, write_end = os.pipe()
    os.close(read_end)  # before the child starts: its first write meets a closed pipe
    async with InProcessWorker(topics.settings(causal_model), causal_scorer.engine):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kafka_scorer", "submit", str(jobs_file), "--no-progress",
            "--bootstrap-servers", kafka.bootstrap, "--request-topic", topics.requests,
            "--reply-topic", topics.replies,
            cwd=ROOT, env=_env(), stdin=asyncio.subprocess.DEVNULL, stdout=write_end,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        os.close(write_end)
        _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 141, err.decode()
    assert err.decode().strip() == "", "no traceback, no 'internal error', no summary"


READABLE_RANK = re.compile(r"^    (\d+)\. #(\d+) (\d\.\d{4}) (.+)$")


@pytest.fixture(scope="module")
def reranker(tmp_path_factory) -> Path:
    from kafka_scorer.checkpoints.tiny_models import build_tiny_reranker

    return build_tiny_reranker(tmp_path_factory.mktemp("reranker"))


def _printed_rankings(stderr: str) -> dict[str, list[tuple[int, int, float, str]]]:
    """`ranking ID (line N):` blocks of the summary: (rank, index, score, item text) per line."""
    rankings: dict[str, list[tuple[int, int, float, str]]] = {}
    current: list[tuple[int, int, float, str]] = []
    for line in stderr.splitlines():
        if line.startswith("  ranking "):
            current = rankings[line.split()[1]] = []
        elif m := READABLE_RANK.match(line):
            current.append((int(m[1]), int(m[2]), float(m[3]), m[4]))
    return rankings


@on_each_broker()
async def test_submit_flags_make_plain_text_jobs_a_reranking_run_and_print_it_readably(
    kafka, reranker: Path, tmp_path: Path
) -> None:
    """`--top-n`, `--label-tokens` and `--instruction` fill what a job leaves unset (a job's own value
    wins); rankings are checked against the model card's prompt run alone, on stdout and as printed."""
    from kafka_scorer.engine.load.revision import checkpoint_revision
    from kafka_scorer.engine.scorer import Scorer
    from tests.engine.reference import load_reference
    from tests.engine.test_templates import card_prompt, reference_rows

    jobs = [
        {"id": "plain", "query": "What is the capital of California?",
         "items": ["Sacramento is the capital.", "Los Angeles is in the south.", "Rivers flow to the sea.",
                   "An offset is a position in a partition, and this item is long enough to be cut."]},
        {"id": "own-top-n", "query": "Is this review positive?", "items": ["Great food.", "Cold and late."],
         "top_n": 1},
        {"id": "own-instruction", "query": "Kafka offsets", "items": ["Offsets are positions.", "Dogs."],
         "instruction": "Given a topic, find documents about it"},
        {"id": "ids", "query": "Kafka offsets", "items": ["Offsets.", "Cats."], "label_token_ids": [5, 6]},
    ]  # fmt: skip
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    flag_instruction = "Given a question, retrieve passages that answer it"
    topics = await fresh_topics(kafka, partitions=1)
    scorer = Scorer(str(reranker), dtype="float32", device="cpu", template="qwen3-reranker")
    async with InProcessWorker(topics.settings(reranker, template="qwen3-reranker"), scorer.engine):
        rc, stdout, stderr, _ = await _submit(
            str(jobs_file), "--bootstrap-servers", kafka.bootstrap, "--request-topic", topics.requests,
            "--reply-topic", topics.replies, "--no-progress", "--top-n", "3", "--label-tokens", "yes,no",
            "--instruction", flag_instruction,
        )  # fmt: skip
    assert rc == 0, stderr
    results = {r.id: r for r in _results(stdout)}
    assert set(results) == {j["id"] for j in jobs}
    printed = _printed_rankings(stderr)
    assert set(printed) == set(results), stderr
    want_top_n = {"plain": 3, "own-top-n": 1, "own-instruction": 2, "ids": 2}  # top_n 3, capped by items
    for spec in jobs:
        result = results[spec["id"]]
        assert result.error is None, result.error
        instruction = spec.get("instruction", flag_instruction)
        prompts = [card_prompt(spec["query"], item, instruction) for item in spec["items"]]
        labels = ["yes", "no"]
        if "label_token_ids" in spec:  # --label-tokens is not added to it: both would be invalid_request
            labels = load_reference(reranker)[1].convert_ids_to_tokens(spec["label_token_ids"])
        rows = reference_rows(reranker, prompts, labels, apply_softmax=False)
        # every job here is text under the template: ranked by the card's score (labels normalised)
        relevance = [r[0] for r in reference_rows(reranker, prompts, labels, apply_softmax=True)]
        assert max_abs_diff(result.scores, rows) <= 1e-5, spec["id"]
        order = sorted(range(len(relevance)), key=lambda i: (-relevance[i], i))[: want_top_n[spec["id"]]]
        assert result.ranking is not None and [r.index for r in result.ranking] == order, spec["id"]
        lines = printed[spec["id"]]
        assert [(rank, index) for rank, index, _, _ in lines] == list(enumerate(order, start=1))
        for _, index, score, text in lines:
            assert score == pytest.approx(relevance[index], abs=6e-5)
            assert spec["items"][index].startswith(text.removesuffix("…")) and len(text) <= 30
    template = TemplateRef("qwen3-reranker", hashlib.sha256(
        card_prompt("{query}", "{item}", "{instruction}").encode()).hexdigest()[:12])  # fmt: skip
    revision = checkpoint_revision(str(reranker))
    assert {(r.template, r.model_revision, r.dtype) for r in results.values()} == {
        (template, revision, "float32")
    }
    provenance = [line.strip() for line in stderr.splitlines() if "provenance:" in line]
    assert provenance == [
        f"provenance: template qwen3-reranker (hash {template.hash}), model_revision {revision}, "
        "dtype float32"
    ], stderr


async def test_submit_refuses_empty_label_tokens_and_a_negative_top_n(kafka, tmp_path: Path) -> None:
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_text('{"query": "q", "items": ["a"]}\n')
    for flags, needle in ((["--label-tokens", "yes,,no"], "--label-tokens"), (["--top-n", "-1"], "--top-n")):
        rc, stdout, stderr, _ = await _submit(str(jobs_file), "--bootstrap-servers", kafka.bootstrap, *flags)
        assert rc == 2 and stdout == b"", stderr
        assert needle in stderr and "Traceback" not in stderr
