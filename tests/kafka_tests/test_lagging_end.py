"""kafka/lagging_end.py: a committed offset above a lagging log end is waited for, not distrusted."""

from __future__ import annotations

from aiokafka.errors import NotLeaderForPartitionError

from kafka_scorer.kafka.lagging_end import end_reaches

TP = ("requests", 0)


class LaggingEnds:
    """`end_offsets` answering each of `answers` in turn (an exception is raised), then the last."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)

    async def end_offsets(self, partitions):
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return {tp: answer for tp in partitions}


async def test_a_failovers_lagging_end_catches_up_with_the_committed_offset() -> None:
    consumer = LaggingEnds(NotLeaderForPartitionError(), 67, 67, 68)
    assert await end_reaches(consumer, TP, 68, wait_s=2.0)


async def test_a_log_that_restarted_never_reaches_it() -> None:
    assert not await end_reaches(LaggingEnds(3), TP, 68, wait_s=0.3)
