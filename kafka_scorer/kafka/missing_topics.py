"""A topic missing from the cluster, said once in the worker's words instead of the Kafka client's flood.

When the request topics vanish (a broker back on an empty disk with auto-creation off, or the topics
deleted), aiokafka asks for their metadata again and again and says `Topic … not found in cluster
metadata` at ERROR each time: 1,447 lines in 20 s (issue 45), burying everything else. The worker
itself needs no action: its group drops the partitions and takes them again once the topics exist. So
the first such line of an episode passes as one WARNING saying what the worker waits for and what to do;
the rest are held back, counted. An episode ends after `QUIET_S` without the line (the topics are back,
or nobody asks): the next one is said again, with how many lines the last one held back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kafka_scorer.config import Settings

CLIENT_LOGGER = "aiokafka.cluster"
MISSING = "Topic %s not found in cluster metadata"  # aiokafka 0.14's words (cluster.py), at ERROR
QUIET_S = 60.0


def waits_for(settings: Settings) -> str:
    """What the worker waits for, and what brings it back, in one clause."""
    if settings.request_topic_pattern:
        topics = f"topics matching {settings.request_topic_pattern!r}"
    else:
        topics = ",".join(settings.request_topics)
    return (
        f"the worker waits for its request topics ({topics}) and its reply topic ({settings.reply_topic}) "
        "to exist and resumes by itself, no restart needed; create them (kafka-topics.sh --create) if a "
        "broker lost them (an empty disk with auto.create.topics.enable=false)"
    )


@dataclass(eq=False)
class MissingTopics(logging.Filter):
    """On aiokafka's cluster logger: its missing-topic line once per episode, as a WARNING that says
    `what`; the rest held back and counted."""

    what: str
    clock: Callable[[], float] = time.monotonic
    held_back: int = 0
    _last: float | None = field(default=None, init=False)
    _logger: logging.Logger | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        super().__init__()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != MISSING:
            return True
        now = self.clock()
        new_episode = self._last is None or now - self._last >= QUIET_S
        self._last = now
        if not new_episode:
            self.held_back += 1
            return False
        before = f" ({self.held_back} such lines held back last time)" if self.held_back else ""
        self.held_back = 0
        topic = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        record.msg, record.args = (
            f"Kafka topic {topic} does not exist in the cluster: {self.what}{before}",
            None,
        )
        record.levelno, record.levelname = logging.WARNING, "WARNING"  # the worker waits: not an error
        return True

    def install(self) -> None:
        self._logger = logging.getLogger(CLIENT_LOGGER)
        self._logger.addFilter(self)

    def remove(self) -> None:
        if self._logger is not None:
            self._logger.removeFilter(self)
            self._logger = None
