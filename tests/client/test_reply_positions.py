"""The reply reader's reset test (client/reply_positions.py): a log end below the position is a reset
once two fetch responses show it, and a log end that fetched records contradict is never acted on
again, so the reader cannot loop over the same records (issue 26: the worker re-scored 11 jobs 150
times behind such a log end)."""

from __future__ import annotations

from kafka_scorer.client.reply_positions import FetchState, ReplyResets


def test_a_log_end_below_the_position_in_two_responses_is_one_reset() -> None:
    resets: ReplyResets[str] = ReplyResets()
    assert resets.observe({"p": FetchState(11, 11, fetched_at=1)}, {}) == {}
    assert resets.observe({"p": FetchState(11, 3, fetched_at=2)}, {}) == {}  # one response: not yet
    assert resets.observe({"p": FetchState(11, 3, fetched_at=2)}, {}) == {}  # the same response again
    confirmed = resets.observe({"p": FetchState(11, 3, fetched_at=3)}, {})
    assert list(confirmed) == ["p"] and "beyond the log end 3" in confirmed["p"]
    assert resets.count == 1


def test_a_log_end_that_fetched_records_contradict_is_never_a_reset_again() -> None:
    """The embedded broker after a racy restart: a log end of 2 while readers get offsets 0-14."""
    resets: ReplyResets[str] = ReplyResets()
    resets.observe({"p": FetchState(15, 2, fetched_at=1)}, {})
    assert resets.observe({"p": FetchState(15, 2, fetched_at=2)}, {})  # believed once: read again
    resets.forget(["p"])
    at = 3
    for position in range(1, 16):  # reading the log again from 0, the broker still says 2
        assert resets.observe({"p": FetchState(position, 2, fetched_at=at)}, {"p": position}) == {}
        at += 1
    for _ in range(100):  # then nothing new: never read again
        assert resets.observe({"p": FetchState(15, 2, fetched_at=at)}, {}) == {}
        at += 1
    assert resets.count == 1


def test_another_log_end_is_judged_afresh_after_a_contradicted_one() -> None:
    resets: ReplyResets[str] = ReplyResets()
    resets.observe({"p": FetchState(5, 2, fetched_at=1)}, {"p": 5})  # 2 contradicted
    resets.observe({"p": FetchState(9, 9, fetched_at=2)}, {"p": 9})  # a healthy log since
    resets.observe({"p": FetchState(9, 2, fetched_at=3)}, {})  # a real reset, to the same end
    assert resets.observe({"p": FetchState(9, 2, fetched_at=4)}, {}) != {}
