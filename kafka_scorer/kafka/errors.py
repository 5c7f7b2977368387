"""The Kafka client's errors as the rest of the project names them.

The worker (delivery, rebalance, its start-up) and the client catch these; importing them from here
keeps aiokafka behind this package. What a person is told about each is `kafka_scorer.errors.explain`.
"""

from __future__ import annotations

from aiokafka.errors import (
    KafkaError,
    MessageSizeTooLargeError,
    RecordTooLargeError,
    UnknownError,
    UnknownTopicOrPartitionError,
)

__all__ = [
    "KafkaError",
    "MessageSizeTooLargeError",
    "RecordTooLargeError",
    "UnknownError",
    "UnknownTopicOrPartitionError",
]
