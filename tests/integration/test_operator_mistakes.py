"""What a new operator trips over (issue 21), driven the way the docs show: `kafka-scorer broker`,
`kafka-scorer model` and `kafka-scorer worker` as real processes, and the lines they print."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from kafka_scorer.embedded.broker import free_port
from tests.integration.kafka_helpers import Out, decode_replies, gated, produce, read_topic
from tests.integration.processes import (
    FAST_GROUP,
    probe,
    start,
    stop,
    stopped_at_exit,
    wait_for,
    wait_for_probe,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def models(quickstart_models) -> dict[str, Path]:
    """The quickstart's two models, as `kafka-scorer model` wrote them (one pair per session)."""
    return {name: model.path for name, model in quickstart_models.items()}


def _broker(tmp_path: Path) -> tuple[str, object]:
    port = free_port()
    log = tmp_path / "broker.log"
    proc = start("broker", "--port", str(port), log=log)
    wait_for(log, "broker ready", proc, timeout_s=30)
    return f"127.0.0.1:{port}", proc


def test_a_second_model_in_the_group_takes_no_partitions(tmp_path: Path, models: dict[str, Path]) -> None:
    """Quickstart §3 as the issue found it: the reranker started beside the running CausalLM worker with
    only another metrics port. It must say so in one ERROR line and leave every job to the first."""
    bootstrap, broker = _broker(tmp_path)
    with stopped_at_exit(broker) as procs:
        first_port, second_port = free_port(), free_port()
        common = ("--bootstrap-servers", bootstrap, *FAST_GROUP)
        first_log, second_log = tmp_path / "causal.log", tmp_path / "reranker.log"
        first = start("worker", "--model", str(models["causal"]), *common, "--metrics-port", str(first_port),
                      log=first_log)  # fmt: skip
        procs.append(first)
        # The second loads its model meanwhile; its Kafka clients wait until the first serves (the gate).
        gate = tmp_path / "second-gate"
        second = start(
            "worker", "--model", str(models["qwen3-reranker"]), "--template", "qwen3-reranker", *common,
            "--metrics-port", str(second_port), log=second_log, **gated(gate),
        )  # fmt: skip
        procs.append(second)
        wait_for(first_log, "worker ready", first)
        gate.touch()
        wait_for(second_log, "(group_id) already serves model", second)
        error = next(line for line in second_log.read_text().splitlines() if "already serves" in line)
        assert " ERROR " in error and "'kafka-scorer'" in error
        assert str(models["causal"]) in error and str(models["qwen3-reranker"]) in error
        assert probe(second_port) == 503 and probe(first_port) == 200
        assert "worker ready" not in second_log.read_text()  # its log agrees with its /readyz
        wait_for(first_log, "also has members serving", first)  # the first worker's log says it too

        jobs = [
            {"id": f"j{i}", "query": "Is it good?", "items": ["Yes.", "No."], "label_token_ids": [92, 81]}
            for i in range(4)
        ]
        records = [
            Out("scoring-requests", json.dumps(j).encode(), partition=i % 3) for i, j in enumerate(jobs)
        ]
        asyncio.run(produce(bootstrap, records))
        replies = asyncio.run(read_topic(bootstrap, "scoring-results", lambda got: len(got) >= 4, 60))
        results = decode_replies(replies)
        assert sorted(r.id for r in results) == [j["id"] for j in jobs]
        assert {r.model for r in results} == {str(models["causal"])}
        assert all(r.error is None for r in results), results
        assert "batch jobs=" not in second_log.read_text()


def test_a_broker_outage_is_a_few_lines_and_red_readiness(tmp_path: Path, models: dict[str, Path]) -> None:
    """The broker stopped for seconds under a running worker: /readyz 503 meanwhile and 200 after,
    without a restart, and a handful of lines instead of aiokafka's hundreds of ERRORs.

    The worker logs with `--log-format json`, so the same run (a worker start is seconds) also shows JSON
    logs are JSON from start to exit, through an outage: no progress bar, no native-extension teardown
    report, every line one JSON object."""
    port = free_port()
    broker_log, worker_log, metrics = tmp_path / "broker.log", tmp_path / "worker.log", free_port()
    broker = start("broker", "--port", str(port), log=broker_log)
    with stopped_at_exit(broker) as procs:
        wait_for(broker_log, "broker ready", broker, timeout_s=30)
        worker = start(
            "worker", "--model", str(models["causal"]), "--bootstrap-servers", f"127.0.0.1:{port}",
            "--metrics-port", str(metrics), "--log-format", "json", *FAST_GROUP, log=worker_log,
        )  # fmt: skip
        procs.append(worker)
        wait_for(worker_log, "worker ready", worker)
        wait_for_probe(metrics, 200, worker)
        assert stop(broker) == 0
        before = len(worker_log.read_text().splitlines())
        wait_for_probe(metrics, 503, worker, timeout_s=10)
        time.sleep(4)  # unfiltered, aiokafka logs ~65 lines a second (outage.py): hundreds since the stop
        during = worker_log.read_text().splitlines()[before:]
        assert probe(metrics) == 503
        broker = start("broker", "--port", str(port), log=tmp_path / "broker-again.log")
        # Stopped after the worker: a worker stopped once its broker is gone spends its grace (30 s) on a
        # final commit nobody takes, where stopped_at_exit gave up after 20 s and killed it.
        procs.insert(0, broker)
        wait_for_probe(metrics, 200, worker, timeout_s=30)
        assert stop(worker) == 0, worker_log.read_text()[-3000:]  # and it still stops cleanly
    assert len(during) < 10, "\n".join(during)
    outage = [line for line in during if "unreachable" in line]
    assert len(outage) == 1 and "no restart needed" in outage[0], during
    assert "reachable again after" in worker_log.read_text()
    _every_line_is_json(worker_log.read_text())


def _every_line_is_json(log: str) -> None:
    lines = log.splitlines()
    assert len(lines) > 5
    entries = [json.loads(line) for line in lines]
    assert all(isinstance(entry, dict) for entry in entries)
    # the embedded broker's refusal of idempotent producing is expected on a laptop: INFO, not WARNING
    (refusal,) = [e for e in entries if "refused idempotent producing" in e["msg"]]
    assert refusal["level"] == "INFO" and "embedded tansu broker" in refusal["msg"]


def test_a_wrong_bootstrap_server_is_named_before_the_model_loads(
    tmp_path: Path, models: dict[str, Path]
) -> None:
    log = tmp_path / "worker.log"
    nobody = f"127.0.0.1:{free_port()}"
    worker = start(
        "worker",
        "--model",
        str(models["causal"]),
        "--bootstrap-servers",
        nobody,
        "--metrics-port",
        "0",
        log=log,
    )
    with stopped_at_exit(worker):
        wait_for(log, "loading model", worker)
    lines = log.read_text().splitlines()
    unreachable = next(i for i, line in enumerate(lines) if f"Kafka broker {nobody} not reachable" in line)
    assert unreachable < next(i for i, line in enumerate(lines) if "loading model" in line)
    assert "Connection refused" in lines[unreachable] and "--bootstrap-servers" in lines[unreachable]
