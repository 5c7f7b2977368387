"""Commit watermarks over out-of-order completions (SPEC §7: commits never pass an unanswered record)."""

from __future__ import annotations

import random

import pytest

from kafka_scorer.kafka.offsets import OffsetTracker, Watermark


def test_watermark_waits_for_the_oldest_unanswered_record() -> None:
    mark = Watermark()
    for offset in range(10, 15):
        mark.received(offset)
    assert mark.commit_offset() == 10
    mark.answered(12)
    mark.answered(11)
    assert mark.commit_offset() == 10  # 10 still open: nothing may be committed past it
    mark.answered(10)
    assert mark.commit_offset() == 13  # 10, 11, 12 done; 13 is next to read
    mark.answered(14)
    assert mark.commit_offset() == 13
    mark.answered(13)
    assert mark.commit_offset() == 15
    assert mark.unanswered == 0


def test_gaps_in_offsets_are_jumped() -> None:
    """Compaction and transaction markers leave holes; a hole must not block the watermark."""
    mark = Watermark()
    for offset in (3, 7, 8, 20):
        mark.received(offset)
    mark.answered(3)
    assert mark.commit_offset() == 7
    mark.answered(8)
    mark.answered(7)
    assert mark.commit_offset() == 20
    mark.answered(20)
    assert mark.commit_offset() == 21


def test_empty_watermark_has_nothing_to_commit() -> None:
    assert Watermark().commit_offset() is None


def test_offsets_must_increase() -> None:
    mark = Watermark()
    mark.received(5)
    with pytest.raises(ValueError):
        mark.received(5)


def test_random_completion_order_never_commits_past_an_open_record() -> None:
    rng = random.Random(7)
    offsets = sorted(rng.sample(range(1000), 200))
    mark = Watermark()
    for offset in offsets:
        mark.received(offset)
    order = offsets[:]
    rng.shuffle(order)
    answered: set[int] = set()
    for offset in order:
        mark.answered(offset)
        answered.add(offset)
        open_offsets = [o for o in offsets if o not in answered]
        expected = open_offsets[0] if open_offsets else offsets[-1] + 1
        assert mark.commit_offset() == expected
    assert mark.unanswered == 0


def test_closed_watermark_ignores_late_completions() -> None:
    """A batch that finishes after its partition was revoked must not move any commit."""
    tracker: OffsetTracker[str] = OffsetTracker()
    tracker.assign(["p0"])
    old = tracker.watermark("p0")
    old.received(0)
    old.received(1)
    tracker.revoke(["p0"])
    assert old.closed
    assert old.answered(0) is False
    tracker.assign(["p0"])  # the partition comes back: a fresh watermark, untouched by the old one
    assert tracker.watermark("p0") is not old
    assert tracker.to_commit() == {}


def test_tracker_reports_only_moved_offsets() -> None:
    tracker: OffsetTracker[str] = OffsetTracker()
    tracker.assign(["a", "b"])
    for offset in range(3):
        tracker.watermark("a").received(offset)
        tracker.watermark("b").received(offset)
    tracker.watermark("a").answered(0)
    tracker.watermark("b").answered(1)
    assert tracker.to_commit() == {"a": 1, "b": 0}
    tracker.committed({"a": 1, "b": 0})
    assert tracker.to_commit() == {}
    tracker.watermark("b").answered(0)
    assert tracker.to_commit() == {"b": 2}
    assert tracker.to_commit(["a"]) == {}
    assert tracker.unanswered() == 2 + 1
    assert tracker.unanswered(["b"]) == 1
