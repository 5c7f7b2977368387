"""The quickstart's laptop path, run as written: `kafka-scorer broker`, `kafka-scorer model`, a worker
started with the command `model` printed, and `kafka-scorer submit` with the job it printed — all real
processes; for the plain CausalLM and for the reranker served with `--template qwen3-reranker`."""

from __future__ import annotations

import json
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from kafka_scorer.embedded.broker import free_port
from tests.cli.helpers import run_cli
from tests.integration.processes import FAST_GROUP, start, wait_for

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Flow:
    """One quickstart path: the model `kafka-scorer model` writes, and the request topic its worker reads
    (the reranker's worker gets a topic and group of its own, so both run side by side on one broker)."""

    name: str
    topic: str = "scoring-requests"
    group: str = "kafka-scorer"


FLOWS = (Flow("causal"), Flow("qwen3-reranker", "rerank-requests", "rerank"))


def test_broker_model_worker_submit_as_the_quickstart_says(tmp_path: Path, quickstart_models) -> None:
    """Both paths at once (each step is a process start paid in parallel): the CausalLM with the label
    ids `model` printed, and the reranker served with `--template qwen3-reranker` and text jobs. The
    models are the session's `kafka-scorer model` runs (conftest.py), shared with the operator tests."""
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    broker_log = tmp_path / "broker.log"
    topics = [a for t in ("scoring-requests", "scoring-results", FLOWS[1].topic) for a in ("--topic", t)]
    broker = start("broker", "--port", str(port), *topics, log=broker_log)
    workers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        wait_for(broker_log, "broker ready", broker, timeout_s=30)
        jobs = {}
        for flow in FLOWS:
            printed = dict(
                line.split(":", 1)
                for line in quickstart_models[flow.name].printed.splitlines()
                if line.startswith(("serve it:", "a job:"))
            )
            jobs[flow.name] = json.loads(printed["a job"])
            serve = printed["serve it"].split()  # kafka-scorer worker --model DIR [--template NAME]
            assert serve[:2] == ["kafka-scorer", "worker"], printed
            assert serve[3] == str(quickstart_models[flow.name].path), printed
            workers[flow.name] = start(
                *serve[1:],
                # FAST_GROUP: at the worker's 10 s session timeout, tansu took 10 s to settle the join
                *("--bootstrap-servers", bootstrap, "--metrics-port", "0", *FAST_GROUP),
                *("--request-topics", flow.topic, "--group-id", flow.group),
                log=tmp_path / f"{flow.name}-worker.log",
            )
        for flow in FLOWS:
            wait_for(tmp_path / f"{flow.name}-worker.log", "worker ready", workers[flow.name])
        for flow in FLOWS:
            job = jobs[flow.name]
            (tmp_path / "jobs.jsonl").write_text(json.dumps(job) + "\n")
            submitted = run_cli(
                "submit", str(tmp_path / "jobs.jsonl"), "--bootstrap-servers", bootstrap, "--timeout", "60",
                "--request-topic", flow.topic,
            )  # fmt: skip
            worker_log = (tmp_path / f"{flow.name}-worker.log").read_text(errors="replace")
            assert submitted.returncode == 0, submitted.stderr + worker_log
            result = json.loads(submitted.stdout.splitlines()[0])
            assert result["id"] == job["id"] and "error" not in result
            assert len(result["scores"]) == len(job["items"])
            if flow.name == "causal":
                assert all(abs(sum(row) - 1.0) < 1e-5 for row in result["scores"])  # apply_softmax
            else:
                _check_reranked(result, job, submitted.stderr)
    finally:
        for proc in (*workers.values(), broker):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
    assert broker.returncode == 0, broker_log.read_text(errors="replace")
    assert "broker stopped" in broker_log.read_text()


def _check_reranked(result: dict, job: dict, stderr: str) -> None:
    """The preset's yes/no labels, a ranking by the first one, and the template named on the result."""
    assert {len(row) for row in result["scores"]} == {2}, result  # labels from the template: yes, no
    # ranked by the model card's score, P(yes) / (P(yes) + P(no)), though the rows are full-vocabulary
    relevance = [row[0] / sum(row) for row in result["scores"]]
    order = sorted(range(len(relevance)), key=lambda i: (-relevance[i], i))[: job["top_n"]]
    assert [r["index"] for r in result["ranking"]] == order, result
    assert [r["score"] for r in result["ranking"]] == pytest.approx([relevance[i] for i in order], rel=1e-12)
    assert result["template"]["name"] == "qwen3-reranker" and result["model_revision"].startswith("sha256:")
    assert f"ranking {job['id']} (line 1):" in stderr and "provenance: template qwen3-reranker" in stderr


def test_broker_refuses_a_busy_port_in_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        done = run_cli("broker", "--port", str(taken), timeout=30)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--port" in done.stderr


def test_model_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    done = run_cli("model", "causal", str(tmp_path), timeout=60)
    assert done.returncode == 2 and "empty directory" in done.stderr
