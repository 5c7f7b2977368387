"""aiokafka in: the consumer, its rebalance listener, pause/resume and explicit commits.

Auto-commit is off: offsets move only through `commit`, which the delivery layer calls with the
per-partition watermarks (SPEC §7). The rebalance listener hands revoked and assigned partitions to
worker/rebalance.py, which settles in-flight work before aiokafka lets the partitions go.

Pausing is how backpressure reaches the broker: paused partitions are not fetched, but the loop keeps
calling `getmany`, so the member keeps its place in the group (aiokafka #848: a long gap between polls
gets a member evicted).

A log that was reset under the worker (a broker that lost its data, a topic deleted and recreated) must
not receive the old positions: they would make every new record below them look consumed. After a
reset, positions come from what the broker holds, never from the worker's memory. Three guards:
- no commit without group membership, and none outside the membership its offsets were taken in
  (fenced_commit.py): partitions taken away because the membership was lost (the group vanished with
  the broker's data, or the session expired) are *lost*, not revoked, and a commit begun before the
  loss is never sent under the membership the worker rejoins with. A rejoined member's positions are
  then the broker's: its committed offsets, else `auto_offset_reset` (aiokafka's fresh assignment).
- a partition whose position is beyond its log end, or whose log end moved backwards, in two fetch
  responses in a row (log_reset.py), is logged once and positioned from the broker: its committed
  offset where that lies within the log, else `auto_offset_reset`. Once per event and at most
  `MAX_REPOSITIONS` times in `WINDOW_S`; a log end that the records just fetched contradict is the
  broker's error, not a reset (issue 26: the loop that re-scored the same records forever). The end
  is the fetch response's high watermark, never ListOffsets: tansu answers ListOffsets with a number
  far too small once a partition holds multi-record batches (docs/worker.md, "The embedded brokers").
- no commit goes past that watermark (or past the records fetched, where they proved it too small),
  and none to a log the worker has not read from: a partition's offsets are committed only while its
  fetches still run on the connection its records came from, asked again right before the request
  (issue 45: nothing from before a broker's restart counts for the log after it; a commit can wait out
  a whole restart for its coordinator, and a broker that accepted it from a member it no longer knows
  would hand the old log's offsets to the group that rejoins the new one).

Every seek is safe against the rebalance that may revoke the partition meanwhile (positioning.py): a
revoked partition is dropped, never reset.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    InconsistentGroupProtocolError,
    InvalidSessionTimeoutError,
    KafkaError,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
)

from kafka_scorer.config import Settings
from kafka_scorer.errors import FatalError
from kafka_scorer.kafka.connection import client_options
from kafka_scorer.kafka.fenced_commit import Membership, commit_within, membership_of
from kafka_scorer.kafka.log_reset import LogResetWatch, Reason, Sign, Verdicts
from kafka_scorer.kafka.missing_topics import TopicAbsence
from kafka_scorer.kafka.positioning import Positioner
from kafka_scorer.kafka.records import Unreadable
from kafka_scorer.kafka.retry import UNREACHABLE, Backoff
from kafka_scorer.kafka.subscription import fetch_states, log_of, positions, report_received
from kafka_scorer.kafka.unreadable import PollStart, read_around_unreadable
from kafka_scorer.kafka.visible_commit import seek_when_visible

log = logging.getLogger(__name__)

_COMMITTED_WAIT_S = 5.0  # longest the poll loop waits for a reset partition's committed offset
_NEW_LOG_SETTLE_S = 3.0  # after a broker restart: how long "nothing committed" is asked again
_UNPLACED = Reason(Sign.UNPLACED, "a poll that failed midway drained records from a position it cannot tell")

# Errors after which this member can never (re)join its group or read its topics: what the operator must
# change, by the setting it concerns.
_MEMBERSHIP_FATAL: dict[type[KafkaError], str] = {
    GroupAuthorizationFailedError: "grant this worker's principal Read on the group (setting: group_id)",
    TopicAuthorizationFailedError: "grant this worker's principal Read on the request topics "
    "(setting: request_topics)",
    InvalidSessionTimeoutError: "the broker refuses this session timeout; use one inside the broker's "
    "group.min/max.session.timeout.ms (setting: session_timeout_ms)",
    InconsistentGroupProtocolError: "another kind of consumer uses this group id; give the workers their "
    "own (setting: group_id)",
}


class FatalConsumerError(FatalError):
    """The consumer lost its group membership, or its topics, for good: the worker must stop."""


def _membership_fatal(exc: KafkaError) -> FatalConsumerError | None:
    """The error as one line naming what the operator must change, where it is one of those."""
    fix = next((fix for kind, fix in _MEMBERSHIP_FATAL.items() if isinstance(exc, kind)), None)
    return None if fix is None else FatalConsumerError(f"consumer cannot (re)join its group: {exc!r}; {fix}")


class PartitionListener(Protocol):
    """Who settles work when partitions go and come (worker/rebalance.py)."""

    async def on_revoked(self, revoked: set[TopicPartition]) -> None: ...

    async def on_assigned(self, assigned: set[TopicPartition]) -> None: ...


class _Listener(ConsumerRebalanceListener):
    """aiokafka awaits these before leaving / after joining the group."""

    def __init__(self, listener: PartitionListener, resets: LogResetWatch[TopicPartition]) -> None:
        self._listener = listener
        self._resets = resets
        self.joined = False  # an assignment (empty or not) has come: the member is in its group

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self._listener.on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        partitions = set(assigned)
        self._resets.forget(partitions)  # a fresh assignment: aiokafka positions it from the broker
        await self._listener.on_assigned(partitions)
        self.joined = True


class JobConsumer:
    def __init__(
        self,
        settings: Settings,
        assignors: tuple[object, ...] = (RoundRobinPartitionAssignor,),  # group_model.py offers its own
    ) -> None:
        self._settings = settings
        options: dict[str, Any] = client_options(settings)
        fetch_bytes = max(1 << 20, settings.max_message_bytes + (1 << 20))  # one largest record fits a fetch
        self._consumer = AIOKafkaConsumer(
            **options,
            group_id=settings.group_id,
            group_instance_id=settings.group_instance_id,
            enable_auto_commit=False,
            auto_offset_reset=settings.auto_offset_reset,
            fetch_max_wait_ms=settings.fetch_max_wait_ms,
            max_partition_fetch_bytes=fetch_bytes,
            fetch_max_bytes=max(fetch_bytes, 50 << 20),
            session_timeout_ms=settings.session_timeout_ms,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            max_poll_interval_ms=settings.max_poll_interval_ms,
            isolation_level="read_committed" if settings.delivery == "exactly_once" else "read_uncommitted",
            partition_assignment_strategy=assignors,
        )
        self._resets: LogResetWatch[TopicPartition] = LogResetWatch()
        self._absence = TopicAbsence()  # request topics gone from the cluster, said once (missing_topics.py)
        self._listener: _Listener | None = None
        self._seeks = 0  # seeks made from the worker's other tasks (a poll that fails must know of them)
        self._unplaced: set[TopicPartition] = set()  # a failed poll's partitions to position afresh

    async def start(self, listener: PartitionListener) -> None:
        """Subscribe and connect, retrying with backoff while the cluster cannot be reached."""
        s = self._settings
        forward = self._listener = _Listener(listener, self._resets)
        if s.request_topic_pattern:
            self._consumer.subscribe(pattern=s.request_topic_pattern, listener=forward)
        else:
            self._consumer.subscribe(topics=s.request_topics, listener=forward)
        self._absence.noise.install()
        backoff = Backoff()
        while True:
            try:
                await self._consumer.start()
                return
            except UNREACHABLE as exc:
                log.warning("consumer: broker %s unreachable (%r); retrying", s.bootstrap_servers, exc)
                await backoff.sleep()
            except KafkaError as exc:  # a topic the principal may not read fails the start itself
                fatal = _membership_fatal(exc)
                if fatal is None:
                    raise
                raise fatal from exc

    async def stop(self) -> None:
        """Leave the group (the revoke callback runs first) and close."""
        try:
            await self._consumer.stop()
        except KafkaError as exc:
            log.warning("consumer stop: %r", exc)
        finally:
            self._absence.noise.remove()

    async def fetch(
        self, timeout_ms: int, max_records: int
    ) -> dict[TopicPartition, list[ConsumerRecord | Unreadable]]:
        """One poll. Broker trouble is logged and reads as an empty poll; the loop keeps going. A poll
        that raises hands back what it drained before raising (unreadable.py's `PollStart`)."""
        got: dict[TopicPartition, list[ConsumerRecord | Unreadable]] = {}
        start = PollStart.of(self._consumer, self._seeks)
        try:
            got = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        except UnicodeDecodeError:
            self._hand_back(start)
            got = await read_around_unreadable(self._consumer, timeout_ms, max_records)
        except RecordTooLargeError as exc:  # aiokafka skips the record; nothing left to answer it with
            self._hand_back(start)
            log.error("consumer: record skipped, larger than the fetch size: %s", exc)
        except KafkaError as exc:
            self._hand_back(start)
            fatal = _membership_fatal(exc)
            if fatal is not None:
                raise fatal from exc
            if self._coordination_dead():
                raise FatalConsumerError(f"consumer's group coordination stopped for good: {exc!r}") from exc
            log.warning("consumer: poll failed (%r); retrying", exc)
        got = self._not_overtaken(got)
        report_received(self._resets, self._consumer, got)  # what the records prove about each log end
        return got

    def _hand_back(self, start: PollStart) -> None:
        """`start.hand_back`; the partitions it cannot place wait for the next look at the log resets
        (`reposition_reset_logs`), which positions them from the broker and restarts their watermarks."""
        unplaced = start.hand_back(self._consumer, self._seeks)
        if unplaced:
            self._consumer.pause(*unplaced)  # nothing more from them until they are positioned
            self._unplaced |= unplaced

    def _not_overtaken(
        self, got: dict[TopicPartition, list[ConsumerRecord | Unreadable]]
    ) -> dict[TopicPartition, list[ConsumerRecord | Unreadable]]:
        """`got` less the records a seek made while the poll was under way will hand out again.

        An exactly-once rewind, or a repositioning after a log reset, seeks from another task while
        `getmany` waits: the records it then returns were fetched from the position before the seek, and
        the partition reads them again from the new one. Taken into the watermark the rewind just made,
        such a record ran ahead of the records between the new position and itself; answered first, it
        let the commit pass them before they were read again (exactly-once lost jobs under repeated
        SIGKILLs). A record at or past the partition's position now is such a record: dropped here,
        it is answered when it comes again."""
        if not any(got.values()):
            return got
        now = positions(self._consumer)
        out: dict[TopicPartition, list[ConsumerRecord | Unreadable]] = {}
        for tp, records in got.items():
            position = now.get(tp)
            kept = records if position is None else [r for r in records if r.offset < position]
            if len(kept) < len(records):
                log.info(
                    "%s[%d]: %d records fetched before a seek to %s dropped; they are read again from there",
                    *tp,
                    len(records) - len(kept),
                    position,
                )
            out[tp] = kept
        return out

    @property
    def _positions(self) -> Positioner:
        return Positioner(self._consumer, self._settings.auto_offset_reset)

    def _coordination_dead(self) -> bool:
        """aiokafka's group coordination task ended: the member will never rejoin by itself."""
        task = getattr(self._consumer._coordinator, "_coordination_task", None)
        return task is not None and task.done()

    def assignment(self) -> set[TopicPartition]:
        return set(self._consumer.assignment())

    async def cluster_partitions(self) -> dict[str, int]:
        """Every topic of the cluster with its partition count (one Metadata request for all topics;
        creates none). For the readiness checks (kafka/topic_watch.py, outage.py), which call it every
        few seconds: request topics gone from the cluster are said once, and once back, the client's
        own metadata is refreshed so the group takes them (missing_topics.py)."""
        cluster = await self._consumer._client.fetch_all_metadata()
        counts = {topic: len(cluster.partitions_for_topic(topic) or ()) for topic in cluster.topics()}
        subscription = self._consumer._subscription.subscription
        if subscription is not None:
            self._absence.observe(counts, subscription.topics)
        await self._notice_returned_topics(counts)
        return counts

    async def _notice_returned_topics(self, cluster: dict[str, int]) -> None:
        """A subscribed topic the cluster has (recreated after a broker lost it) with more partitions than
        the client's own metadata knows: refresh that metadata now, so the group takes the partitions.
        Once the group has no partition to fetch, aiokafka refreshes it only every
        `metadata_max_age_ms` (5 minutes): the worker waited that long for topics recreated 20 s after
        the broker came back (issue 45). The outage and topic watches call this every few seconds."""
        subscription = self._consumer._subscription.subscription
        if subscription is None:
            return
        known = self._consumer._client.cluster
        pattern = self._settings.request_topic_pattern
        wanted = set(subscription.topics) | (
            {t for t in cluster if not t.startswith("__") and re.match(pattern, t)} if pattern else set()
        )
        if any(cluster.get(t, 0) > len(known.partitions_for_topic(t) or ()) for t in wanted):
            await self._consumer._client.force_metadata_update()

    def pause(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        tps = self.assignment() if partitions is None else set(partitions) & self.assignment()
        if tps:
            self._consumer.pause(*tps)

    def resume(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        tps = self.assignment() if partitions is None else set(partitions) & self.assignment()
        tps -= self._unplaced  # a failed poll's: resumed once positioned (`reposition_reset_logs`)
        if tps:
            self._consumer.resume(*tps)

    def paused(self) -> set[TopicPartition]:
        return set(self._consumer.paused())

    @property
    def joined(self) -> bool:
        """True once the group has given this member an assignment (possibly empty): it consumes."""
        return self._listener is not None and self._listener.joined

    @property
    def membership_lost(self) -> bool:
        """True while this member has no generation in the group (lost it, or not joined yet)."""
        return getattr(self._consumer._coordinator, "generation", -1) < 0

    def membership(self) -> Membership | None:
        """This member's place in its group now (fenced_commit.py); None while it has none."""
        return membership_of(self._consumer)

    async def seek_when_visible(
        self, floors: dict[TopicPartition, int], timeout_s: float
    ) -> dict[TopicPartition, int]:
        """Position these partitions from the group's committed offset once it reaches each floor
        (visible_commit.py: a transaction's offsets show in the group a moment after its commit)."""
        self._seeks += 1  # before and after: a poll that overlaps any part of it sees the count move
        try:
            return await seek_when_visible(self._consumer, floors, timeout_s)
        finally:
            self._seeks += 1

    def committable(self, offsets: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The offsets that may be committed now: partitions still assigned (a revoked one is the new
        owner's), only while a member of the group, never beyond the last fetched high watermark."""
        if self.membership_lost:
            return {}
        assigned = self.assignment()
        out = {}
        for tp, offset in offsets.items():
            if not self._reads_current_log(tp):  # a log the worker has not read from takes no offset
                continue
            log_end = self._consumer.highwater(tp) if tp in assigned else None
            if log_end is not None:  # where records proved the broker's number too small, theirs
                log_end = self._resets.log_end(tp, log_end)
            if tp in assigned and (log_end is None or offset <= log_end):
                out[tp] = offset
        return out

    async def commit(self, offsets: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Commit what `committable` allows of `offsets`, only under the membership they were taken in
        (fenced_commit.py); returns what was committed."""
        membership = membership_of(self._consumer)
        if membership is None:
            return {}
        mine = self.committable(offsets)
        if mine:
            await commit_within(
                self._consumer, mine, membership, lambda: all(self._reads_current_log(tp) for tp in mine)
            )
        return mine

    def _reads_current_log(self, tp: TopicPartition) -> bool:
        """The partition's fetches still read the log its offsets were read from (kafka/log_reset.py)."""
        return self._resets.reads_from(tp, log_of(self._consumer, tp))

    async def reposition_reset_logs(self) -> Verdicts[TopicPartition]:
        """Partitions whose log was reset under the worker (log_reset.py: beyond the log end, or a log
        end that moved back, in two fetch responses; once per event, within a bound), now positioned
        from the broker; the caller restarts their watermarks and counts every verdict."""
        states = fetch_states(self._consumer)
        verdicts = self._resets.observe(states)
        for tp in self._unplaced & self.assignment():  # a failed poll's, as if reset (`_hand_back`)
            verdicts.reset.setdefault(tp, _UNPLACED)
        self._unplaced.clear()
        for tp, reason in verdicts.contradicted.items():
            log.warning(
                "%s[%d]: %s; that log end is wrong, not a reset: the partition reads on from %d",
                *tp,
                reason,
                states[tp].position,
            )
        for tp, reason in verdicts.refused.items():
            log.error(
                "%s[%d]: %s: not repositioned again, it reads on from %d; if the log really was reset, "
                "restart the worker",
                *tp,
                reason,
                states[tp].position,
            )
        # together: after a broker restart every partition may wait out the settling at once, not in turn
        reasons = list(verdicts.reset.items())
        ends = {tp: state.log_end for tp, state in states.items()}
        done = await asyncio.gather(*(self._reposition(tp, why, ends.get(tp)) for tp, why in reasons))
        for (tp, _), positioned in zip(reasons, done, strict=True):
            if not positioned:  # revoked meanwhile: its watermark closed with it, its next owner reads it
                del verdicts.reset[tp]
        return verdicts

    async def _reposition(self, tp: TopicPartition, reason: Reason, log_end: int | None) -> bool:
        """One reset partition, positioned from the broker (said in one line); never hangs the loop.
        False when a rebalance revoked it meanwhile: dropped, not reset (kafka/positioning.py)."""
        cause = (
            "" if reason.sign is Sign.UNPLACED else " (the broker lost its data, or the topic was recreated)"
        )
        log.warning(
            "%s[%d]: %s%s; positioning it from the group's committed offset, else the %s offset "
            "(auto_offset_reset), and restarting its watermark",
            tp.topic,
            tp.partition,
            reason,
            cause,
            self._settings.auto_offset_reset,
        )
        settle_s = _NEW_LOG_SETTLE_S if reason.sign is Sign.NEW_LOG else 0.0
        positioned = await self._positions.from_broker(
            tp, within=log_end, settle_s=settle_s, wait_s=_COMMITTED_WAIT_S
        )
        if not positioned:
            log.info(
                "%s[%d]: revoked by a rebalance while it was being repositioned: dropped, not reset (its "
                "next assignment is positioned from the group's committed offset)",
                *tp,
            )
        return positioned

    def lag(self, committed: dict[TopicPartition, int | None]) -> dict[tuple[str, int], int]:
        """Per assigned partition: the last fetch's high watermark minus `committed` (or minus the
        position where nothing is committed yet): the records this worker has not settled."""
        out = {}
        for tp, state in fetch_states(self._consumer).items():
            done = committed.get(tp)
            end = self._resets.log_end(tp, state.log_end)
            out[(tp.topic, tp.partition)] = max(0, end - (state.position if done is None else done))
        return out

    async def rewind(self, partitions: Iterable[TopicPartition]) -> None:
        """Seek to the committed offsets (exactly-once: redo the work of an aborted transaction); a
        partition revoked meanwhile is dropped, its next owner redoes it."""
        self._seeks += 1
        try:
            for tp in partitions:
                await self._positions.from_broker(tp)
        finally:
            self._seeks += 1
