"""What an aiokafka consumer knows of each partition assigned to it, read from its subscription state.

`position()` can block while a position is being reset, and the worker's consumer and the client's
reply reader look on every poll, so both read the subscription state instead: one place that relies on
this private part of aiokafka (fenced_commit.py reads the group's generation on its own).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from aiokafka.client import ConnectionGroup

from kafka_scorer.kafka.log_reset import FetchState, LogResetWatch


def fetch_states(consumer: Any) -> dict[Any, FetchState]:
    """Position, high watermark and fetch timestamp of each assigned partition that has all three."""
    assignment = assignment_of(consumer)
    if assignment is None:
        return {}
    out = {}
    for tp in assignment.tps:
        state = assignment.state_value(tp)
        if state.has_valid_position and state.highwater is not None and state.timestamp is not None:
            out[tp] = FetchState(state.position, state.highwater, state.timestamp, log_of(consumer, tp))
    return out


def log_of(consumer: Any, tp: Any) -> Hashable:
    """Which log the partition's fetches read, as far as the client can tell: its leader and the very
    connection object the fetches run on (a broker restarted on the same address is a new one); None
    while not connected. A new group membership is a new assignment, which the watch forgets anyway.
    Kafka's leader epoch would be the exact answer; aiokafka keeps none."""
    client = consumer._client
    leader = client.cluster.leader_for_partition(tp)
    connection = client._conns.get((leader, ConnectionGroup.DEFAULT)) if leader is not None else None
    if connection is None or not connection.connected():
        return None  # unknown while there is no connection: judged again once there is one
    return (leader, connection)


def positions(consumer: Any) -> dict[Any, int]:
    """The position of each assigned partition that has one."""
    assignment = assignment_of(consumer)
    if assignment is None:
        return {}
    return {
        tp: assignment.state_value(tp).position
        for tp in assignment.tps
        if assignment.state_value(tp).has_valid_position
    }


def assignment_of(consumer: Any) -> Any:
    """aiokafka's current Assignment (a new object at every rebalance); None while there is none."""
    subscription = consumer._subscription.subscription
    return None if subscription is None else subscription.assignment


def report_received(watch: LogResetWatch[Any], consumer: Any, batches: Mapping[Any, Sequence[Any]]) -> None:
    """Tell `watch` how far `batches` (what `getmany` just handed out) reached in each partition, with the
    stamp of the fetch response that carried them: aiokafka fetches no partition that still has records
    waiting, so the stamp read right after `getmany` is theirs (log_reset.py: records prove a log end
    only against their own response)."""
    if not any(batches.values()):
        return
    states = fetch_states(consumer)
    for tp, records in batches.items():
        if records and tp in states:
            watch.received(tp, records[-1].offset, states[tp].fetched_at)
