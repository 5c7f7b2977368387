"""Synthetic scoring jobs for the benchmark: the issue's workload shapes, as token ids, seeded.

Jobs carry token ids, not text: the shapes (query length, item count and length) are then exact,
and every contender sees the very same tokens. Ids are drawn above the special-token range so no
synthetic token is ever a pad or BOS id.

Shapes (full size; `quick` shrinks them for tests):
- rerank: query 256, 32 items × 32, 2 labels, `apply_softmax: true` (a yes/no reranker).
- many-items: query 512, 200 items × 16, 2 labels, `apply_softmax: false` (full-vocabulary
  log-probabilities, the path that needs the streamed log-sum-exp).
- short: query 32, 1 item × 32, a classification model (the single-pair path; MIS cannot help).
- mixed: a CausalLM stream of varied shapes, label sets of 1–4 ids, both softmax modes, and some
  jobs that share a query (one query's items split over several jobs, as a client paging results).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import msgspec

from kafka_scorer.wire.protocol import Job
from kafka_scorer_bench.models import FIRST_REGULAR_ID

WORKLOADS = ("rerank", "many-items", "short", "mixed")


@dataclass(frozen=True)
class Shape:
    query_len: int
    num_items: int
    item_len: int


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    model_kind: str
    """"causal" or "classification": which checkpoint serves it."""
    num_jobs: int
    shape: Shape
    num_labels: int = 2
    apply_softmax: bool = False


@dataclass
class Workload:
    spec: WorkloadSpec
    jobs: list[Job] = field(default_factory=list)
    sent: list[Job] | None = None
    """The jobs as the engine and the worker receive them, where that differs from `jobs`: text under a
    prompt template (`templated.py`), with `jobs` the same jobs as the engine's token ids. None: `jobs`."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def requests(self) -> list[Job]:
        """What (a), (b) and (d) are sent; (c) and every token count read `jobs`."""
        return self.jobs if self.sent is None else self.sent

    @property
    def num_items(self) -> int:
        return sum(len(job.items) for job in self.jobs)

    @property
    def pair_tokens(self) -> int:
        """Tokens if every item ran as its own `query + item` pair: what no-MIS scoring computes."""
        return sum(map(pair_tokens, self.jobs))

    @property
    def packed_tokens(self) -> int:
        """Tokens if every job ran as one MIS sequence (1-item jobs gain nothing)."""
        return sum(map(packed_tokens, self.jobs))


def pair_tokens(job: Job) -> int:
    return len(job.items) * len(job.query) + sum(map(len, job.items))


def packed_tokens(job: Job) -> int:
    return len(job.query) + sum(map(len, job.items))


FULL: dict[str, WorkloadSpec] = {
    "rerank": WorkloadSpec("rerank", "causal", 64, Shape(256, 32, 32), apply_softmax=True),
    "many-items": WorkloadSpec("many-items", "causal", 16, Shape(512, 200, 16)),
    "short": WorkloadSpec("short", "classification", 1024, Shape(32, 1, 32)),
    "mixed": WorkloadSpec("mixed", "causal", 128, Shape(512, 32, 64)),
}
"""GPU-sized job counts; `CPU_JOBS` cuts them so a 2-core run of everything stays under ~10 minutes
(no-MIS and the baseline compute every pair in full: one many-items job is ~100k tokens for them)."""

CPU_JOBS = {"rerank": 4, "many-items": 2, "short": 64, "mixed": 16}

QUICK: dict[str, WorkloadSpec] = {
    "rerank": WorkloadSpec("rerank", "causal", 3, Shape(24, 4, 6), apply_softmax=True),
    "many-items": WorkloadSpec("many-items", "causal", 2, Shape(32, 12, 3)),
    "short": WorkloadSpec("short", "classification", 6, Shape(8, 1, 8)),
    "mixed": WorkloadSpec("mixed", "causal", 6, Shape(32, 6, 8)),
}


def workload_spec(name: str, *, quick: bool = False, device_type: str = "cpu", num_jobs: int | None = None):
    if name not in WORKLOADS:
        raise ValueError(f"workload: {name!r} is not one of {WORKLOADS}")
    spec = QUICK[name] if quick else FULL[name]
    if num_jobs is None and not quick and device_type != "cuda":
        num_jobs = CPU_JOBS[name]
    return replace(spec, num_jobs=num_jobs) if num_jobs else spec


def build_workload(spec: WorkloadSpec, vocab_size: int, *, seed: int = 0) -> Workload:
    """Same spec, vocabulary and seed -> the same jobs, token for token."""
    rng = random.Random(f"{spec.name}:{seed}")

    def tokens(n: int) -> list[int]:
        return [rng.randrange(FIRST_REGULAR_ID, vocab_size) for _ in range(n)]

    labels = tokens(spec.num_labels) if spec.model_kind == "causal" else None
    jobs: list[Job] = []
    if spec.name == "mixed":
        jobs = _mixed_jobs(spec, rng, tokens)
    else:
        s = spec.shape
        for index in range(spec.num_jobs):
            jobs.append(
                Job(
                    id=f"{spec.name}-{index}",
                    query=tokens(s.query_len),
                    items=[tokens(s.item_len) for _ in range(s.num_items)],
                    label_token_ids=labels,
                    apply_softmax=spec.apply_softmax,
                )
            )
    return Workload(spec=spec, jobs=jobs)


def _mixed_jobs(spec: WorkloadSpec, rng: random.Random, tokens) -> list[Job]:
    """Sizes are drawn up to the spec's shape (its maxima), from a few typical steps each."""
    top = spec.shape

    def steps(maximum: int) -> list[int]:
        return sorted({max(1, maximum // d) for d in (16, 8, 4, 2, 1)})

    jobs: list[Job] = []
    previous: Job | None = None
    for index in range(spec.num_jobs):
        labels = tokens(rng.randint(1, 4))
        softmax = rng.random() < 0.5
        if previous is not None and rng.random() < 0.25:
            query = previous.query  # more items for the previous query, in a job of its own
        else:
            query = tokens(rng.choice(steps(top.query_len)))
        num_items = rng.choice([1, *steps(top.num_items)])
        item_len = rng.choice(steps(top.item_len))
        job = Job(
            id=f"mixed-{index}",
            query=query,
            items=[tokens(rng.randint(max(1, item_len // 2), item_len)) for _ in range(num_items)],
            label_token_ids=labels,
            apply_softmax=softmax,
        )
        jobs.append(job)
        previous = job
    return jobs


def passage_length(rng: random.Random, median: int, low: int, high: int) -> int:
    """A document's length in words, spread like web passages: log-normal around `median` (sigma 0.6),
    clipped to `[low, high]` (the text workloads' documents: cross-encoder, late interaction, listwise)."""
    return min(high, max(low, round(rng.lognormvariate(math.log(median), 0.6))))


def words_text(rng: random.Random, words: Sequence[str], n: int) -> str:
    """`n` words drawn from `words`: text whose token count the vocabulary fixes."""
    return " ".join(rng.choice(words) for _ in range(n))


def with_multi_item(jobs: list[Job], multi_item: bool) -> list[Job]:
    """The same jobs with MIS forced off, or on wherever it can apply (jobs of 2+ items).

    1-item jobs keep `multi_item: null` with MIS on: packing one item is the plain pair anyway.
    """
    out = []
    for job in jobs:
        value: bool | None = False if not multi_item else (True if len(job.items) >= 2 else None)
        out.append(msgspec.structs.replace(job, multi_item=value))
    return out
