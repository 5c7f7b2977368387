"""Job mixes for the integration tests and their expected scores from the independent reference.

The reference (tests/engine/reference.py) is a stock transformers forward of one pair at a time; it
never touches the engine, so a wrong packing, a swapped result or a lost item shows up as a mismatch.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kafka_scorer.wire.protocol import (
    CONTENT_TYPE_JSON,
    CONTENT_TYPE_MSGPACK,
    Job,
    Result,
    WireFormat,
    encode_job,
)
from tests.engine.reference import reference_hidden, reference_scores
from tests.integration.kafka_helpers import BrokerInfo, Out, Topics, fresh_topics

MODEL_VOCAB = 384 + 16  # tiny tokenizer + padding rows (kafka_scorer.checkpoints.tiny_models)
_WORDS = [
    "capital",
    "California",
    "Sacramento",
    "rivers",
    "mountains",
    "oceans",
    "review",
    "positive",
    "negative",
    "fox",
    "dog",
    "Kafka",
]
_ID_QUERIES = [[5, 17, 42, 99], [7, 8, 9], [120, 121, 122, 123, 124]]
_TEXT_QUERIES = ["What is the capital of California?", "Is this review positive?"]


@dataclass(frozen=True)
class Sent:
    """One produced job and how it was sent."""

    job: Job
    fmt: WireFormat
    key: bytes | None
    correlation: bytes | None


def mixed_jobs(n: int, seed: int, model_name: str, prefix: str = "job") -> list[Sent]:
    """Every code path a job can take: token ids or text, packed (MIS) or not, item_first, softmax on
    or off, pooled states, empty item lists, the `model` field set or not, JSON or MessagePack, with and
    without a content-type header, ids from the body or from the correlation header."""
    rng = random.Random(seed)
    sent = []
    for i in range(n):
        as_ids = rng.random() < 0.6
        if as_ids:
            query: str | list[int] = list(rng.choice(_ID_QUERIES))
            items: list = [
                [rng.randrange(4, 380) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(0, 3))
            ]
        else:
            query = rng.choice(_TEXT_QUERIES)
            items = [" ".join(rng.sample(_WORDS, rng.randint(1, 3))) for _ in range(rng.randint(0, 3))]
        item_first = rng.random() < 0.15
        multi_item = rng.choice([None, None, False]) if item_first else rng.choice([None, None, True, False])
        correlation = f"{prefix}-corr-{i}".encode() if rng.random() < 0.3 else None
        job = Job(
            id=None if correlation else f"{prefix}-{i}",
            query=query,
            items=items,
            label_token_ids=rng.sample(range(MODEL_VOCAB), rng.randint(1, 3)),
            apply_softmax=rng.random() < 0.5,
            item_first=item_first,
            multi_item=multi_item,
            return_pooled_hidden_states=rng.random() < 0.05,
            model=model_name if rng.random() < 0.3 else None,
        )
        sent.append(Sent(job, "json" if rng.random() < 0.5 else "msgpack", f"key-{i}".encode(), correlation))
    return sent


def expected_id(sent: Sent) -> str:
    return sent.job.id or (sent.correlation or b"").decode()


def to_record(sent: Sent, topic: str, partition: int | None, with_content_type: bool) -> Out:
    headers = []
    if with_content_type:
        headers.append(
            ("content-type", (CONTENT_TYPE_JSON if sent.fmt == "json" else CONTENT_TYPE_MSGPACK).encode())
        )
    if sent.correlation is not None:
        headers.append(("correlation_id", sent.correlation))
    return Out(topic, encode_job(sent.job, sent.fmt), key=sent.key, headers=headers, partition=partition)


@dataclass(frozen=True)
class MixedStream(Topics):
    """Fresh topics plus a job mix ready to produce: the jobs as sent and their records, spread
    round-robin over the partitions."""

    sent: list[Sent]
    records: list[Out]


async def mixed_stream(
    broker: BrokerInfo,
    n: int,
    seed: int,
    model_name: str,
    prefix: str,
    partitions: int = 3,
    dead_letters: bool = False,
    bare_every: int = 0,
) -> MixedStream:
    """`n` jobs of `mixed_jobs` on new topics; with `bare_every` k, every k-th record goes without a
    content-type header, so the worker has to tell the format from the bytes."""
    topics = await fresh_topics(broker, partitions, dead_letters)
    sent = mixed_jobs(n, seed, model_name, prefix)
    records = [
        to_record(
            s, topics.requests, i % partitions, with_content_type=not (bare_every and i % bare_every == 0)
        )
        for i, s in enumerate(sent)
    ]
    return MixedStream(**vars(topics), sent=sent, records=records)


class Reference:
    """Reference scores per distinct job, computed once."""

    def __init__(self, model: Path) -> None:
        self.model = model
        self._cache: dict[bytes, list[list[float]]] = {}

    def scores(self, job: Job) -> list[list[float]]:
        key = encode_job(Job(**{**_fields(job), "id": None, "model": None}))
        if key not in self._cache:
            self._cache[key] = reference_scores(
                self.model, job.query, job.items, job.label_token_ids, job.apply_softmax, job.item_first
            )
        return self._cache[key]

    def hidden(self, job: Job):
        return reference_hidden(self.model, job.query, job.items, job.item_first)


def _fields(job: Job) -> dict:
    return {f: getattr(job, f) for f in job.__struct_fields__}


def max_abs_diff(got: list[list[float]], want: list[list[float]]) -> float:
    assert len(got) == len(want), (len(got), len(want))
    diffs = [abs(g - w) for gr, wr in zip(got, want, strict=True) for g, w in zip(gr, wr, strict=True)]
    for gr, wr in zip(got, want, strict=True):
        assert len(gr) == len(wr)
    return max(diffs, default=0.0)


def assert_matches_reference(result: Result, sent: Sent, reference: Reference, atol: float = 1e-4) -> None:
    assert result.error is None, (expected_id(sent), result.error)
    assert result.scores is not None
    diff = max_abs_diff(result.scores, reference.scores(sent.job))
    assert diff <= atol, f"{expected_id(sent)}: scores differ from the reference by {diff}"
    if sent.job.return_pooled_hidden_states and sent.job.items:
        import numpy as np

        pooled = result.pooled_hidden_states
        assert pooled is not None and pooled.dtype == "float32"
        got = np.frombuffer(pooled.data, dtype="<f4").reshape(pooled.shape)
        want = reference.hidden(sent.job).numpy()
        assert got.shape == want.shape
        assert float(np.abs(got - want).max()) <= atol


def assert_answers(
    results: Iterable[Result],
    sent: Sequence[Sent],
    reference: Reference,
    *,
    expected: set[str] | None = None,
    once: bool = True,
    context: str = "",
) -> Counter[str]:
    """The ids answered are exactly `expected` (default: every job sent), each once unless `once` is off
    (at-least-once after a crash), and every result holds the reference scores of the job it answers.

    Returns how often each id was answered, for the test's own report."""
    results = list(results)
    by_id = {expected_id(s): s for s in sent}
    want = set(by_id) if expected is None else expected
    counts = Counter(r.id for r in results)
    missing, extra = sorted(want - set(counts))[:10], sorted(set(counts) - want)[:10]
    assert set(counts) == want, f"missing {missing}, unexpected {extra}{context}"
    if once:
        assert max(counts.values()) == 1, (
            f"answered twice: {[k for k, v in counts.items() if v > 1][:10]}{context}"
        )
    for result in results:
        assert_matches_reference(result, by_id[result.id], reference)
    return counts
