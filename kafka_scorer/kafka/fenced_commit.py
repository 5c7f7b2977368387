"""A commit that is sent only under the group membership its offsets were taken in, once.

aiokafka's `commit()` retries a commit that failed on a broken connection until it goes through, and
each retry carries the membership the consumer has *by then*. After a broker came back without its
data, that is a fresh membership in a fresh group: the retried commit of the old log's offsets is
accepted there, and the member that just rejoined reads on from it, skipping every record of the new
log below it (issue 18 part 4: measured on tansu, every run; tests/integration/test_log_reset.py).

So the worker commits here instead: the membership (generation, member id and aiokafka's assignment
object, which is new after every rebalance) is read when the offsets are handed over, checked again
under aiokafka's commit lock right before the one request is built, and a failure is raised, not
retried. The committer retries on its own schedule, with offsets taken from the watermarks of the
membership it then holds (a lost membership has closed the old ones).

aiokafka has no public API for either step; this reads its coordinator's `generation`, `member_id`,
`_commit_lock` and calls `_do_commit_offsets` (aiokafka 0.14), as consumer.py already reads
`generation`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError
from aiokafka.structs import OffsetAndMetadata


@dataclass(frozen=True)
class Membership:
    """Who this member is in its group now: any rebalance changes at least the assignment."""

    generation: int
    member_id: str
    assignment: Any  # aiokafka's Assignment: it defines no equality, so it compares by identity


def membership_of(consumer: AIOKafkaConsumer) -> Membership | None:
    """The consumer's current membership; None while it has none (not joined, or lost)."""
    coordinator = consumer._coordinator
    subscription = consumer._subscription.subscription
    generation = getattr(coordinator, "generation", -1)
    if generation < 0 or subscription is None or subscription.assignment is None:
        return None
    return Membership(generation, coordinator.member_id, subscription.assignment)


async def commit_within(
    consumer: AIOKafkaConsumer,
    offsets: dict[TopicPartition, int],
    membership: Membership,
    still: Callable[[], bool] = lambda: True,
) -> None:
    """Commit `offsets` in one request if the consumer is still `membership` and `still()` holds (the
    logs the offsets were read from are still the partitions' logs); else `CommitFailedError`. Both
    are asked right before the request: finding the coordinator can wait out a whole broker restart.

    Connection and coordinator errors are raised as aiokafka raises them (the caller retries later);
    a broker that no longer knows the member answers UnknownMemberId, and aiokafka then rejoins."""
    coordinator = consumer._coordinator
    await coordinator.ensure_coordinator_known()
    async with coordinator._commit_lock:
        if membership_of(consumer) != membership:
            raise CommitFailedError(
                "not committed: the group membership these offsets were taken in has changed (a rebalance, "
                "or a broker that lost its groups); their records are the next reader's"
            )
        if not still():
            raise CommitFailedError(
                "not committed: a partition's log changed since these offsets were read (a broker restart); "
                "the partition is read again from what the broker holds"
            )
        await coordinator._do_commit_offsets(
            membership.assignment, {tp: OffsetAndMetadata(offset, "") for tp, offset in offsets.items()}
        )
