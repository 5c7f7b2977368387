"""The one-model assignor on its own: what the leader hands out, and what a member kept out says."""

from __future__ import annotations

import logging

import pytest
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from aiokafka.protocol.metadata import MetadataResponse_v0

from kafka_scorer.kafka.group_model import OneModelAssignor, ServedModel

CAUSAL = ServedModel("./tiny-causal", "sha256:aaaa", "", "causal_lm")
RERANKER = ServedModel("./rr", "sha256:bbbb", "qwen3-reranker", "causal_lm")


def _cluster(topic: str = "scoring-requests", partitions: int = 4) -> ClusterMetadata:
    cluster = ClusterMetadata()
    parts = [(0, p, 0, [0], [0]) for p in range(partitions)]
    cluster.update_metadata(MetadataResponse_v0([(0, "127.0.0.1", 9092)], [(0, topic, parts)]))
    return cluster


def _join(*members: tuple[str, OneModelAssignor | None]) -> dict[str, ConsumerProtocolMemberMetadata]:
    """Each member's JoinGroup metadata; None: a member that states nothing (another version)."""
    return {
        member: (
            assignor.metadata(["scoring-requests"])
            if assignor is not None
            else ConsumerProtocolMemberMetadata(0, ["scoring-requests"], b"")
        )
        for member, assignor in members
    }


def test_only_the_longest_serving_model_gets_partitions() -> None:
    first = OneModelAssignor("kafka-scorer", CAUSAL, since_ms=1_000)
    second = OneModelAssignor("kafka-scorer", RERANKER, since_ms=2_000)
    same_as_first = OneModelAssignor("kafka-scorer", CAUSAL, since_ms=3_000)
    members = _join(("b-second", second), ("a-first", first), ("c-third", same_as_first), ("d-old", None))
    # whichever member leads, the decision is the same
    for leader in (first, second):
        shares = leader.assign(_cluster(), members)
        assert shares["b-second"].partitions() == []
        taken = [tp.partition for m in ("a-first", "c-third", "d-old") for tp in shares[m].partitions()]
        assert sorted(taken) == [0, 1, 2, 3]


def test_a_member_kept_out_says_so_once_and_is_not_ready(caplog: pytest.LogCaptureFixture) -> None:
    first = OneModelAssignor("kafka-scorer", CAUSAL, since_ms=1_000)
    second = OneModelAssignor("kafka-scorer", RERANKER, since_ms=2_000)
    members = _join(("a", first), ("b", second))
    caplog.set_level(logging.INFO, logger="kafka_scorer")
    for _ in range(2):  # a second rebalance with the same verdict adds no line
        shares = first.assign(_cluster(), members)
        first.on_assignment(shares["a"])
        second.on_assignment(shares["b"])
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    # the member that keeps the partitions says once what was kept out of its group
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "also has members serving ./rr" in warnings[0], warnings
    assert "'kafka-scorer' (group_id)" in errors[0] and "./tiny-causal" in errors[0] and "./rr" in errors[0]
    assert "--group-id" in errors[0] and "takes no partitions" in errors[0]
    assert first.ready and not second.ready
    # the other model's workers left: the next rebalance gives this one the partitions
    alone = second.assign(_cluster(), _join(("b", second)))
    second.on_assignment(alone["b"])
    assert second.ready and len(alone["b"].partitions()) == 4
    assert "now serves this worker's model" in caplog.records[-1].getMessage()


def test_members_that_state_nothing_share_as_before() -> None:
    first = OneModelAssignor("g", CAUSAL, since_ms=1)
    shares = first.assign(_cluster(partitions=2), _join(("x", None), ("y", None)))
    assert sorted(len(s.partitions()) for s in shares.values()) == [1, 1]


def test_a_restarted_worker_gets_its_group_back_from_the_model_kept_out() -> None:
    """The CausalLM worker restarts (a later start time) while the reranker waits in the group: the
    waiting member remembers what the group served, so the group stays with the CausalLM."""
    first = OneModelAssignor("g", CAUSAL, since_ms=1_000)
    waiting = OneModelAssignor("g", RERANKER, since_ms=2_000)
    shares = first.assign(_cluster(), _join(("a", first), ("b", waiting)))
    waiting.on_assignment(shares["b"])
    restarted = OneModelAssignor("g", CAUSAL, since_ms=3_000)
    shares = waiting.assign(_cluster(), _join(("b", waiting), ("c", restarted)))
    assert shares["b"].partitions() == [] and len(shares["c"].partitions()) == 4
    # with the CausalLM gone for good, the memory no longer counts: the reranker takes the group
    alone = waiting.assign(_cluster(), _join(("b", waiting)))
    assert len(alone["b"].partitions()) == 4
