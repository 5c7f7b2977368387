"""The reply reader: one consumer on every partition of the reply topic, positioned from the log.

It assigns every partition at its end *before* the first job is produced, so no result can slip past
and no result of an earlier run is read; no consumer group is created on the cluster. Its consumer's
`auto_offset_reset` is `earliest`: a position the broker no longer has (a log deleted under it) is
read again from the log's start, never skipped to its end, since a waiting call's result may be there.

A broker restart must not leave it deaf (issue 26): positions are checked against the log, not kept
from memory.
- A log end below the position (or moving back) in two fetch responses is a reset: the worker's test,
  kafka/log_reset.py, with its guards (once per event, never on a log end the records just fetched
  contradict, a bound per partition), so the reader cannot loop over the same records. The partition
  is read again from the *beginning* of its new log, not its end: every record there was written
  after the reset, a reply to a waiting call may be among them, and replies nobody waits for are
  skipped anyway.
- After a broker outage (the client's broker watch, kafka/outage.py, saw it go and come back), the
  record before each partition's position is looked up again: another record than the one read there,
  one written after the outage began, or none, and the log was replaced (by one that may have grown
  past the old position meanwhile, which the log end cannot show): read from its beginning.
- The topic's partitions are looked up again after either, and every few minutes: a topic recreated
  with more partitions has its new ones read from their beginning.

A record aiokafka cannot parse (a header name that is not UTF-8, written by a raw client) must not end
every waiting call either: the poll hands back what it drained before it raised (kafka/unreadable.py's
`PollStart`; a reply drained from another partition would be lost with the exception otherwise) and is
read again around the record, which is skipped: no call waits for a reply without a correlation id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from kafka_scorer.client.errors import ClientClosed
from kafka_scorer.client.replies import CORRELATION_HEADER, ReplyListener
from kafka_scorer.kafka.log_reset import LogResetWatch, Reason, Sign
from kafka_scorer.kafka.records import Unreadable
from kafka_scorer.kafka.subscription import fetch_states, positions, report_received
from kafka_scorer.kafka.unreadable import PollStart, read_around_unreadable

log = logging.getLogger(__name__)

_POLL_MS = 200
_MAX_RECORDS = 500
_PARTITIONS_EVERY_S = 120.0
_PROBE_WAIT_MS = 2000


class ReplyReader:
    """Reads the reply topic into a `ReplyListener` until cancelled."""

    def __init__(
        self,
        consumer: Any,
        topic: str,
        listener: ReplyListener,
        *,
        new_consumer: Callable[[], Any],
        broker_ready: Callable[[], bool] = lambda: True,
    ) -> None:
        """`new_consumer` builds an unstarted consumer like `consumer` (for looking a record up after
        an outage); `broker_ready` is False while the client's broker watch sees an outage."""
        self._consumer = consumer
        self.topic = topic
        self._listener = listener
        self._new_consumer = new_consumer
        self._broker_ready = broker_ready
        # a reconnect alone is no reset here: the outage check below reads the partitions' places again
        self._resets: LogResetWatch[Any] = LogResetWatch(new_log_is_reset=False)
        self.resets = 0
        """Partitions read again from the beginning of a new log since the client started."""
        self._last_read: dict[Any, tuple[int, int, bytes | None]] = {}  # tp -> offset, timestamp, id
        self._partitions_at = time.monotonic()
        self._before_outage: dict[Any, tuple[int, int]] | None = None  # tp -> position, fetched_at

    async def listen_from_end(self, partitions: set[int]) -> None:
        """Assign every partition at its current end; call before the first job is produced."""
        from kafka_scorer.kafka.records import TopicPartition

        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        self._consumer.assign(tps)
        for tp, offset in (await self._consumer.end_offsets(tps)).items():
            self._consumer.seek(tp, offset)

    async def run(self) -> None:
        """Read until cancelled; a failure ends every waiting call with `ClientClosed`."""
        try:
            while True:
                await self._poll()
                await self._judge_log_ends()
                await self._follow_outage(self._broker_ready())
                if time.monotonic() - self._partitions_at >= _PARTITIONS_EVERY_S:
                    await self._look_for_partitions()
        except asyncio.CancelledError:
            self._listener.fail(ClientClosed("the client was closed while waiting for a result"))
            raise
        except Exception as exc:
            log.error("reply reader on %s stopped: %r", self.topic, exc)
            failure = ClientClosed(f"the reply reader on {self.topic} stopped: {exc!r}")
            failure.__cause__ = exc
            self._listener.fail(failure)
            raise failure from exc

    async def _follow_outage(self, ready: bool) -> None:
        """At an outage's start, note where each partition stood; at its end, check those places."""
        if not ready and self._before_outage is None:
            self._before_outage = {
                tp: (s.position, s.fetched_at) for tp, s in fetch_states(self._consumer).items()
            }
        elif ready and self._before_outage is not None:
            before, self._before_outage = self._before_outage, None
            await self._after_outage(before)

    async def _poll(self) -> None:
        """Deliver one fetch's records; tell the reset watch how far each partition was read."""
        start = PollStart.of(self._consumer, seeks=0)  # the reader seeks only between its polls
        try:
            batches = await self._consumer.getmany(timeout_ms=_POLL_MS, max_records=_MAX_RECORDS)
        except UnicodeDecodeError:
            self._hand_back(start)
            batches = await read_around_unreadable(self._consumer, _POLL_MS, _MAX_RECORDS)
        report_received(self._resets, self._consumer, batches)
        for tp, records in batches.items():
            readable = [r for r in records if not isinstance(r, Unreadable)]  # no reply: no correlation id
            for record in readable:
                self._listener.deliver(record)
            if readable:
                last = readable[-1]
                self._last_read[tp] = (last.offset, last.timestamp, _correlation(last))

    def _hand_back(self, start: PollStart) -> None:
        """The failed poll's partitions back where it began; one that got its first position during
        the poll (reset to its log's start) is read from its log's start again."""
        for tp in start.hand_back(self._consumer, seeks=0):
            self._consumer.seek(tp, 0)

    async def _judge_log_ends(self) -> None:
        """The worker's reset test (kafka/log_reset.py) on the latest fetch responses."""
        states = fetch_states(self._consumer)
        verdicts = self._resets.observe(states)
        for tp, reason in verdicts.contradicted.items():
            log.warning("reply topic %s[%d]: %s; that log end is wrong, not a reset: read on", *tp, reason)
        for tp, reason in verdicts.refused.items():
            log.error(
                "reply topic %s[%d]: %s: not read again; if the log really was reset, restart the client",
                *tp,
                reason,
            )
        await self._read_again(verdicts.reset)

    async def _read_again(self, partitions: dict[Any, Reason]) -> None:
        """Read these partitions from the beginning of their new log (`auto_offset_reset` earliest)."""
        if not partitions:
            return
        for tp, why in partitions.items():
            log.warning(
                "reply topic %s[%d]: %s (the broker lost its data, or the topic was recreated); reading "
                "its new log from the beginning so no result is missed",
                tp.topic,
                tp.partition,
                why,
            )
            self._consumer.seek(tp, 0)
            self._last_read.pop(tp, None)
            if self._before_outage is not None:
                self._before_outage.pop(tp, None)  # read again already: nothing to check after the outage
        self.resets += len(partitions)
        await self._look_for_partitions()

    async def _after_outage(self, before: dict[Any, tuple[int, int]]) -> None:
        """The broker is back: is the record before each partition's position still the one it was?"""
        replaced = {}
        for tp, (position, fetched_at) in before.items():
            if position > 0 and await self._replaced(tp, position - 1, fetched_at):
                why = f"offset {position - 1}, the record before its position, was replaced"
                replaced[tp] = Reason(Sign.REPLACED, why)
        await self._read_again(replaced)
        if not replaced:
            await self._look_for_partitions()

    async def _replaced(self, tp: Any, offset: int, fetched_at: int) -> bool:
        """True when the log no longer holds the record it held at `offset` before the outage: another
        record than the one read there, one written after the last fetch before the outage
        (`fetched_at`, ms), or a log that ends before it. False when it does or when that cannot be
        told (a failed lookup leaves the position to the log-end test)."""
        read = self._last_read.get(tp)
        probe = self._new_consumer()
        try:
            await probe.start()
            probe.assign([tp])
            probe.seek(tp, offset)
            got = await probe.getmany(tp, timeout_ms=_PROBE_WAIT_MS)
            for record in got.get(tp, []):
                if record.offset != offset:
                    continue
                if read is not None and read[0] == offset:
                    return (record.timestamp, _correlation(record)) != read[1:]
                return record.timestamp > fetched_at
            log_end = probe.highwater(tp)
            return log_end is not None and log_end <= offset
        except Exception as exc:  # a lookup is best effort: the log-end test still guards the position
            log.debug("reply topic %s[%d]: could not look up offset %d (%r)", *tp, offset, exc)
            return False
        finally:
            with contextlib.suppress(Exception):
                await probe.stop()

    async def _look_for_partitions(self) -> None:
        """Assign partitions the topic gained (a topic recreated with more), read from their start."""
        from kafka_scorer.kafka.records import TopicPartition

        self._partitions_at = time.monotonic()
        try:
            cluster = await self._consumer._client.fetch_all_metadata()
        except Exception as exc:  # asked again later; the assigned partitions are read meanwhile
            log.debug("reply topic %s: partitions not looked up (%r)", self.topic, exc)
            return
        known = self._consumer.assignment()
        now = {TopicPartition(self.topic, p) for p in cluster.partitions_for_topic(self.topic) or ()}
        if now <= known:
            return
        at = positions(self._consumer)
        self._consumer.assign(sorted(known | now))
        for tp in known | now:
            self._consumer.seek(tp, at.get(tp, 0))
        log.info("reply topic %s: now reading %d partitions", self.topic, len(known | now))


def _correlation(record: Any) -> bytes | None:
    return dict(record.headers or ()).get(CORRELATION_HEADER)
