"""The Apache Kafka runner itself (devtools/apache_kafka.py): it starts, serves a record, keeps it across
a restart on the same ports, and loses it when restarted with its log deleted — the two restarts the
broker-restart tests need. A private broker, not the session's: this one is stopped and wiped."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from devtools.apache_kafka import ApacheKafka
from devtools.kafka_properties import BrokerProperties, Listener
from devtools.processes import alive

TOPIC = "runner-check"


async def _produce(bootstrap: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(TOPIC, b"kept", key=b"k")
    finally:
        await producer.stop()


async def _topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def _values(bootstrap: str) -> list[bytes]:
    """Every value of TOPIC from the start (reconnecting clients must find the broker where it was)."""
    consumer = AIOKafkaConsumer(
        TOPIC, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        batch = await consumer.getmany(timeout_ms=5000, max_records=10)
        return [record.value for records in batch.values() for record in records]
    finally:
        await consumer.stop()


@pytest.mark.apache_kafka
def test_a_record_survives_a_restart_and_an_empty_restart_loses_it(apache_kafka_distribution) -> None:
    with ApacheKafka(apache_kafka_distribution) as broker:
        bootstrap, pid = broker.bootstrap_servers, broker.pid
        asyncio.run(_produce(bootstrap))
        assert asyncio.run(_values(bootstrap)) == [b"kept"]

        broker.restart()
        assert broker.bootstrap_servers == bootstrap and broker.pid != pid
        assert asyncio.run(_values(bootstrap)) == [b"kept"], broker.log_tail()

        broker.restart(empty=True)
        assert broker.bootstrap_servers == bootstrap
        assert TOPIC not in asyncio.run(_topics(bootstrap)), broker.log_tail()
        assert "Kafka Server started" in broker.log_file.read_text()  # the log4j binding writes its log
        run_dir, last_pid = broker.run_dir, broker.pid
    assert not run_dir.exists()
    assert last_pid is not None and not alive(last_pid)


def test_extra_listeners_and_properties_compose_into_server_properties(tmp_path) -> None:
    """The hook the TLS/SASL listeners use: more listeners, mapped and advertised; `extra` wins."""
    props = BrokerProperties(
        tmp_path,
        9092,
        9093,
        listeners=(Listener("SASL_SSL", "SASL_SSL", 9094),),
        extra={"sasl.enabled.mechanisms": "SCRAM-SHA-512", "num.partitions": "1"},
    ).as_dict()
    assert props["listeners"] == (
        "PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9094,CONTROLLER://127.0.0.1:9093"
    )
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9094"
    assert "SASL_SSL:SASL_SSL" in props["listener.security.protocol.map"]
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512" and props["num.partitions"] == "1"
