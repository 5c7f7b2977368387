"""What the cluster tests share: the cluster as a `BrokerInfo`, its topics, and how often to run.

`KAFKA_SCORER_CLUSTER_RUNS` repeats each cluster scenario (default 1: CI runs each once; while developing
a fault fix, 10-50 catches what passes by luck).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from tests.integration.kafka_helpers import BrokerInfo, Topics, unique

RUNS = int(os.environ.get("KAFKA_SCORER_CLUSTER_RUNS", "1"))
# Sessions as a production worker would have them on a cluster (the tests' 1.5 s sessions expire under
# the load of three JVMs on two cores): a member that dies is noticed in 6 s.
SESSION = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500}


@dataclass(frozen=True)
class ClusterBroker(BrokerInfo):
    """The three nodes as one bootstrap list, with the cluster to kill and restart nodes of."""

    cluster: object = None

    def session_settings(self) -> dict[str, int]:
        return dict(SESSION)


def broker_of(cluster) -> ClusterBroker:
    return ClusterBroker(cluster.bootstrap_servers, "apache-kafka-cluster", True, 0, cluster)


async def cluster_topics(cluster, partitions: int) -> Topics:
    """Request and reply topics, replicated on all three nodes, and a group name nobody else uses."""
    topics = Topics(broker_of(cluster), unique("req"), unique("res"), unique("group"), partitions)
    await asyncio.to_thread(cluster.create_topics, [topics.requests, topics.replies], partitions)
    return topics


async def all_up(cluster) -> None:
    """Start any node a test left down (the next test expects three)."""
    if len(cluster.running()) < len(cluster.nodes):
        await asyncio.to_thread(cluster.start)
