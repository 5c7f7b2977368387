"""What a new operator trips over (issue 21), driven the way the docs show: `kafka-scorer broker`,
`kafka-scorer model` and `kafka-scorer worker` as real processes, and the lines they print."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from kafka_scorer.broker import free_port
from tests.integration.kafka_helpers import Out, decode_replies, produce, read_topic
from tests.integration.processes import FAST_GROUP, probe, start, stopped_at_exit, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The quickstart's two models, written by `kafka-scorer model` side by side."""
    root = tmp_path_factory.mktemp("models")
    makers = {
        name: start("model", name, str(root / name), log=root / f"{name}.out")
        for name in ("causal", "qwen3-reranker")
    }
    for name, proc in makers.items():
        assert proc.wait(120) == 0, (root / f"{name}.out").read_text()
    return {name: root / name for name in makers}


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
        wait_for(first_log, "worker ready", first)
        second = start(
            "worker", "--model", str(models["qwen3-reranker"]), "--template", "qwen3-reranker", *common,
            "--metrics-port", str(second_port), log=second_log,
        )  # fmt: skip
        procs.append(second)
        wait_for(second_log, "(group_id) already serves model", second)
        error = next(line for line in second_log.read_text().splitlines() if "already serves" in line)
        assert " ERROR " in error and "'kafka-scorer'" in error
        assert str(models["causal"]) in error and str(models["qwen3-reranker"]) in error
        assert probe(second_port) == 503 and probe(first_port) == 200

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
