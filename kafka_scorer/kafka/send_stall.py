"""Results the cluster does not acknowledge: the one outage a metadata probe cannot see.

Two of a partition's three replicas down (with `min.insync.replicas=2`) leaves the cluster answering
metadata requests, so `/readyz` stayed green (kafka/outage.py asks exactly that), while every reply
sent with acks=all failed `NotEnoughReplicas` or waited out the request timeout (40 s) and was retried,
and nothing was answered or committed: a stall that only a WARNING line per retry showed. The worker
must wait (an offset is committed only after its answer is acknowledged), but the operator must see
it: once a send has gone `STALL_S` without an acknowledgement, `/readyz` answers 503 with the broker's
last error, and the `kafka_scorer_send_stalled_seconds` gauge says for how long. The age of the oldest
unacknowledged send is measured, not the time since a failure: with the controller quorum lost a send
fails only after the whole request timeout.

The reason itself: aiokafka retries a `NotEnoughReplicas` answer inside its sender, every 100 ms until
the request timeout, with one WARNING each (400 lines in 40 s) that names the error class and not the
setting. `ReplicaRefusals` holds them back to one a minute that names `min.insync.replicas`, the topic
and the fix (a value equal to the replication factor is the mistake: any broker down stops writes;
Kafka 4.1 caps a value above it at the replication factor, measured).
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

_SENDER_LOG = "aiokafka.producer.sender"
_REPEAT_S = 60.0
_TOPIC = re.compile(r"topic='([^']+)'")

STALL_S = 10.0
"""A send unacknowledged this long is a stall: a leader moving holds sends for a few seconds (up to the
broker's session timeout, 6-9 s), which is no news to an operator."""


@dataclass
class SendStall:
    """The sends now waiting for an acknowledgement (retries included), and the last error seen."""

    clock: Callable[[], float] = time.monotonic
    _pending: dict[int, float] = field(default_factory=dict, init=False)
    _tokens: Iterator[int] = field(default_factory=itertools.count, init=False)
    _last_error: str = field(default="no answer yet", init=False)

    @contextmanager
    def sending(self) -> Iterator[None]:
        """Around one send, from its first try until it is acknowledged or given up."""
        token = next(self._tokens)
        self._pending[token] = self.clock()
        try:
            yield
        finally:
            del self._pending[token]

    def failed(self, exc: BaseException | str) -> None:
        self._last_error = exc if isinstance(exc, str) else repr(exc)

    def seconds(self) -> float:
        """How long the oldest unacknowledged send has waited (0: none waits)."""
        return self.clock() - min(self._pending.values()) if self._pending else 0.0

    def reason(self) -> str | None:
        """Why the worker is not ready (None: no stall)."""
        stalled = self.seconds()
        if stalled < STALL_S:
            return None
        return (
            f"results not acknowledged by the Kafka cluster for {stalled:.0f}s ({self._last_error}): a "
            "partition of the reply topic has fewer in-sync replicas than its min.insync.replicas or no "
            "leader, or the topic is missing; the worker retries, commits nothing meanwhile, and resumes "
            "by itself"
        )


def isr_advice(topic: str) -> str:
    """What to do about a topic whose writes are refused for want of in-sync replicas."""
    return (
        f"topic {topic!r} has fewer in-sync replicas than its min.insync.replicas, so no result sent with "
        "acks=all is acknowledged: bring its replicas' brokers back, and check that min.insync.replicas "
        "is below the replication factor (kafka-topics --describe --topic TOPIC; equal to it, one broker "
        "down stops every write: kafka-configs --alter --entity-type topics --entity-name TOPIC "
        "--add-config min.insync.replicas=2). The worker retries, commits nothing meanwhile, and resumes "
        "by itself"
    )


@dataclass(eq=False)
class ReplicaRefusals(logging.Filter):
    """On aiokafka's sender logger: its `NotEnoughReplicas` retry lines become one WARNING a minute per
    topic naming the setting and the fix, and the stall's reason."""

    stall: SendStall
    clock: Callable[[], float] = time.monotonic
    _shown_at: dict[str, float] = field(default_factory=dict, init=False)  # per topic: each its own line
    _held: dict[str, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        super().__init__()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "NotEnoughReplicas" not in message:
            return True
        found = _TOPIC.search(message)
        topic = found.group(1) if found else "?"
        self.stall.failed(f"NotEnoughReplicas on {topic}")
        now = self.clock()
        shown = self._shown_at.get(topic)
        if shown is not None and now - shown < _REPEAT_S:
            self._held[topic] = self._held.get(topic, 0) + 1
            return False
        held, self._held[topic], self._shown_at[topic] = self._held.get(topic, 0), 0, now
        suffix = f" ({held} such lines held back in the last minute)" if held else ""
        record.msg, record.args = f"producer: results refused: {isr_advice(topic)}{suffix}", None
        record.name, record.levelno, record.levelname = __name__, logging.WARNING, "WARNING"
        return True

    def install(self) -> None:
        logging.getLogger(_SENDER_LOG).addFilter(self)

    def remove(self) -> None:
        logging.getLogger(_SENDER_LOG).removeFilter(self)
