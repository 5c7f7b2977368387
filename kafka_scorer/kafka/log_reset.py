"""Seeing, from the fetch responses alone, that a partition's log was reset under the worker.

A broker that lost its data, or a topic deleted and recreated, restarts the log at offset 0 while the
worker still holds its old position. Two signs can show it in the numbers the client sees:
- the position is beyond the log end (the fetch response's high watermark);
- the log end moved backwards: a healthy log only grows.
Either must be seen in two fetch responses in a row before it counts, so one odd response (a
leader's high watermark that lags for a moment) does not throw away a position. Then the position
must come from the broker (consumer.py: its committed offset, else `auto_offset_reset`).

A broker can also report a log end that is simply wrong. The embedded broker did after a restart
(issue 26): a partition holding offsets 0-10 answered every fetch with a log end of 2, the watch
believed it on every poll, and the worker read the same records again and again, forever. So what
the worker acts on is bounded, whatever a broker says:
- records the worker has just been handed contradict a smaller log end: a response that delivers
  offset 10 while saying the log ends at 2 is wrong, never a reset. From then on the partition's log
  end is at least what its records proved, until the broker's own number catches up;
- a reset is acted on once per event: after one, the partition must be seen healthy (position
  within the log end) before another reset counts;
- at most `max_repositions` per partition within `window_s`; past that, a reset is refused (held
  where it is) and said, so a broker that keeps contradicting itself cannot make a loop of it.

Evidence about a log end only ever comes from the log it is about (issue 39). A broker restarted
with an empty log answers the next fetch with a small log end while the worker still hands out the
records it fetched from the broker's previous life: taken as proof, those records said "the new log
end is wrong" and the worker read on past every record the new log held (256 of 1,898 acknowledged
jobs skipped in one run of four). So:
- records prove a log end only against the fetch response that carried them (`received` takes the
  response's stamp, and only the state with that same stamp is judged against them);
- what records proved is forgotten when the log they came from may have changed: the partition's
  leader or the connection the fetches run on (`FetchState.log`; a new group membership is a new
  assignment, forgotten whole); and a proof carried by a response stamped before that change was
  seen never counts under the new log;
- the position itself is evidence from the old log: a fresh log that producers filled past it looks
  like the old one, grown, and reading on from it skips every fresh record below it. So a partition
  whose leader or connection changed is a reset (`new_log_is_reset`, the worker's choice), positioned
  from what the broker holds: on a broker that kept its log that is the group's committed offset, and
  the jobs in flight are read once more (the at-least-once bound), never skipped.

What the numbers cannot show: a topic deleted and recreated behind the same connection, filled past
the old position before the worker's next fetch, looks like the old one, grown; that needs the topic
id (KIP-516), which aiokafka 0.14 neither requests (Metadata v5) nor exposes. The log
start offset would be a third sign, but aiokafka drops it from the fetch response.

Pure Python, no Kafka client: unit-tested in tests/kafka_tests/test_log_reset_watch.py.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

P = TypeVar("P")  # a partition key: aiokafka's TopicPartition in the worker, anything hashable in tests


class Sign(enum.Enum):
    """What a verdict rests on. The consumer acts on it by kind (a new log waits for the restarted
    broker's committed offsets to load; the numbers' signs do not), never by comparing the words."""

    NEW_LOG = "new log"  # the leader or the connection changed: the log may be another
    BEYOND_END = "beyond the end"  # the position past the log end
    MOVED_BACK = "moved back"  # a log end smaller than one seen before
    WRONG_END = "wrong end"  # records delivered past the reported end: that end is wrong, never a reset
    REPLACED = "replaced"  # a record read before an outage is another after it (the client's own check)
    UNPLACED = "unplaced"  # a poll that failed midway drained records from a start it cannot tell


@dataclass(frozen=True, slots=True)
class Reason:
    """A verdict's sign and the words that say it in the log (`str()` gives the words)."""

    sign: Sign
    text: str

    def __str__(self) -> str:
        return self.text


NEW_LOG = Reason(
    Sign.NEW_LOG, "its leader or the connection to it changed (a broker restart): the log may be a new one"
)

