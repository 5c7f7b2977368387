"""Commit watermarks over out-of-order completions (SPEC §7: commits never pass an unanswered record)."""

from __future__ import annotations

import random

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


def test_an_offset_handed_out_again_is_held_back_not_dropped() -> None:
    """Issue 45: tansu handed out two records under one offset after a restart, and the watermark's old
    answer to that (restart it, dropping the earlier jobs as if they would be read again) skipped them
    and committed past them. Both are answered; the commit waits for the lowest unanswered offset."""
    mark = Watermark()
    assert [mark.received(o) for o in (3, 4, 5, 4, 5, 6)] == [False, False, False, True, False, False]
    assert mark.repeats == 1 and mark.unanswered == 6
    for offset in (3, 4, 5, 6):
        mark.answered(offset)
    assert mark.commit_offset() == 4, "the second record at offset 4 is not answered yet"
    mark.answered(5)
    assert mark.commit_offset() == 4
    mark.answered(4)
    assert mark.commit_offset() == 7 and mark.unanswered == 0


def test_a_reset_back_commits_nothing_past_the_earlier_records() -> None:
    mark = Watermark()
    for offset in (10, 11, 12, 0, 1):  # the client reset the position to the log's start
        mark.received(offset)
    mark.answered(0)
    mark.answered(1)
    assert mark.commit_offset() == 2, "reading goes on from 2: 2-9 are still to come"
    for offset in (10, 11, 12):
        mark.answered(offset)
    assert mark.commit_offset() == 2


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
