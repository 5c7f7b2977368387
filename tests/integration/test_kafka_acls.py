"""The ACLs docs/operations.md lists, on Apache Kafka with its own authorizer (StandardAuthorizer, no
ACL means no access): exactly those let a worker serve in both delivery modes, and a missing one stops
it with one line naming what to grant and the setting it concerns.

The worker connects as a SCRAM user on a SASL listener; the test makes topics and ACLs and reads the
replies over the plain listener, whose anonymous principal is a super user. One broker (one JVM, about
10 s) serves the module.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import msgspec
import pytest

from devtools.kafka_properties import Listener
from devtools.kafka_security import ScramUser, scram_properties
from kafka_scorer.config import Settings
from kafka_scorer.embedded.broker import free_port
from kafka_scorer.wire.protocol import Job
from kafka_scorer.worker.service import Worker, default_transactional_id
from tests.integration.jobs import Reference, max_abs_diff
from tests.integration.kafka_helpers import BrokerInfo, InProcessWorker, Out, Topics, fresh_topics, produce

pytestmark = [
    pytest.mark.integration,
    pytest.mark.apache_kafka,
    # kafka-python 3.0 (the ACL admin here) loads its protocol schemas with importlib.resources' legacy calls
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]

USER = ScramUser("scorer-acl", "pw-acl-4Rr9-never-printed")
AUTHORIZER = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",  # the plain and controller listeners: the broker itself, the test
    "allow.everyone.if.no.acl.found": "false",
}
JOB = Job(id="acl-job", query=[5, 17, 42], items=[[7, 8], [120, 121]], label_token_ids=[3, 300])


class AclKafka:
    """The broker, its SASL listener, and ACLs granted to the worker's user (kafka-python's admin)."""

    def __init__(self, broker, sasl_port: int) -> None:
        self.broker = broker
        self.sasl = f"127.0.0.1:{sasl_port}"
        self.info = BrokerInfo(broker.bootstrap_servers, "apache-kafka (ACLs)", True, 1000)

    def security(self) -> dict[str, str]:
        return {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": USER.name,
            "sasl_password": USER.password,
        }

    async def grant(self, *grants: tuple[str, str, str]) -> None:
        """ALLOW `operation` on each (resource type, name, operation) for the worker's user."""
        from kafka.admin import (
            ACL,
            ACLOperation,
            ACLPermissionType,
            KafkaAdminClient,
            ResourcePattern,
            ResourceType,
        )

        acls = [
            ACL(f"User:{USER.name}", "*", ACLOperation[op], ACLPermissionType.ALLOW,
                ResourcePattern(ResourceType[kind], name))
            for kind, name, op in grants
        ]  # fmt: skip

        def create() -> None:
            admin = KafkaAdminClient(bootstrap_servers=self.broker.bootstrap_servers)
            try:
                created = admin.create_acls(acls)
                assert not created["failed"], created["failed"]
            finally:
                admin.close()

        await asyncio.to_thread(create)


@pytest.fixture(scope="module")
def acl_kafka(apache_kafka_distribution) -> Iterator[AclKafka]:
    """`apache_kafka_distribution` (tests/conftest.py) skips, or fails where CI requires the broker."""
    from devtools.apache_kafka import ApacheKafka

    sasl = Listener("SASL_PLAINTEXT", "SASL_PLAINTEXT", free_port())
    extra = {**scram_properties(sasl.name), **AUTHORIZER}
    with ApacheKafka(
        apache_kafka_distribution, listeners=(sasl,), extra=extra, scram_users=(USER,)
    ) as broker:
        yield AclKafka(broker, sasl.port)


