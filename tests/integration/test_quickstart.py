"""The quickstart's laptop path, run as written: `kafka-scorer broker`, `kafka-scorer model`, a worker
serving that model, and `kafka-scorer submit` with the job `model` printed — all real processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kafka_scorer.broker import free_port
from tests.cli.helpers import ROOT, cli_env, run_cli

pytestmark = pytest.mark.integration


def _start(*args: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kafka_scorer", *args],
            cwd=ROOT,
            env=cli_env(PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false"),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def _wait_for(log: Path, needle: str, proc: subprocess.Popen[bytes], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while needle not in log.read_text(errors="replace"):
        assert proc.poll() is None, f"exited rc={proc.returncode}:\n{log.read_text(errors='replace')}"
        assert time.monotonic() < deadline, f"no {needle!r}:\n{log.read_text(errors='replace')}"
        time.sleep(0.1)


def test_broker_model_worker_submit_as_the_quickstart_says(tmp_path: Path) -> None:
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    broker_log, worker_log = tmp_path / "broker.log", tmp_path / "worker.log"
    broker = _start("broker", "--port", str(port), log=broker_log)
    worker = None
    try:
        _wait_for(broker_log, "broker ready", broker, timeout_s=30)
        made = run_cli("model", "causal", str(tmp_path / "tiny-causal"))
        assert made.returncode == 0, made.stderr
        job_line = next(line for line in made.stdout.splitlines() if line.startswith("a job:"))
        job = json.loads(job_line.removeprefix("a job:"))
        worker = _start(
            "worker",
            *("--model", str(tmp_path / "tiny-causal"), "--bootstrap-servers", bootstrap),
            *("--metrics-port", "0", "--fetch-max-wait-ms", "20"),
            log=worker_log,
        )
        _wait_for(worker_log, "worker ready", worker)
        (tmp_path / "jobs.jsonl").write_text(json.dumps(job) + "\n")
        submitted = run_cli(
            "submit", str(tmp_path / "jobs.jsonl"), "--bootstrap-servers", bootstrap, "--timeout", "60"
        )
        assert submitted.returncode == 0, submitted.stderr + worker_log.read_text(errors="replace")
        result = json.loads(submitted.stdout.splitlines()[0])
        assert result["id"] == job["id"] and "error" not in result
        assert len(result["scores"]) == len(job["items"])
        assert all(abs(sum(row) - 1.0) < 1e-5 for row in result["scores"])  # apply_softmax: rows sum to 1
    finally:
        for proc in (worker, broker):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
    assert broker.returncode == 0, broker_log.read_text(errors="replace")
    assert "broker stopped" in broker_log.read_text()


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
