"""Topics made on a broker that does not create them on demand the way a test or the bench needs them.

Used where the project sets up its own local broker (the bench, the integration tests): the worker and the
client never create topics; an operator does (docs/operations.md).
"""

from __future__ import annotations


async def create_topics(bootstrap: str, names: list[str], partitions: int, replication: int = 1) -> None:
    """Create `names` with `partitions` each and `replication` replicas (1: the local brokers have one
    node; the test cluster of devtools/kafka_cluster.py has three)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # the admin client is only loaded here

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, replication) for name in names])
    finally:
        await admin.close()