def documented_acls(settings: Settings) -> list[tuple[str, str, str]]:
    """docs/operations.md's table, for these settings: what the worker's principal needs."""
    grants = [("GROUP", settings.group_id, "READ")]
    grants += [("TOPIC", topic, op) for topic in settings.request_topics for op in ("READ", "DESCRIBE")]
    for topic in (settings.reply_topic, f"{settings.request_topics[0]}.DLT"):
        grants += [("TOPIC", topic, op) for op in ("WRITE", "DESCRIBE")]
    if settings.delivery == "exactly_once":
        txn_id = default_transactional_id(settings)
        grants += [("TRANSACTIONAL_ID", txn_id, op) for op in ("WRITE", "DESCRIBE")]
    return grants


async def _topics(acl_kafka: AclKafka) -> Topics:
    return await fresh_topics(acl_kafka.info, partitions=1, dead_letters=True)


def _settings(acl_kafka: AclKafka, topics: Topics, model, **overrides: object) -> Settings:
    return topics.settings(model, bootstrap_servers=acl_kafka.sasl, **acl_kafka.security(), **overrides)


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
async def test_the_documented_acls_are_enough_to_serve(
    acl_kafka: AclKafka, delivery: str, causal_model, causal_scorer, causal_reference: Reference, caplog
) -> None:
    topics = await _topics(acl_kafka)
    settings = _settings(acl_kafka, topics, causal_model, delivery=delivery)
    await acl_kafka.grant(*documented_acls(settings))
    caplog.set_level(logging.INFO, logger="kafka_scorer")
    async with InProcessWorker(settings, causal_scorer.engine) as worker:
        await produce(acl_kafka.info.bootstrap, [Out(topics.requests, msgspec.json.encode(JOB), b"k")])
        (result,) = await topics.read_answers(1, timeout_s=60, committed_only=delivery == "exactly_once")
        assert await worker.stop() == 0
    assert result.error is None and max_abs_diff(result.scores, causal_reference.scores(JOB)) <= 1e-4
    mode = "transactional" if delivery == "exactly_once" else "idempotent"
    assert f"producer started ({mode}" in caplog.text  # no fallback: Write on a topic grants idempotence


@pytest.mark.parametrize(
    ("missing", "says"),
    [
        ("everything", "grant this worker's principal Read on the request topics (setting: request_topics)"),
        ("the group", "grant this worker's principal Read on the group (setting: group_id)"),
    ],
)
async def test_a_missing_acl_stops_the_worker_with_one_line_naming_it(
    acl_kafka: AclKafka, missing: str, says: str, causal_model, causal_scorer, caplog
) -> None:
    topics = await _topics(acl_kafka)
    settings = _settings(acl_kafka, topics, causal_model)
    grants = documented_acls(settings)
    if missing == "the group":
        await acl_kafka.grant(*(g for g in grants if g[0] != "GROUP"))
    caplog.set_level(logging.INFO, logger="kafka_scorer")
    rc = await asyncio.wait_for(Worker(settings, causal_scorer.engine).run(asyncio.Event()), 60)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("kafka_scorer")]
    assert rc == 1 and len(errors) == 1, [r.getMessage() for r in errors]
    line = errors[0].getMessage()
    assert says in line and "\n" not in line and errors[0].exc_info is None, line
    assert USER.password not in caplog.text


async def test_a_missing_transactional_id_acl_is_named_where_exactly_once_degrades(
    acl_kafka: AclKafka, causal_model, causal_scorer, caplog
) -> None:
    """The worker still serves (at least once, idempotent: docs/worker.md), and says what to grant."""
    topics = await _topics(acl_kafka)
    settings = _settings(acl_kafka, topics, causal_model, delivery="exactly_once")
    await acl_kafka.grant(*(g for g in documented_acls(settings) if g[0] != "TRANSACTIONAL_ID"))
    caplog.set_level(logging.INFO, logger="kafka_scorer")
    async with InProcessWorker(settings, causal_scorer.engine) as worker:
        assert worker.worker.producer.mode == "idempotent"
        assert await worker.stop() == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    says = f"Write and Describe on the transactional id {default_transactional_id(settings)}"
    assert len(errors) == 1 and says in errors[0] and "(setting: transactional_id)" in errors[0], errors
