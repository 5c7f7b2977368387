"""Readiness that knows whether there is anything to read: the request topics must exist somewhere.

A worker whose `request_topic_pattern` has a typo, or whose `request_topics` nobody created (on a
broker that does not create topics on demand), joins its group, gets no partition, and would look
healthy forever. The group alone cannot tell this apart from a legitimate idle member (more workers
than partitions), so the watch asks the cluster's metadata instead: how many partitions of the
subscribed topics exist in the whole cluster, not in this member's assignment.

What an operator of a Kubernetes Deployment expects (docs/operations.md): the worker keeps running —
topics created a minute later by another deployment must not cost a crash loop — but after
`topic_grace_s` with nothing matched `/readyz` answers 503, so a rollout stalls visibly, and one
WARNING names the setting and the fix (repeated every `_REPEAT_S`). When partitions appear, one INFO
line and readiness comes back. During the grace period readiness is what it was before; the grace
counts from the last time topics matched, not from the start.

The worker asks this watch only while it has no partition (worker/service.py): an assigned partition is proof
enough that there is something to read, whatever a listing says (after an embedded-broker restart a
topic the consumer auto-created was missing from it, and a worker that was scoring answered 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from aiokafka.errors import KafkaError

from kafka_scorer.config import Settings

log = logging.getLogger(__name__)

_REPEAT_S = 600.0
"""How often the warning is repeated while nothing matches: visible in any log window, never a flood."""
_MATCHED_RECHECK_S = 30.0
"""Once matched, a topic deleted later is noticed within this long (one metadata request)."""
_UNMATCHED_RECHECK_S = 5.0


def matching_partitions(cluster: Mapping[str, int], settings: Settings) -> int:
    """Partitions in `cluster` (topic -> partition count) that the worker's subscription covers.

    A pattern matches from the start of the name, as the Kafka client applies it; internal topics
    (`__consumer_offsets`, ...) never count."""
    if settings.request_topic_pattern:
        pattern = re.compile(settings.request_topic_pattern)
        return sum(n for topic, n in cluster.items() if not topic.startswith("__") and pattern.match(topic))
    return sum(cluster.get(topic, 0) for topic in settings.request_topics)


def unmatched_line(settings: Settings, waited_s: float) -> str:
    """The one line naming the setting and the fix."""
    if settings.request_topic_pattern:
        what = f"request_topic_pattern={settings.request_topic_pattern!r} matches no partition"
        fix = (
            "create a matching topic or correct --request-topic-pattern (KAFKA_SCORER_REQUEST_TOPIC_PATTERN)"
        )
    else:
        what = f"request_topics={','.join(settings.request_topics)} exist nowhere in the cluster"
        fix = (
            "create them (kafka-topics.sh --create) or correct --request-topics (KAFKA_SCORER_REQUEST_TOPICS)"
        )
    return f"{what} after {waited_s:.0f}s (topic_grace_s): {fix}; /readyz answers 503 until one exists"


@dataclass
class TopicWatch:
    """Checks the cluster's metadata now and then; `ready` is False only past the grace, unmatched."""

    settings: Settings
    cluster_partitions: Callable[[], Awaitable[Mapping[str, int]]]
    clock: Callable[[], float] = time.monotonic
    ready: bool = True
    _warned_at: float | None = field(default=None, init=False)

    async def run(self, stop: asyncio.Event) -> None:
        since = self.clock()  # the grace counts from the start, or from the last time topics matched
        while not stop.is_set():
            matched = await self._matched()
            if matched is not None:
                self._update(matched, self.clock() - since)
                if matched:
                    since = self.clock()
            grace = max(self.settings.topic_grace_s, 0.2)
            pause = _MATCHED_RECHECK_S if matched else min(_UNMATCHED_RECHECK_S, grace)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)

    async def _matched(self) -> int | None:
        """Matched partitions, or None when the cluster could not be asked (an outage: keep the state)."""
        try:
            return matching_partitions(await self.cluster_partitions(), self.settings)
        except (KafkaError, OSError) as exc:
            log.debug("topic check: metadata unavailable (%r)", exc)
            return None
        except Exception as exc:  # a readiness check must never become the worker's fatal error
            log.warning("topic check failed (%r); readiness left as it was", exc)
            return None

    def _update(self, matched: int, waited_s: float) -> None:
        if matched:
            if not self.ready:
                log.info("request topics now match %d partition(s); ready", matched)
            self.ready, self._warned_at = True, None
            return
        if waited_s < self.settings.topic_grace_s:
            return
        self.ready = False
        now = self.clock()
        if self._warned_at is None or now - self._warned_at >= _REPEAT_S:
            log.warning(unmatched_line(self.settings, waited_s))
            self._warned_at = now
