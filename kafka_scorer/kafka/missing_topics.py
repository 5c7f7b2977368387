"""Request topics missing from the cluster, said once in the worker's words instead of the client's flood.

When the request topics vanish (a broker back on an empty disk with auto-creation off, or the topics
deleted), aiokafka asks for their metadata again and again and says `Topic … not found in cluster
metadata` at ERROR each time: 1,447 lines in 20 s (issue 45), burying everything else, and saying
nothing of what happens next. The worker itself needs no action: its group drops the partitions and
takes them again once the topics exist. So:
- `MissingTopics`, a filter on aiokafka's cluster logger, holds those lines back and counts them;
- `TopicAbsence`, fed the cluster's topics by the consumer every few seconds (kafka/consumer.py
  `cluster_partitions`, which the outage and topic watches call), says once that the worker waits for
  its request topics and what brings them back, and once that they exist again. Its own logger, not
  the client's: the outage filter (outage.py) silences the client while no broker answers, which is
  exactly when a restarted broker's topics go missing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

CLIENT_LOGGER = "aiokafka.cluster"
MISSING = "Topic %s not found in cluster metadata"  # aiokafka 0.14's words (cluster.py), at ERROR


@dataclass(eq=False)
class MissingTopics(logging.Filter):
    """On aiokafka's cluster logger: its missing-topic lines held back, counted."""

    held_back: int = 0
    _logger: logging.Logger | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        super().__init__()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != MISSING:
            return True
        self.held_back += 1
        return False

    def take(self) -> int:
        """The count of held-back lines, reset to zero."""
        count, self.held_back = self.held_back, 0
        return count

    def install(self) -> None:
        self._logger = logging.getLogger(CLIENT_LOGGER)
        self._logger.addFilter(self)

    def remove(self) -> None:
        if self._logger is not None:
            self._logger.removeFilter(self)
            self._logger = None


@dataclass
class TopicAbsence:
    """Says when subscribed topics go missing from the cluster and when they are back, once each."""

    noise: MissingTopics = field(default_factory=MissingTopics)
    missing: frozenset[str] = frozenset()

    def observe(self, cluster: Mapping[str, int], subscribed: Iterable[str]) -> None:
        """`cluster`: every topic with its partition count; `subscribed`: the request topics."""
        now = frozenset(topic for topic in subscribed if not cluster.get(topic))
        if now - self.missing:
            log.warning(
                "request topic(s) %s do not exist in the cluster (deleted, or a broker came back without "
                "its data and auto.create.topics.enable=false): the worker waits for them and resumes by "
                "itself, no restart needed; create them (kafka-topics.sh --create). The Kafka client's "
                "repeated 'not found in cluster metadata' lines are held back meanwhile",
                ",".join(sorted(now - self.missing)),
            )
        back = self.missing - now
        if back:
            log.info(
                "request topic(s) %s exist again (%d Kafka client lines about them held back); the group "
                "assigns their partitions",
                ",".join(sorted(back)),
                self.noise.take(),
            )
        self.missing = now
