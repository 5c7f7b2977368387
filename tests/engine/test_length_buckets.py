"""Length buckets (attention/layout.py `bucket_by_length`): how the cascade, pair, prefix-cache and
late-interaction paths group spans to pad each group to its longest."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_scorer.engine.attention.layout import bucket_by_length

SPANS = st.lists(st.integers(1, 300), max_size=60).map(
    lambda lens: [(i * 1000, n) for i, n in enumerate(lens)]
)


def _greedy(entries: list[tuple[int, int]], slack: float) -> list[list[tuple[int, int]]]:
    """The rule as stated, written out plainly: longest first, a span joins the last group while that
    group padded to its longest stays within `slack` times its real tokens, else starts a new one."""
    groups: list[list[tuple[int, int]]] = []
    for span in sorted(entries, key=lambda e: -e[1]):
        if groups:
            grown = [*groups[-1], span]
            if max(n for _, n in grown) * len(grown) <= slack * sum(n for _, n in grown):
                groups[-1] = grown
                continue
        groups.append([span])
    return groups


@settings(max_examples=300, deadline=None)
@given(SPANS, st.sampled_from([1.0, 1.1, 1.25, 2.0]))
def test_groups_follow_the_stated_rule_and_cover_every_span_once(entries, slack) -> None:
    groups = bucket_by_length(entries, slack)
    assert groups == _greedy(entries, slack)
    assert sorted(span for group in groups for span in group) == sorted(entries)
    for group in groups:
        assert group[0][1] * len(group) <= slack * sum(n for _, n in group)
