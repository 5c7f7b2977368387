"""What `bench` tells a person who cannot look up the project's issues (issue 21 item 7): the help says
what (a)-(d), floor and others are, and each goal names what it compares in words."""

from __future__ import annotations

import torch

from kafka_scorer.cli.main import build_parser
from kafka_scorer_bench.targets import evaluate_targets


def test_the_help_explains_the_contenders_and_columns() -> None:
    parser = build_parser()
    bench = parser._subparsers._group_actions[0].choices["bench"]  # type: ignore[union-attr]
    text = " ".join(bench.format_help().split())
    explained = (
        "(a) this engine with multi-item scoring (MIS) off",
        "(c) the plain transformers baseline",
        "(d) the whole worker",
        "floor is the compute floor",
        "others is the CPU share",
    )
    for words in explained:
        assert words in text, words
    assert "(seconds; for tests)" not in text and "its goals are not judged" in text


def test_every_goal_names_what_it_compares() -> None:
    ratios = {"b_over_a_vs_token_ratio": {"cascade": 0.95}, "b_over_c": {"cascade": 9.0}, "d_over_b": 0.8}
    results = {"rerank": {"ratios": ratios}, "many-items": {"ratios": ratios, "contenders": {}}}
    targets = evaluate_targets(results, None, torch.device("cpu"), "cascade")
    assert len(targets) == 5
    for target in targets:
        words = target["target"].split(" — ", 1)[1]
        assert " vs. " in words, target
    assert not any("issue" in t["target"] for t in targets)
