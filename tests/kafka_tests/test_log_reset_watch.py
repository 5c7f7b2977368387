"""LogResetWatch: a partition's log counts as reset only when two fetch responses in a row show it
(a position beyond the log end, or a log end that moved back), never on one, and never on a log
that only grows; a reset is acted on once per event and within a bound, and a log end that records
just handed out contradict is never a reset (issue 26) — but only records of the same response, in the
same log, contradict it (issue 39)."""

from __future__ import annotations

from kafka_scorer.kafka.log_reset import NEW_LOG, FetchState, LogResetWatch, Reason, Sign


def _watch_through(*responses: dict[str, FetchState]) -> list[dict[str, Reason]]:
    watch: LogResetWatch[str] = LogResetWatch()
    return [watch.observe(states).reset for states in responses]


def test_a_growing_log_is_never_reset() -> None:
    responses = [{"p": FetchState(position=n, log_end=n + 5, fetched_at=n)} for n in range(0, 50, 5)]
    assert all(confirmed == {} for confirmed in _watch_through(*responses))


def test_a_position_beyond_the_log_end_needs_a_second_response() -> None:
    beyond = FetchState(position=40, log_end=10, fetched_at=1)
    again_same_response = FetchState(position=40, log_end=10, fetched_at=1)
    again = FetchState(position=40, log_end=12, fetched_at=2)
    got = _watch_through({"p": beyond}, {"p": again_same_response}, {"p": again})
    assert got[:2] == [{}, {}]
    assert got[2] == {"p": Reason(Sign.BEYOND_END, "position 40 is beyond the log end 12")}


def test_a_log_end_that_moved_back_is_a_reset_even_below_the_position() -> None:
    """Old position 5 inside a fresh log of 10: reading on would skip the fresh records 0..4."""
    got = _watch_through(
        {"p": FetchState(position=5, log_end=40, fetched_at=1)},
        {"p": FetchState(position=5, log_end=10, fetched_at=2)},
        {"p": FetchState(position=5, log_end=11, fetched_at=3)},
    )
    assert got == [{}, {}, {"p": Reason(Sign.MOVED_BACK, "the log end moved back from 40 to 11")}]


def test_one_odd_response_is_forgiven() -> None:
    got = _watch_through(
        {"p": FetchState(position=5, log_end=40, fetched_at=1)},
        {"p": FetchState(position=5, log_end=30, fetched_at=2)},  # a lagging leader, once
        {"p": FetchState(position=6, log_end=41, fetched_at=3)},
        {"p": FetchState(position=6, log_end=30, fetched_at=4)},
    )
    assert got == [{}, {}, {}, {}]


def test_after_a_reset_the_new_log_is_the_baseline_and_a_new_assignment_forgets() -> None:
    watch: LogResetWatch[str] = LogResetWatch()
    watch.observe({"p": FetchState(position=0, log_end=40, fetched_at=1), "q": FetchState(0, 40, 1)})
    watch.observe({"p": FetchState(position=0, log_end=10, fetched_at=2)})
    assert watch.observe({"p": FetchState(position=0, log_end=10, fetched_at=3)}).reset != {}
    assert watch.observe({"p": FetchState(position=3, log_end=12, fetched_at=4)}).reset == {}
    watch.forget(["q"])  # reassigned: positioned from the broker, its old end no longer counts
    watch.observe({"q": FetchState(position=0, log_end=5, fetched_at=5)})
    assert watch.observe({"q": FetchState(position=0, log_end=5, fetched_at=6)}).reset == {}


def test_a_reset_is_acted_on_once_per_event() -> None:
    """The position stays beyond the end after the reset (the broker's committed offset was no better):
    the same event is not acted on again until the partition has been seen healthy."""
    beyond = [{"p": FetchState(position=40, log_end=10, fetched_at=n)} for n in range(1, 20)]
    got = _watch_through(*beyond)
    assert sum(len(r) for r in got) == 1


def test_a_log_end_that_records_just_handed_out_contradict_is_not_a_reset() -> None:
    watch: LogResetWatch[str] = LogResetWatch()
    watch.received("p", 10, fetched_at=1)  # offsets up to 10 handed out, in a response that says 2
    first = watch.observe({"p": FetchState(position=11, log_end=2, fetched_at=1)})
    said = "the broker reports the log end 2 but delivered records up to offset 10"
    assert first.contradicted == {"p": Reason(Sign.WRONG_END, said)}
    later = [watch.observe({"p": FetchState(position=11, log_end=2, fetched_at=n)}) for n in range(2, 10)]
    assert all(v.reset == {} and v.contradicted == {} for v in later)  # said once, never acted on
    assert watch.log_end("p", 2) == 11
    watch.observe({"p": FetchState(position=11, log_end=11, fetched_at=10)})  # the broker caught up
    assert watch.log_end("p", 2) == 2


def test_repositionings_are_bounded_per_partition_and_window() -> None:
    """A log end that keeps moving back (healthy in between) is acted on `max_repositions` times in the
    window, then refused; after the window it counts again."""
    now = [0.0]
    watch: LogResetWatch[str] = LogResetWatch(max_repositions=2, window_s=60.0, clock=lambda: now[0])
    outcomes = []
    for cycle in range(4):
        base = 10 * cycle
        watch.observe({"p": FetchState(position=0, log_end=40, fetched_at=base + 1)})
        watch.observe({"p": FetchState(position=0, log_end=5, fetched_at=base + 2)})
        verdicts = watch.observe({"p": FetchState(position=0, log_end=5, fetched_at=base + 3)})
        outcomes.append(("reset" if verdicts.reset else "") + ("refused" if verdicts.refused else ""))
        now[0] += 1.0
    assert outcomes == ["reset", "reset", "refused", "refused"]
    now[0] += 120.0
    watch.observe({"p": FetchState(position=0, log_end=40, fetched_at=91)})
    watch.observe({"p": FetchState(position=0, log_end=5, fetched_at=92)})
    assert watch.observe({"p": FetchState(position=0, log_end=5, fetched_at=93)}).reset != {}