MAX_REPOSITIONS = 3
"""Repositionings of one partition acted on within `WINDOW_S`; more are refused."""
WINDOW_S = 600.0


@dataclass(frozen=True, slots=True)
class FetchState:
    """A partition as the last fetch response left it."""

    position: int
    log_end: int  # the response's high watermark
    fetched_at: int  # aiokafka's stamp of that response (wall-clock ms): two states with one are one response
    log: Hashable = None  # which log, as far as the client can tell (subscription.py); None: unknown


@dataclass(frozen=True, slots=True)
class Delivered:
    """How far the records handed out of one partition reached, and the fetch response they came in."""

    fetched_at: int
    end: int  # one past the highest offset handed out


@dataclass(frozen=True, slots=True)
class Verdicts(Generic[P]):
    """What one look at the fetch states decided, each partition with its reason."""

    reset: dict[P, Reason] = field(default_factory=dict)  # to position from the broker, now
    contradicted: dict[P, Reason] = field(default_factory=dict)  # a wrong log end, newly seen: not a reset
    refused: dict[P, Reason] = field(default_factory=dict)  # a reset past the bound: held where it is


@dataclass(slots=True)
class _Partition:
    highest: int | None = None  # the highest log end seen in this log
    suspect_at: int | None = None  # the fetch response that first showed an anomaly
    proven_end: int | None = None  # one past the records proved beyond a smaller reported end
    armed: bool = True  # False after a reset, until the partition is seen healthy again
    log: Hashable = None  # the log the fetch states last came from; None until one is known
    log_since: int = 0  # when `log` was first seen (wall-clock ms): older responses prove nothing in it
    acted_at: deque[float] = field(default_factory=deque)  # when resets were acted on, in the window


