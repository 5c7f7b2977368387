"""Which brokers a Kafka-facing test runs on: the session's embedded broker and a real Apache Kafka.

The embedded brokers (tansu; noida-db for transactions) are protocol re-implementations: a test that
passes only there may be testing their quirks. The contract-level tests run on both, through the
`kafka` and `transactional_kafka` fixtures (tests/integration/conftest.py) parametrised indirectly:

    @on_each_broker()                         # kafka: the session broker, then Apache Kafka
    @on_each_broker("transactional_kafka")    # the session's transactional broker, then Apache Kafka

An unparametrised test keeps the session broker alone. The Apache Kafka case carries the
`apache_kafka` marker (`-m "not apache_kafka"` leaves it out); one JVM broker per test process serves all
of them, started by the first that needs it.
"""

from __future__ import annotations

import pytest

EMBEDDED = "embedded"  # the session broker: tansu (noida-db for transactions) unless KAFKA_BOOTSTRAP_SERVERS
APACHE_KAFKA = "apache-kafka"


def each_broker() -> list:
    """The parameters of a test run on both brokers, the JVM one marked `apache_kafka`."""
    return [EMBEDDED, pytest.param(APACHE_KAFKA, marks=pytest.mark.apache_kafka)]


def on_each_broker(fixture: str = "kafka") -> pytest.MarkDecorator:
    """Parametrise `fixture` (`kafka` or `transactional_kafka`) over both brokers."""
    return pytest.mark.parametrize(fixture, each_broker(), indirect=True)
