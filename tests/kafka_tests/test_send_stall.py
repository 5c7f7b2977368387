"""The stall of unacknowledged results (kafka/send_stall.py): its age, its reason, its log line."""

from __future__ import annotations

import logging

from kafka_scorer.kafka.send_stall import STALL_S, ReplicaRefusals, SendStall


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_oldest_waiting_send_is_the_stall() -> None:
    clock = Clock()
    stall = SendStall(clock)
    with stall.sending():
        clock.now += 4
        with stall.sending():
            clock.now += STALL_S
            assert stall.seconds() == STALL_S + 4
            assert "not acknowledged" in (stall.reason() or "")
        assert stall.reason() is not None  # the first send still waits
    assert stall.seconds() == 0 and stall.reason() is None


def test_a_short_wait_is_no_stall() -> None:
    clock = Clock()
    stall = SendStall(clock)
    with stall.sending():
        clock.now += STALL_S - 1
        assert stall.reason() is None


def _sender_line(partition: int) -> logging.LogRecord:
    return logging.LogRecord(
        "aiokafka.producer.sender",
        logging.WARNING,
        __file__,
        1,
        "Got error produce response on topic-partition %s, retrying. Error: %s",
        (f"TopicPartition(topic='replies', partition={partition})", "NotEnoughReplicasError"),
        None,
    )


def test_not_enough_replicas_names_the_setting_once_a_minute() -> None:
    clock = Clock()
    stall = SendStall(clock)
    refusals = ReplicaRefusals(stall, clock)
    first = _sender_line(0)
    assert refusals.filter(first)
    line = first.getMessage()
    assert "min.insync.replicas" in line and "'replies'" in line and "kafka-configs" in line
    assert not any(refusals.filter(_sender_line(p)) for p in range(1, 5))  # held back
    clock.now += 61
    again = _sender_line(0)
    assert refusals.filter(again) and "4 such lines held back" in again.getMessage()
    with stall.sending():
        clock.now += STALL_S
        assert "NotEnoughReplicas on replies" in (stall.reason() or "")


def test_other_sender_lines_pass_untouched() -> None:
    refusals = ReplicaRefusals(SendStall())
    record = logging.LogRecord("aiokafka.producer.sender", logging.WARNING, __file__, 1, "other", None, None)
    assert refusals.filter(record) and record.getMessage() == "other"


def test_producers_starting_at_once_leave_the_sender_heard(caplog) -> None:
    """Two producers' start-up attempts overlap and end in crossed order (two workers in one process, a
    producer restarted beside a starting one): each mutes the sender's ERROR lines during its attempt,
    and afterwards the sender's WARNING lines, the NotEnoughReplicas ones that name min.insync.replicas
    among them, are heard again. (The mute once saved and restored the logger's level, and the crossed
    restore left it at CRITICAL: the cluster scenario found no refusal line at all.)"""
    from kafka_scorer.kafka.producer import _sender_errors_muted

    sender = logging.getLogger("aiokafka.producer.sender")
    first, second = _sender_errors_muted(True), _sender_errors_muted(True)
    with caplog.at_level(logging.WARNING):
        first.__enter__()
        second.__enter__()
        sender.error("Unexpected error during InitProducerIdRequest: held back")
        sender.warning("held back? no: a warning passes while muted")
        first.__exit__(None, None, None)
        second.__exit__(None, None, None)
        refusals = ReplicaRefusals(SendStall(Clock()), Clock())
        refusals.install()
        try:
            sender.warning(_sender_line(0).getMessage())
        finally:
            refusals.remove()
    said = [r.getMessage() for r in caplog.records]
    assert not any("InitProducerIdRequest" in line for line in said), said
    assert any("passes while muted" in line for line in said), said
    assert any("results refused" in line and "min.insync.replicas" in line for line in said), said
    assert sender.level == logging.NOTSET and not sender.filters
