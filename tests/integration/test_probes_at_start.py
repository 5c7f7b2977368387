"""Health before readiness (issue 26): `/healthz` and `/readyz` are served from process start, before the
model loads and before the broker answers. Before, with the broker unreachable the port was refused
until it answered (100 s in the issue's run), and docs/scaling.md's liveness probe killed such a pod in
a loop; a model that loads in minutes did the same."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kafka_scorer.embedded.broker import free_port
from tests.integration.processes import probe, start, stopped_at_exit

pytestmark = pytest.mark.integration

_START_UP = (
    "not ready: starting: checking the settings",  # the first state: /healthz can answer within it
    "not ready: starting: checking the connection to Kafka",
    "not ready: starting: loading model",
)
"""What /readyz may say the moment /healthz first answers: any step before the model is loaded."""


def _readyz(port: int) -> tuple[int, str]:
    """The answer, waited for up to 20 s: the probe thread shares the interpreter with the model's
    import and load, and on two cores busy with other test processes one answer took over 5 s (./dev
    latest beside a fault test). Slow is not what this test is about; refused or never is."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=20) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def test_probes_answer_from_process_start_with_the_broker_unreachable(tmp_path: Path, causal_model) -> None:
    port, nobody = free_port(), f"127.0.0.1:{free_port()}"  # a closed port: no broker will ever answer
    log = tmp_path / "worker.log"
    started = time.monotonic()
    flags = ("--model", str(causal_model), "--bootstrap-servers", nobody, "--metrics-port", str(port))
    worker = start("worker", *flags, log=log)
    with stopped_at_exit(worker):
        while probe(port, "/healthz") != 200:
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() - started < 120, log.read_text()
            time.sleep(0.02)
        healthy_after_s = time.monotonic() - started
        status, said = _readyz(port)
        assert status == 503 and said.startswith(_START_UP), said  # the model is not loaded yet
        # Loaded and warmed up, still waiting for the broker: alive, not ready, and saying why.
        waiting = f"not ready: starting: waiting for the Kafka broker at {nobody}\n"
        while _readyz(port) != (503, waiting):
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() - started < 120, (_readyz(port), log.read_text())
            time.sleep(0.1)
        assert probe(port, "/healthz") == 200
        assert "worker ready" not in log.read_text()
    print(f"/healthz answered {healthy_after_s:.2f}s after the process started (first /readyz: {said!r})")
