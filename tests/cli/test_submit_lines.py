"""`submit` reads JSON Lines a user wrote: every non-blank line becomes exactly one job or one problem
naming its line number, whatever the line holds (what `--skip-invalid` relies on to send the rest)."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from kafka_scorer.cli.submit import read_jobs

VALID = st.builds(
    lambda q, items: msgspec.json.encode({"query": q, "items": items, "label_token_ids": [3]}),
    st.lists(st.integers(0, 500), min_size=1, max_size=5),
    st.lists(st.lists(st.integers(0, 500), min_size=1, max_size=3), max_size=3),
)
HOSTILE = st.one_of(
    st.binary(max_size=60),
    st.text(max_size=60).map(str.encode),
    st.builds(
        lambda d: msgspec.json.encode(d), st.dictionaries(st.text(max_size=8), st.integers(), max_size=3)
    ),
)


@given(st.lists(st.tuples(st.booleans(), VALID, HOSTILE), max_size=20))
def test_every_line_is_one_job_or_one_numbered_problem(spec) -> None:
    lines = [valid if keep else hostile for keep, valid, hostile in spec]
    submissions, problems = read_jobs(lines)
    nonblank = [n for n, line in enumerate(lines, start=1) if line.strip()]
    numbered = sorted([s.line for s in submissions] + [int(p.split(":")[0].split()[1]) for p in problems])
    assert numbered == nonblank
    assert all(p.startswith(f"line {int(p.split(':')[0].split()[1])}: ") for p in problems)
    valid_lines = {n for n, (keep, _, _) in enumerate(spec, start=1) if keep}
    assert valid_lines <= {s.line for s in submissions}, "a valid line was reported as a problem"
