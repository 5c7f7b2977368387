"""Where the reply reader reads: positions taken from the log, not remembered across a log reset.

The reply reader has no consumer group: it holds its positions in memory. A broker that lost its data
(the embedded broker keeps everything in memory and starts empty) or a reply topic deleted and
recreated restarts the log at offset 0 while the reader still asks for its old position; the broker
then answers every fetch with nothing and a log end below that position, and every reply written to
the new log goes unread (issue 26: every call timed out for 50-100 s after the broker came back).

The worker's test for that state (worker/log_reset.py: the position beyond the log end in two fetch
responses in a row) is used as it is; what the reader does then differs. It reads the new log from its
*beginning*, not its end: every record there was written after the reset, so a reply to a call that
is still waiting may be among them, and replies nobody waits for are skipped anyway. Acted on once per
reported log end: when records are fetched at or beyond a log end the broker reports, that log end is
proven wrong (the embedded broker under-reports it after some restarts, issue 26 item 1) and is not a
reset, so the reader never loops over the same records.

Pure Python, no Kafka client: unit-tested in tests/client/test_reply_positions.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Generic, TypeVar

from kafka_scorer.worker.log_reset import FetchState, LogResetWatch

P = TypeVar("P")  # a partition key: aiokafka's TopicPartition in the client, anything hashable in tests

__all__ = ["FetchState", "ReplyResets"]


class ReplyResets(Generic[P]):
    """Partitions of the reply topic to read again from the beginning of their (new) log."""

    def __init__(self) -> None:
        self._watch: LogResetWatch[P] = LogResetWatch()
        self._disproved: dict[P, int] = {}  # partition -> a log end that fetched records contradicted
        self.count = 0
        """Resets acted on since the client started."""

    def observe(self, states: Mapping[P, FetchState], fetched_to: Mapping[P, int]) -> dict[P, str]:
        """Partitions whose log was reset (each with why), given the fetch `states` and, per partition,
        one past the highest offset just fetched (`fetched_to`)."""
        for tp, end in fetched_to.items():
            state = states.get(tp)
            if state is not None and end > state.log_end:
                self._disproved[tp] = state.log_end
        for tp, state in states.items():
            if tp in self._disproved and state.log_end != self._disproved[tp]:
                del self._disproved[tp]  # the broker reports another log end now: judge it afresh
        trusted = {tp: s for tp, s in states.items() if self._disproved.get(tp) != s.log_end}
        reset = self._watch.observe(trusted)
        self.count += len(reset)
        return reset

    def forget(self, partitions: list[P]) -> None:
        """Partitions positioned afresh (assigned, or read from the beginning): no suspicion carried."""
        self._watch.forget(partitions)
