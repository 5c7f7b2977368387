"""Start-up mistakes an operator makes that used to look healthy (issue 11, item 2), against the broker.

- A model directory without tokenizer files: the worker refuses to start (exit 2, one line naming
  `model` and `allow_no_tokenizer`); with `allow_no_tokenizer` it serves token-id jobs, scored like the
  transformers reference, and answers text jobs `unsupported`.
- A request topic pattern that matches nothing: the worker keeps running, but after `topic_grace_s`
  `/readyz` answers 503 and one WARNING names `request_topic_pattern`; a matching topic brings it back.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

from kafka_scorer.embedded.broker import free_port
from kafka_scorer.kafka.admin import create_topics
from kafka_scorer.wire.protocol import ErrorCode, Job, encode_job
from tests.integration.jobs import Reference, max_abs_diff
from tests.integration.kafka_helpers import (
    InProcessWorker,
    Out,
    WorkerProcess,
    fresh_topics,
    produce,
    unique,
)

_MODEL_FILES = ("config.json", "generation_config.json")


def _without_tokenizer(model: Path, into: Path) -> Path:
    """The checkpoint's config and weights only: what a copy that lost its tokenizer looks like."""
    into.mkdir()
    for path in model.iterdir():
        if path.name in _MODEL_FILES or path.suffix == ".safetensors":
            shutil.copy(path, into / path.name)
    return into


async def test_a_model_without_tokenizer_refuses_to_start_unless_allowed(
    kafka, causal_model: Path, causal_reference: Reference, tmp_path: Path
) -> None:
    bare = _without_tokenizer(causal_model, tmp_path / "bare")
    topics = await fresh_topics(kafka, partitions=1)

    refused = WorkerProcess(topics.settings(bare), name="no-tokenizer")
    # Started side by side (two process start-ups paid at once): the refused one exits before it joins.
    allowed = WorkerProcess(topics.settings(bare, allow_no_tokenizer=True), name="token-ids-only")
    try:
        try:
            assert await refused.wait(timeout_s=120) == 2, refused.output()[-3000:]
        finally:
            refused.close()
        errors = [line for line in refused.output().splitlines() if "error:" in line]
        assert len(errors) == 1, refused.output()[-3000:]
        assert "Traceback" not in refused.output()
        assert "model:" in errors[0] and "no tokenizer files" in errors[0]
        assert "--allow-no-tokenizer" in errors[0] and "KAFKA_SCORER_ALLOW_NO_TOKENIZER" in errors[0]

        token_job = Job(id="ids", query=[5, 6, 7], items=[[8, 9], [10]], label_token_ids=[3, 4])
        text_job = Job(id="text", query="is it good?", items=["yes"], label_token_ids=[3, 4])
        async with allowed as worker:
            await produce(
                kafka.bootstrap,
                [
                    Out(topics.requests, encode_job(job), headers=[("content-type", b"application/json")])
                    for job in (token_job, text_job)
                ],
            )
            results = {r.id: r for r in await topics.wait_for_answers(2, worker, timeout_s=60)}
    finally:
        allowed.close()
    assert results["text"].error is not None and results["text"].error.code is ErrorCode.UNSUPPORTED
    assert results["ids"].error is None and results["ids"].scores is not None
    assert max_abs_diff(results["ids"].scores, causal_reference.scores(token_job)) <= 1e-4


def _readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


async def _wait_readyz(port: int, status: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (got := await asyncio.to_thread(_readyz, port)) != status:
        assert time.monotonic() < deadline, f"/readyz stayed {got}, expected {status}"
        await asyncio.sleep(0.1)


async def test_a_pattern_matching_nothing_turns_unready_until_a_topic_appears(
    kafka, causal_model: Path, causal_scorer, caplog
) -> None:
    topics = await fresh_topics(kafka, partitions=1)
    prefix = unique("nothing-yet")
    port = free_port()
    settings = topics.settings(
        causal_model, request_topic_pattern=f"{prefix}-.*", topic_grace_s=1.0, metrics_port=port
    )
    caplog.set_level(logging.INFO, logger="kafka_scorer.kafka.topic_watch")
    async with InProcessWorker(settings, causal_scorer.engine) as worker:
        await _wait_readyz(port, 503, timeout_s=30)
        assert worker.running, "an unmatched pattern must not stop the worker"
        watch = [r for r in caplog.records if r.name == "kafka_scorer.kafka.topic_watch"]
        warnings = [r.getMessage() for r in watch if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings  # once, not once per check
        assert f"request_topic_pattern='{prefix}-.*' matches no partition" in warnings[0]
        assert "KAFKA_SCORER_REQUEST_TOPIC_PATTERN" in warnings[0] and "/readyz" in warnings[0]

        await create_topics(kafka.bootstrap, [f"{prefix}-late"], 1)
        await _wait_readyz(port, 200, timeout_s=30)
        assert any("now match 1 partition" in r.getMessage() for r in caplog.records)
        assert (
            len([r for r in caplog.records if r.levelno == logging.WARNING and r.name == watch[0].name]) == 1
        )