class LogResetWatch(Generic[P]):
    """Per partition: the log end seen, what records proved, and resets awaiting proof."""

    def __init__(
        self,
        max_repositions: int = MAX_REPOSITIONS,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),  # the clock of aiokafka's stamps
        new_log_is_reset: bool = True,  # the client's reply reader checks its positions its own way
    ) -> None:
        self._parts: dict[P, _Partition] = {}
        # the records handed out since the last look, of the latest response they came in
        self._received: dict[P, Delivered] = {}
        self._max = max_repositions
        self._window_s = window_s
        self._clock = clock
        self._wall_ms = wall_ms
        self._new_log_is_reset = new_log_is_reset

    def received(self, tp: P, offset: int, fetched_at: int) -> None:
        """The consumer handed out the record at `offset` of `tp`, from the fetch response stamped
        `fetched_at` (before the next `observe`). Only the latest response's records are kept: an older
        one's can prove nothing about the log end the next look judges."""
        seen = self._received.get(tp)
        if seen is None or fetched_at > seen.fetched_at:
            self._received[tp] = Delivered(fetched_at, offset + 1)
        elif fetched_at == seen.fetched_at:
            self._received[tp] = Delivered(fetched_at, max(seen.end, offset + 1))

    def observe(self, states: Mapping[P, FetchState]) -> Verdicts[P]:
        """Judge each partition's latest fetch state against what came before and the records since."""
        verdicts: Verdicts[P] = Verdicts()
        received, self._received = self._received, {}
        for tp, state in states.items():
            part = self._parts.setdefault(tp, _Partition())
            if self._follow_log(part, state) and self._new_log_is_reset:
                part.suspect_at, part.armed = None, True  # a new log is a new event, whatever came before
                self._decide(tp, part, state, NEW_LOG, verdicts)
                if tp in verdicts.reset or tp in verdicts.refused:
                    continue
            reason = self._contradiction(part, state, received.get(tp))
            if reason is not None:
                verdicts.contradicted[tp] = reason
            reason = self._anomaly(part, state)
            if reason is None:
                part.suspect_at, part.armed = None, True
                part.highest = max(part.highest if part.highest is not None else 0, self._end(part, state))
            elif part.suspect_at is None or part.suspect_at == state.fetched_at:
                part.suspect_at = state.fetched_at
            else:
                part.suspect_at = None
                self._decide(tp, part, state, reason, verdicts)
        return verdicts

    def forget(self, partitions: Iterable[P]) -> None:
        """A new assignment of these partitions: their positions come from the broker anyway."""
        for tp in partitions:
            self._parts.pop(tp, None)
            self._received.pop(tp, None)

    def reads_from(self, tp: P, log: Hashable) -> bool:
        """Whether `log` (the partition's log as the client names it now) is the one its fetch states were
        last judged in: what the worker read since the partition's last reset came from it. False while
        the log is unknown (no connection) or changed since the last look (the next look repositions the
        partition): no offset goes to a log the worker has not read from (issue 45, a commit of the old
        log's offsets that the restarted, empty broker accepted and the rejoined group read on from).
        A partition not looked at yet since its assignment reads from the log it is connected to now,
        as its first look will find: refusing it made an exactly-once worker drop the first records of
        every assignment unanswered (worker/exactly_once.py `_within_guards`), 7 of 300 jobs lost."""
        part = self._parts.get(tp)
        if part is None:  # not looked at yet since its assignment: what the first look will accept
            return log is not None
        return log is not None and part.log == log

    def log_end(self, tp: P, reported: int) -> int:
        """The partition's log end: the broker's number, or more where records proved it wrong."""
        part = self._parts.get(tp)
        proven = part.proven_end if part is not None else None
        return reported if proven is None else max(reported, proven)

    def _follow_log(self, part: _Partition, state: FetchState) -> bool:
        """A new leader or connection may serve another log (a broker restarted empty on the same
        address): what records proved about the old one no longer holds. True when the log changed; a
        state whose log is unknown (None: no connection right now) changes nothing."""
        if state.log is None:
            return False
        changed = part.log is not None and state.log != part.log
        if changed:
            part.proven_end, part.log_since = None, self._wall_ms()
        part.log = state.log
        return changed

    def _contradiction(
        self, part: _Partition, state: FetchState, delivered: Delivered | None
    ) -> Reason | None:
        """Records just handed out beyond the reported end prove it wrong: remember what they proved.
        Only records of the very response being judged, in the log as it is now, count. Said once per
        partition (None while it goes on), and forgotten once the broker catches up."""
        if part.proven_end is not None and state.log_end >= part.proven_end:
            part.proven_end = None
        if delivered is None or delivered.fetched_at != state.fetched_at or state.fetched_at < part.log_since:
            return None
        received = delivered.end
        if received <= state.log_end:
            return None
        first = part.proven_end is None
        part.proven_end = max(part.proven_end or 0, received)
        part.suspect_at = None
        if not first:
            return None
        last = received - 1
        return Reason(
            Sign.WRONG_END,
            f"the broker reports the log end {state.log_end} but delivered records up to offset {last}",
        )

    def _decide(
        self, tp: P, part: _Partition, state: FetchState, reason: Reason, verdicts: Verdicts[P]
    ) -> None:
        if not part.armed:  # the same event as the reset already acted on: not again
            return
        now = self._clock()
        while part.acted_at and now - part.acted_at[0] > self._window_s:
            part.acted_at.popleft()
        if len(part.acted_at) >= self._max:
            part.armed = False  # said once; asked again only after the partition looks healthy
            bound = f"after {len(part.acted_at)} repositionings in {self._window_s:.0f}s (the bound)"
            verdicts.refused[tp] = Reason(reason.sign, f"{reason}, {bound}")
            return
        part.acted_at.append(now)
        part.armed, part.proven_end = False, None
        part.highest = state.log_end
        verdicts.reset[tp] = reason

    @staticmethod
    def _end(part: _Partition, state: FetchState) -> int:
        return state.log_end if part.proven_end is None else max(state.log_end, part.proven_end)

    def _anomaly(self, part: _Partition, state: FetchState) -> Reason | None:
        end = self._end(part, state)
        if state.position > end:
            return Reason(Sign.BEYOND_END, f"position {state.position} is beyond the log end {state.log_end}")
        if part.highest is not None and end < part.highest:
            return Reason(Sign.MOVED_BACK, f"the log end moved back from {part.highest} to {state.log_end}")
        return None
