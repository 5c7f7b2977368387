"""The server.properties of a one-node Apache Kafka (KRaft, broker and controller in one JVM) for tests.

Composable on purpose: TLS, mutual TLS and SASL listeners are added as `Listener`s, anything else (keystore
paths, SASL mechanisms, JAAS lines) through `extra`, which wins over every default here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

# Defaults a test suite needs on one node: internal topics with one replica; a group's first join not
# delayed by 3 s; the tests' 1.5 s sessions accepted (the broker's floor is 6 s); topics created on first
# use like the embedded brokers do, and large records as they do; fewer internal-topic partitions than the
# 50 a cluster gets, so the first group and the first transaction do not wait for 50 partitions to be made.
TEST_DEFAULTS: Mapping[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "num.partitions": "4",
    "auto.create.topics.enable": "true",
    # the poison tests send records of 7-10 MiB (the worker answers them `too_long`, its default limit is
    # 8 MiB); a broker refuses records over 1 MiB unless told otherwise, as tansu and noida-db do not
    "message.max.bytes": str(16 << 20),
}
MIN_SESSION_TIMEOUT_MS = int(TEST_DEFAULTS["group.min.session.timeout.ms"])


@dataclass(frozen=True)
class Listener:
    """One more listener next to PLAINTEXT and CONTROLLER, advertised to clients as it is bound."""

    name: str  # e.g. "SSL", "SASL_SSL", or a name of one's own mapped to `protocol`
    protocol: str  # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    port: int
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"{self.name}://{self.host}:{self.port}"


@dataclass(frozen=True)
class BrokerProperties:
    """Where the broker listens and keeps its log, plus extra listeners and properties."""

    log_dir: Path
    port: int
    controller_port: int
    host: str = "127.0.0.1"
    listeners: tuple[Listener, ...] = ()
    extra: Mapping[str, str] = field(default_factory=dict)
    node_id: int = 1
    voters: str = ""  # a cluster's static quorum, `id@host:port,...` (kafka_cluster.py); "" for one node

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def as_dict(self) -> dict[str, str]:
        plaintext = Listener("PLAINTEXT", "PLAINTEXT", self.port, self.host)
        controller = Listener("CONTROLLER", "PLAINTEXT", self.controller_port, self.host)
        clients = (plaintext, *self.listeners)
        base = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            **self._quorum(),
            "listeners": ",".join(lst.url for lst in (*clients, controller)),
            "advertised.listeners": ",".join(lst.url for lst in clients),
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": ",".join(
                f"{lst.name}:{lst.protocol}" for lst in (*clients, controller)
            ),
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.log_dir),
            **TEST_DEFAULTS,
        }
        return {**base, **self.extra}

    def _quorum(self) -> dict[str, str]:
        """One node bootstraps a dynamic quorum of itself; a cluster's nodes name every voter (a static
        quorum: a node back on an empty disk rejoins it formatted alike, with no quorum change to make)."""
        if self.voters:
            return {"controller.quorum.voters": self.voters}
        return {"controller.quorum.bootstrap.servers": f"{self.host}:{self.controller_port}"}

    def render(self) -> str:
        return "".join(f"{key}={value}\n" for key, value in self.as_dict().items())