def test_records_of_an_earlier_response_prove_nothing_about_a_later_log_end() -> None:
    """Issue 39's run: records fetched from the broker's previous life (up to offset 69) were handed out
    after the broker came back empty and answered with a log end of 63; taken as proof, the worker read
    on from 70 and skipped every record the new log held below it. The new end is a reset."""
    watch: LogResetWatch[str] = LogResetWatch()
    watch.observe({"p": FetchState(position=60, log_end=70, fetched_at=1)})
    watch.received("p", 69, fetched_at=1)  # the old life's response, handed out late
    first = watch.observe({"p": FetchState(position=70, log_end=63, fetched_at=2)})
    assert first.contradicted == {} and first.reset == {}
    second = watch.observe({"p": FetchState(position=70, log_end=63, fetched_at=3)})
    assert second.reset == {"p": Reason(Sign.BEYOND_END, "position 70 is beyond the log end 63")}
    assert watch.log_end("p", 63) == 63


def test_what_records_proved_is_forgotten_when_the_log_may_have_changed() -> None:
    """Proved in one log (the embedded broker's small log ends, issue 26), then a new connection to the
    partition's leader: a broker restarted on the same address may hold a new, shorter log."""
    watch: LogResetWatch[str] = LogResetWatch(wall_ms=lambda: 5)
    watch.received("p", 10, fetched_at=1)
    assert watch.observe({"p": FetchState(position=11, log_end=2, fetched_at=1, log="A")}).contradicted
    assert watch.observe({"p": FetchState(11, 2, 2, log="A")}).reset == {}
    assert watch.log_end("p", 2) == 11
    first = watch.observe({"p": FetchState(11, 2, 6, log="B")})
    assert watch.log_end("p", 2) == 2
    assert first.reset == {"p": NEW_LOG} and "the log may be a new one" in str(first.reset["p"])


def test_a_new_connection_to_the_leader_is_a_reset_even_when_the_numbers_look_healthy() -> None:
    """A fresh log filled past the old position before the first fetch looks like the old one, grown:
    only the new connection betrays it. Once per change, and the change itself counts against the bound."""
    now = [0.0]
    watch: LogResetWatch[str] = LogResetWatch(max_repositions=2, clock=lambda: now[0], wall_ms=lambda: 0)
    assert watch.observe({"p": FetchState(position=70, log_end=70, fetched_at=1, log="A")}).reset == {}
    assert watch.observe({"p": FetchState(70, 70, 2, log=None)}).reset == {}  # disconnected: unknown
    assert list(watch.observe({"p": FetchState(70, 90, 3, log="B")}).reset) == ["p"]
    assert watch.observe({"p": FetchState(0, 90, 4, log="B")}).reset == {}  # the same log from then on
    assert list(watch.observe({"p": FetchState(5, 95, 5, log="C")}).reset) == ["p"]
    assert watch.observe({"p": FetchState(5, 95, 6, log="D")}).reset == {}  # not seen healthy since
    watch.observe({"p": FetchState(0, 95, 7, log="D")})
    refused = watch.observe({"p": FetchState(5, 95, 8, log="E")}).refused  # past the bound
    assert list(refused) == ["p"] and refused["p"].sign is Sign.NEW_LOG and "(the bound)" in str(refused["p"])


def test_a_watch_told_not_to_treats_a_new_connection_as_no_reset() -> None:
    watch: LogResetWatch[str] = LogResetWatch(new_log_is_reset=False)
    watch.observe({"p": FetchState(position=70, log_end=70, fetched_at=1, log="A")})
    assert watch.observe({"p": FetchState(70, 90, 2, log="B")}).reset == {}


def test_a_proof_stamped_before_the_log_changed_does_not_count_in_the_new_log() -> None:
    """The old broker's last response (records up to 69, a small end) reaches the worker's hands only
    after the new connection is up: its stamp predates the change, so it proves nothing there."""
    watch: LogResetWatch[str] = LogResetWatch(wall_ms=lambda: 100, new_log_is_reset=False)  # the proof alone
    watch.observe({"p": FetchState(position=60, log_end=70, fetched_at=10, log="A")})
    watch.received("p", 69, fetched_at=50)
    first = watch.observe({"p": FetchState(position=70, log_end=63, fetched_at=50, log="B")})
    assert first.contradicted == {}
    assert watch.observe({"p": FetchState(70, 63, 120, log="B")}).reset != {}


def test_records_of_the_same_response_still_prove_its_log_end_wrong_in_a_new_log() -> None:
    """After the change, the new log's own responses count as before (the bound on loops holds)."""
    watch: LogResetWatch[str] = LogResetWatch(wall_ms=lambda: 100, new_log_is_reset=False)
    watch.observe({"p": FetchState(position=0, log_end=5, fetched_at=10, log="A")})
    watch.observe({"p": FetchState(position=0, log_end=5, fetched_at=90, log="B")})
    watch.received("p", 10, fetched_at=120)
    said = watch.observe({"p": FetchState(position=11, log_end=2, fetched_at=120, log="B")})
    wrong = "the broker reports the log end 2 but delivered records up to offset 10"
    assert said.contradicted == {"p": Reason(Sign.WRONG_END, wrong)}
    assert all(watch.observe({"p": FetchState(11, 2, n, log="B")}).reset == {} for n in range(121, 130))
