"""Six jobs and eight situations to score them in, for the deterministic-mode tests (CPU and GPU tier).

A situation puts job `i` in a batch with other jobs (before it, after it, sharing its query's sequence),
on a scorer whose prefix cache has already seen its head, or on a scorer whose small token budget cuts
it into pieces. In deterministic mode each job's scores must equal, bit for bit, those it gets alone on
a fresh scorer.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import NamedTuple

import msgspec

from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import Job, Result

WORDS = ["alpha", "beta", "gamma", "delta", "kafka", "score", "query", "item", "token", "model"]
HEAD = "You are a judge. Decide whether the document answers the question. " * 2


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def jobs_and_mates(
    causal: bool, seed: int = 0, softmax: bool = True, templated: bool = False
) -> tuple[list[Job], list[Job]]:
    """Six jobs (MIS and pairs, softmax and log-probabilities, 2 or 3 labels) and eight batch-mates;
    `softmax=False` for a kind whose scores take no activation (ColBERT's MaxSim); `templated`: text
    for a scorer's prompt template, which brings its own head and labels."""
    if templated:
        jobs, mates = jobs_and_mates(causal, seed, softmax)
        strip = dict(label_token_ids=None)
        return [msgspec.structs.replace(j, query=j.query[len(HEAD) :], **strip) for j in jobs], [
            msgspec.structs.replace(j, query=j.query[len(HEAD) :], **strip) for j in mates
        ]
    rng = random.Random(seed)
    jobs = [
        Job(
            id=f"j{n}",
            query=HEAD + _words(rng, rng.randint(4, 30)),
            items=[_words(rng, rng.randint(3, 25)) for _ in range(rng.randint(1, 5))],
            label_token_ids=[5, 9, 11][: 2 + n % 2] if causal else None,
            apply_softmax=n % 2 == 0 if softmax else None,
            multi_item=(n % 3 != 2) if causal else None,
        )
        for n in range(6)
    ]
    mates = [
        Job(
            id=f"m{n}",
            query=HEAD + _words(rng, rng.randint(4, 60)),
            items=[_words(rng, rng.randint(2, 40)) for _ in range(rng.randint(1, 8))],
            label_token_ids=[3, 4, 5, 6] if causal else None,
        )
        for n in range(8)
    ]
    return jobs, mates


Situation = Callable[[int], list[Result]]


def situations(make: Callable[..., Scorer], jobs: list[Job], mates: list[Job]) -> dict[str, Situation]:
    """Name -> a call that scores job `i` among others; `make(**options)` builds a fresh scorer."""
    warm = make()
    warm.score_jobs(jobs + mates)  # every head and query seen, twice for some: the cache would hold them
    warm.score_jobs(jobs + mates)
    cut = make(max_batch_tokens=64)

    def same_query(i: int) -> list[Result]:
        twin = Job(
            id="twin", query=jobs[i].query, items=["another item"], label_token_ids=jobs[i].label_token_ids
        )
        return warm.score_jobs([twin, jobs[i]])

    return {
        "alone, cache warm": lambda i: warm.score_jobs([jobs[i]]),
        "first of three": lambda i: warm.score_jobs([jobs[i], mates[0], mates[1]]),
        "last of three": lambda i: warm.score_jobs([mates[2], mates[3], jobs[i]]),
        "middle of nine": lambda i: warm.score_jobs([*mates[:4], jobs[i], *mates[4:]]),
        "all six, reversed": lambda i: warm.score_jobs(jobs[::-1]),
        "all six among mates": lambda i: warm.score_jobs([*mates[5:], *jobs, *mates[:2]]),
        "sharing its query's sequence": same_query,
        "cut into pieces by a small budget": lambda i: cut.score_jobs([mates[6], jobs[i]]),
    }


class Identity(NamedTuple):
    same: int
    """Results bit-identical to the job's scores alone on a fresh scorer."""
    total: int
    differed: list[str]
    """The situations (and jobs) that were not."""
    cached: int
    """Results served in part from the prefix (or embedding) cache: what proves the cache was tried."""


def count_identical(
    make: Callable[..., Scorer], causal: bool, softmax: bool = True, templated: bool = False
) -> Identity:
    jobs, mates = jobs_and_mates(causal, softmax=softmax, templated=templated)
    alone = [make().score_jobs([job])[0] for job in jobs]
    same = total = cached = 0
    differed = []
    for name, run in situations(make, jobs, mates).items():
        for i, job in enumerate(jobs):
            got = next(result for result in run(i) if result.id == job.id)
            assert got.error is None, got.error
            total += 1
            cached += bool(got.cached_tokens)
            if got.scores == alone[i].scores:
                same += 1
            else:
                differed.append(f"{name}: {job.id}")
    return Identity(same, total, differed, cached)
