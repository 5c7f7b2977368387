"""One consumer group serves one model: every member says what it serves, and only one model's members
get partitions.

Kafka shares a group's partitions among whoever joins it, whatever they run. Two workers with different
models in one group (a second worker started with the defaults next to the first) would split the
request topic between them, and the jobs that land on the wrong model come back `invalid_request` or,
worse, scored by the wrong checkpoint — with nothing in any log. So each member puts what it serves
(model, revision, template, kind) and when it started serving into its group member metadata (the
`user_data` of the partition assignor, which the group leader sees for every member), and the leader
gives partitions only to the members serving the group's model: the one it served at the last
rebalance while a member still serves it (each member states the last verdict it saw, so a restarted
worker does not lose its group to the model kept out), else that of its longest-serving member. The
others get none; their assignment carries the group's model, so each of them logs one ERROR naming
`group_id` and both models, and its `/readyz` stays 503 until the other model's workers are gone (then
the next rebalance gives it partitions, and it says so). The members that keep the partitions log one
WARNING naming what was kept out, so the first worker's log tells the story as well.

Members that state nothing (another version of this worker, another client under the same protocol)
count as serving any model.

This is the only protocol a worker offers. aiokafka 0.14 sends one JoinGroup per offered assignor, each
naming one more protocol than the last (aio-libs/aiokafka#1168): with a plain round-robin fallback
offered second, every join was followed by another with other metadata, which the broker answers by
starting the rebalance again (`Updating metadata for member … during CompletingRebalance`). Two workers
started together on a three-node cluster never settled (issue 45; tests/integration/test_cluster_group.py).
The price: a member offering only round-robin (no version of this worker does) cannot join the group,
and is told so (`InconsistentGroupProtocolError`, kafka/consumer.py names the setting).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    """What a worker answers jobs with: two members agree only if all four are equal."""

    model: str
    revision: str = ""
    template: str = ""
    kind: str = ""

    @classmethod
    def from_description(cls, description: Mapping[str, str]) -> ServedModel:
        """From the engine's `ServedModel.description` (the start-up `serving ...` line's fields)."""
        return cls(
            model=description.get("model", ""),
            revision=description.get("revision", ""),
            template=description.get("template", ""),
            kind=description.get("kind", ""),
        )

    def __str__(self) -> str:
        template = f"template {self.template}" if self.template else "no template"
        return (
            f"{self.model} ({self.kind or 'kind unknown'}, {template}, revision {self.revision or 'unknown'})"
        )


@dataclass(frozen=True)
class _Claim:
    """One member's user data: what it serves, since when (epoch ms), and what the group served at
    its last assignment (None before its first)."""

    served: ServedModel
    since_ms: int
    group_served: ServedModel | None = None

    def encode(self) -> bytes:
        remembered = asdict(self.group_served) if self.group_served is not None else None
        fields = {"serves": asdict(self.served), "since_ms": self.since_ms, "group_served": remembered}
        return json.dumps(fields, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> _Claim | None:
        """None for a member that states nothing readable (another version, another client)."""
        try:
            fields = json.loads(data)
            remembered = fields.get("group_served")
            return cls(
                _served(fields["serves"]),
                int(fields["since_ms"]),
                _served(remembered) if remembered is not None else None,
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def _served(fields: Mapping[str, object]) -> ServedModel:
    return ServedModel(**{k: str(v) for k, v in fields.items()})


def group_model(claims: Mapping[str, _Claim | None]) -> ServedModel | None:
    """The model the group serves; None when no member states one.

    The group keeps the model it served while a member still serves it: members remember the last
    verdict, so a restarted worker (a fresh `since_ms`) does not hand the group to the model that was
    kept out meanwhile. Without such memory (a new group, or that model's workers all gone), it is the
    model of the longest-serving member. Member ids break ties, so every leader decides alike."""
    stated = {member: claim for member, claim in claims.items() if claim is not None}
    if not stated:
        return None
    present = {claim.served for claim in stated.values()}
    votes = Counter(c.group_served for c in stated.values() if c.group_served in present)
    if votes:
        most = max(votes.values())
        stated = {m: c for m, c in stated.items() if votes.get(c.served) == most}
    return min(stated.items(), key=lambda entry: (entry[1].since_ms, entry[0]))[1].served


def excluded_line(group_id: str, group: ServedModel, mine: ServedModel) -> str:
    """The one ERROR line of a member kept out of its group, naming the setting and the fix."""
    return (
        f"consumer group {group_id!r} (group_id) already serves model {group}; this worker serves "
        f"{mine}, so it takes no partitions and /readyz answers 503: give it its own --group-id "
        "(KAFKA_SCORER_GROUP_ID) and request topic, or stop the other model's workers first"
    )


class OneModelAssignor(AbstractPartitionAssignor):
    """Round-robin among the members that serve the group's model; nothing for the others.

    aiokafka calls `metadata` when this member joins, `assign` on the leader with every member's
    metadata, and `on_assignment` on every member with its share, before the rebalance listener.
    """

    name = "kafka-scorer-one-model"
    version = 0

    def __init__(self, group_id: str, served: ServedModel, since_ms: int | None = None) -> None:
        self.group_id = group_id
        self.served = served
        self.since_ms = int(time.time() * 1000) if since_ms is None else since_ms
        self.group_served: ServedModel | None = None
        """The group's model at this member's last assignment, stated when it joins again."""
        self.serving_elsewhere: ServedModel | None = None
        """The group's model while it differs from ours (this member then gets no partitions)."""
        self.kept_out: tuple[str, ...] = ()
        """What the members kept out of this member's group serve (each described once)."""

    @classmethod
    def serving(cls, group_id: str, description: Mapping[str, str]) -> OneModelAssignor:
        """For a worker whose engine describes itself as `ServedModel.description` does."""
        return cls(group_id, ServedModel.from_description(description))

    def offered(self) -> tuple[object, ...]:
        """What the consumer offers the group: this check alone, one protocol, so aiokafka sends one
        JoinGroup per join (see the module docstring for why a second protocol kept groups from settling)."""
        return (self,)

    @property
    def ready(self) -> bool:
        return self.serving_elsewhere is None

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        claim = _Claim(self.served, self.since_ms, self.group_served)
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), claim.encode())

    def assign(
        self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        claims = {member: _Claim.decode(metadata.user_data) for member, metadata in members.items()}
        chosen = group_model(claims)
        eligible = {
            member: metadata
            for member, metadata in members.items()
            if chosen is None or (claim := claims[member]) is None or claim.served == chosen
        }
        shares = RoundRobinPartitionAssignor.assign(cluster, eligible)
        kept_out = sorted({str(claim.served) for m, claim in claims.items() if claim and m not in eligible})
        verdict = b"" if chosen is None else _Verdict(chosen, tuple(kept_out)).encode()
        return {
            member: ConsumerProtocolMemberAssignment(
                self.version, shares[member].assignment if member in shares else [], verdict
            )
            for member in members
        }

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        verdict = _Verdict.decode(assignment.user_data)
        chosen = verdict.serves if verdict is not None else None
        mine = self.served
        self.group_served = chosen
        kept_out = verdict.kept_out if verdict is not None and chosen == mine else ()
        if kept_out and kept_out != self.kept_out:  # the operator watching this worker's log learns it too
            log.warning(
                "consumer group %r also has members serving %s; they take no partitions (one model per "
                "group)",
                self.group_id,
                "; ".join(kept_out),
            )
        self.kept_out = kept_out
        elsewhere = chosen if chosen is not None and chosen != mine else None
        if elsewhere is not None and elsewhere != self.serving_elsewhere:
            log.error(excluded_line(self.group_id, elsewhere, mine))
        elif elsewhere is None and self.serving_elsewhere is not None:
            log.info(
                "consumer group %r now serves this worker's model %s; taking partitions", self.group_id, mine
            )
        self.serving_elsewhere = elsewhere


@dataclass(frozen=True)
class _Verdict:
    """The leader's decision, in every member's assignment user data: the group's model, and what the
    members kept out of it serve."""

    serves: ServedModel
    kept_out: tuple[str, ...] = ()

    def encode(self) -> bytes:
        return json.dumps({"serves": asdict(self.serves), "kept_out": list(self.kept_out)}).encode()

    @classmethod
    def decode(cls, data: bytes) -> _Verdict | None:
        try:
            fields = json.loads(data)
            return cls(_served(fields["serves"]), tuple(str(line) for line in fields.get("kept_out", ())))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
