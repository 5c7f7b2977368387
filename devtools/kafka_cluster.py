"""Three Apache Kafka nodes (KRaft, broker and controller in each JVM) on loopback: a cluster for tests.

What one node cannot show needs three: a partition's leader dying while another replica takes over,
the group and transaction coordinators moving to another node, a rolling restart, a node back on an
empty disk re-replicating. This builds three `ApacheKafka` nodes (devtools/apache_kafka.py) that share
a cluster id and a static controller quorum (`controller.quorum.voters`: a node whose disk was replaced
is formatted alike and rejoins with no quorum change), spawns them together (none answers before two of
them run) and waits for each to list itself.

Topic settings are production-like (`CLUSTER_DEFAULTS`): replication 3, `min.insync.replicas=2`,
unclean leader election off, the internal topics replicated the same way, and no topic created on
demand. A node's broker session is 6 s rather than Kafka's 9 s: a killed node's partitions move, and
its next incarnation may register, that much sooner (every failover in the tests waits for it).

Three JVMs of 384 MB start here in ~15-30 s on two busy cores.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from devtools.apache_kafka import ApacheKafka, cluster_id
from devtools.kafka_distribution import KafkaDistribution
from kafka_scorer.embedded.broker import free_port

T = TypeVar("T")

CLUSTER_DEFAULTS: Mapping[str, str] = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "unclean.leader.election.enable": "false",
    "auto.create.topics.enable": "false",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "broker.session.timeout.ms": "6000",
    "broker.heartbeat.interval.ms": "1000",
}
HEAP = "384m"
SIZE = 3


def _run(coroutine: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a client coroutine on a loop of its own, on a thread: callable from sync code and from inside
    a running loop alike (the tests call the cluster from both)."""
    out: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            out.append(asyncio.run(coroutine()))
        except BaseException as exc:  # handed to the caller's thread, raised there
            errors.append(exc)

    thread = threading.Thread(target=target, name="kafka-cluster-client", daemon=True)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


def _until_answered(ask: Callable[[], T], timeout_s: float = 60.0) -> T:
    """`ask()` again until it answers: right after a topic is made or a node dies, metadata has no
    leader and a coordinator lookup answers 'not available' for a while."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ask()
        except Exception:  # whatever the reason, asked again until the deadline
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class KafkaCluster:
    """`SIZE` nodes, ids 1..SIZE, in `run_dir/node-ID`; a temporary `run_dir` is removed by `close()`."""

    def __init__(
        self,
        distribution: KafkaDistribution | None = None,
        run_dir: Path | None = None,
        extra: Mapping[str, str] | None = None,
        size: int = SIZE,
        heap: str = HEAP,
    ) -> None:
        self.distribution = distribution or KafkaDistribution.default()
        self._own_dir = run_dir is None
        self.run_dir = Path(tempfile.mkdtemp(prefix="kafka-cluster-")) if run_dir is None else run_dir
        ids = range(1, size + 1)
        controller_ports = {node: free_port() for node in ids}
        voters = ",".join(f"{node}@127.0.0.1:{port}" for node, port in controller_ports.items())
        shared = cluster_id()
        self.nodes: dict[int, ApacheKafka] = {
            node: ApacheKafka(
                self.distribution,
                run_dir=self.run_dir / f"node-{node}",
                controller_port=controller_ports[node],
                extra={**CLUSTER_DEFAULTS, **(extra or {})},
                die_with_parent=False,  # restarted from worker threads: see tests/integration/cluster.py
                node_id=node,
                voters=voters,
                cluster=shared,
                heap=heap,
            )
            for node in ids
        }

    @property
    def bootstrap_servers(self) -> str:
        """Every node: a client that starts while one is down still finds the cluster."""
        return ",".join(node.bootstrap_servers for node in self.nodes.values())

    def start(self) -> KafkaCluster:
        """Spawn every stopped node at once, then wait for each (in parallel: ~one node's start-up)."""
        stopped = [node for node in self.nodes.values() if not node.running]
        for node in stopped:
            node.spawn()
        self._each(lambda node: node.wait_ready(), stopped)
        return self

    def _each(self, action: Callable[[ApacheKafka], object], nodes: list[ApacheKafka]) -> None:
        if not nodes:
            return
        with ThreadPoolExecutor(len(nodes)) as pool:
            for future in [pool.submit(action, node) for node in nodes]:
                future.result()

    def kill(self, node: int) -> None:
        """SIGKILL one node (no controlled shutdown: its leaderships move after its broker session)."""
        self.nodes[node].kill()

    def stop(self, node: int) -> None:
        """Stop one node cleanly (controlled shutdown: its leaderships move first)."""
        self.nodes[node].stop()

    def restart(self, node: int, empty: bool = False, kill: bool = False) -> None:
        """Stop (or SIGKILL) one node and start it again: with its log, or on an empty disk, formatted
        into the same cluster, from which it re-replicates its partitions."""
        if kill:
            self.kill(node)
        self.nodes[node].restart(empty=empty)

    def running(self) -> list[int]:
        return [node_id for node_id, node in self.nodes.items() if node.running]

    def log_tails(self, chars: int = 3000) -> str:
        return "\n".join(f"=== node {i}\n{node.log_tail(chars)}" for i, node in self.nodes.items())

    def create_topics(self, names: list[str], partitions: int) -> None:
        from kafka_scorer.kafka.admin import create_topics

        _run(lambda: create_topics(self.bootstrap_servers, names, partitions, replication=len(self.nodes)))

    def add_partitions(self, topic: str, total: int) -> None:
        """Grow `topic` to `total` partitions, live (what an operator does for more parallelism)."""
        _run(lambda: _add_partitions(self.bootstrap_servers, topic, total))

    def leader_of(self, topic: str, partition: int) -> int:
        """The node that leads `topic[partition]` now (fresh metadata)."""
        return _until_answered(lambda: _run(lambda: _leader(self.bootstrap_servers, topic, partition)))

    def group_coordinator(self, group: str) -> int:
        return _until_answered(lambda: _run(lambda: _coordinator(self.bootstrap_servers, "group", group)))

    def transaction_coordinator(self, transactional_id: str) -> int:
        ask = lambda: _run(lambda: _coordinator(self.bootstrap_servers, "transaction", transactional_id))  # noqa: E731
        return _until_answered(ask)

    def close(self) -> None:
        """Stop every node, and remove the run directory when this object made it."""
        self._each(lambda node: node.stop(), list(self.nodes.values()))
        if self._own_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


async def _leader(bootstrap: str, topic: str, partition: int) -> int:
    from aiokafka import AIOKafkaClient
    from aiokafka.structs import TopicPartition

    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        client.add_topic(topic)
        await client.force_metadata_update()
        leader = client.cluster.leader_for_partition(TopicPartition(topic, partition))
        if leader is None or leader < 0:
            raise LookupError(f"{topic}[{partition}] has no leader now")
        return int(leader)
    finally:
        await client.close()


async def _add_partitions(bootstrap: str, topic: str, total: int) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_partitions({topic: NewPartitions(total_count=total)})
    finally:
        await admin.close()


async def _coordinator(bootstrap: str, kind: str, key: str) -> int:
    from aiokafka import AIOKafkaClient
    from aiokafka.client import CoordinationType

    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        which = CoordinationType.GROUP if kind == "group" else CoordinationType.TRANSACTION
        return int(await client.coordinator_lookup(which, key))
    finally:
        await client.close()
