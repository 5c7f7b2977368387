"""Kafka records as the rest of the project sees them: the partition a record came from, the parts of a
consumed record that are read, a position the client could not read, and a record to produce.

The worker's job path (worker/envelope.py) and the client name these, never aiokafka's own classes, so
the Kafka client library stays behind this package (tests/test_layout.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from aiokafka import TopicPartition

__all__ = ["Headers", "OutRecord", "RecordLike", "TopicPartition", "Unreadable"]

Headers = list[tuple[str, bytes]]


class RecordLike(Protocol):
    """The parts of a consumed record (aiokafka's ConsumerRecord) the worker reads."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A position the Kafka client could not read a record at (it raised while parsing the batch: a
    header name that is not UTF-8, which the Kafka protocol forbids but a raw client can write).

    The consumer skips past it and hands this stand-in on, so the offset still gets its answer and the
    watermark can pass it; there are no bytes to dead-letter."""

    topic: str
    partition: int
    offset: int
    reason: str
    timestamp: int = -1
    key: bytes | None = None
    value: bytes | None = None
    headers: Sequence[tuple[str, bytes]] = ()


@dataclass(frozen=True, slots=True)
class OutRecord:
    """A record to produce: a result or a dead-letter copy."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers
    result: bool = False  # a result (may be framed for a schema registry), not a dead-letter copy
