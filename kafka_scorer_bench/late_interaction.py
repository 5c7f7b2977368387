"""The `late-interaction` workload: a ColBERT reranker, this engine against the library's own scoring.

The model is all-MiniLM-L6-v2's real BERT weights and WordPiece tokenizer under a seeded 384 -> 128
Dense projection in PyLate's layout, with ColBERT's usual settings (queries of 32 tokens expanded with
[MASK], documents cut at 180 tokens; `checkpoints/real_models.py`): the shape of answerai-colbert-small.
Each query is ~12 words against 100 documents of 20-250 words (log-normal, median 80), real vocabulary
words, one WordPiece token each.

Contenders, CPU float32, one job (one query and its 100 documents) at a time:
- `reference`: sentence-transformers' `MultiVectorEncoder` (which reads PyLate checkpoints; PyLate itself
  pins an older torch and transformers) — `encode_query`, `encode_document` at its default batch size,
  then its own MaxSim `similarity`;
- `engine`: this engine's `Scorer`, the embedding cache off.
Then the cache: one set of 100 documents re-ranked against several queries, the engine with the embedding
cache on and off; the first query fills the cache, the later ones read it.
Every score is compared with the reference's (max |diff| <= 1e-4 is the cross-check).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kafka_scorer.wire.protocol import Job
from kafka_scorer_bench.contenders import OneJobAtATime
from kafka_scorer_bench.workloads import passage_length, words_text


@dataclass(frozen=True)
class LateShape:
    query_words: int = 12
    docs_per_query: int = 100
    doc_min: int = 20
    doc_max: int = 250
    doc_median: int = 80
    queries: int = 3
    cache_queries: int = 4


QUICK_SHAPE = LateShape(query_words=6, docs_per_query=12, doc_min=4, doc_max=40, doc_median=12, queries=1)
"""Seconds instead of minutes, for the tests."""


def build_late_jobs(
    tokenizer, *, seed: int = 0, shape: LateShape = LateShape()
) -> tuple[list[Job], list[Job]]:
    """(jobs of distinct documents, jobs of `cache_queries` queries over one set of documents)."""
    rng = random.Random(f"late-interaction:{seed}")
    words = sorted(w for w in tokenizer.get_vocab() if w.isalpha() and w.islower() and len(w) > 2)

    def text(n: int) -> str:
        return words_text(rng, words, n)

    def documents() -> list[str]:
        lengths = (
            passage_length(rng, shape.doc_median, shape.doc_min, shape.doc_max)
            for _ in range(shape.docs_per_query)
        )
        return [text(n) for n in lengths]

    distinct = [
        Job(id=f"li-{q}", query=text(shape.query_words), items=documents()) for q in range(shape.queries)
    ]
    shared = documents()
    repeated = [
        Job(id=f"li-cache-{q}", query=text(shape.query_words), items=shared)
        for q in range(shape.cache_queries)
    ]
    return distinct, repeated


def reference_scores(reference, job: Job) -> list[float]:
    """The library's own way: `encode_query`, `encode_document` at its default batch size, MaxSim."""
    query = reference.encode_query([job.query])
    docs = reference.encode_document(list(job.items))
    return reference.similarity(query, docs)[0].float().tolist()


class MultiVectorContender(OneJobAtATime):
    """`MultiVectorEncoder` (`reference_scores`) as a contender `drive` can time."""

    def __init__(self, reference) -> None:
        super().__init__()
        self.reference = reference

    def score(self, job: Job) -> list[list[float]]:
        return [[score] for score in reference_scores(self.reference, job)]


def _best(run: Callable[[], list[list[float]]], repeats: int) -> tuple[float, float, list[list[float]]]:
    """Best wall and best CPU seconds (this process's, which other processes cannot inflate on one
    thread) of `repeats` runs, and the scores."""
    wall, cpu, scores = math.inf, math.inf, []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        scores = run()
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return wall, cpu, scores


def run_late_interaction_bench(
    *,
    seed: int = 0,
    model_dir: str | None = None,
    repeats: int = 3,
    max_batch_tokens: int = 8192,
    quick: bool = False,
    log: Callable = print,
) -> dict:
    import tempfile

    from sentence_transformers import MultiVectorEncoder

    from kafka_scorer.checkpoints.real_models import build_minilm_colbert
    from kafka_scorer.engine.api import Scorer

    with tempfile.TemporaryDirectory(prefix="kafka-scorer-colbert-") as scratch:
        path = Path(model_dir or scratch) / "minilm-colbert"
        if not (path / "modules.json").exists():
            build_minilm_colbert(path, seed=seed)
        options = dict(dtype="float32", device="cpu", max_batch_tokens=max_batch_tokens)
        engine = Scorer(str(path), embedding_cache_mb=0, **options)
        cached = Scorer(str(path), embedding_cache_mb=-1, **options)
        reference = MultiVectorEncoder(str(path), device="cpu")
    shape = QUICK_SHAPE if quick else LateShape()
    distinct, repeated = build_late_jobs(engine.describe().loaded.tokenizer, seed=seed, shape=shape)
    log(
        f"late-interaction: {len(distinct)} queries x {shape.docs_per_query} documents; "
        f"cache: {len(repeated)} queries"
    )

    def by_reference(job: Job) -> list[float]:
        return reference_scores(reference, job)

    def by_engine(scorer, job: Job) -> list[float]:
        result = scorer.score_jobs([job])[0]
        assert result.error is None, result.error
        return [row[0] for row in result.scores]

    for job in distinct[:1]:  # warm-up, both sides
        by_reference(job), by_engine(engine, job)
    log("  reference (MultiVectorEncoder) ...")
    ref_s, ref_cpu, ref_scores = _best(lambda: [by_reference(job) for job in distinct], repeats)
    log("  engine ...")
    eng_s, eng_cpu, eng_scores = _best(lambda: [by_engine(engine, job) for job in distinct], repeats)
    log("  cache on and off ...")
    cache_runs = {
        "off": _per_query(engine, repeated, by_engine, repeats),
        "on": _per_query(cached, repeated, by_engine, repeats),
    }
    _clear_embedding_cache(cached)
    reference_repeated = [by_reference(job) for job in repeated]
    diffs = {
        "engine": _max_diff(eng_scores, ref_scores),
        "cache off": _max_diff(cache_runs["off"]["scores"], reference_repeated),
        "cache on": _max_diff(cache_runs["on"]["scores"], reference_repeated),
    }
    on = cache_runs["on"]["seconds"]
    later = sum(on[1:]) / max(1, len(on) - 1)
    return {
        "shape": asdict(shape),
        "torch_threads": torch.get_num_threads(),
        "reference_s_per_query": ref_s / len(distinct),
        "engine_s_per_query": eng_s / len(distinct),
        "engine_over_reference": ref_s / eng_s,
        "reference_cpu_s_per_query": ref_cpu / len(distinct),
        "engine_cpu_s_per_query": eng_cpu / len(distinct),
        "engine_over_reference_cpu": ref_cpu / eng_cpu,
        "cache": {name: run["seconds"] for name, run in cache_runs.items()},
        "later_over_first_with_cache": later / on[0],
        "max_abs_diff_vs_reference": diffs,
        "ok": all(diff <= 1e-4 for diff in diffs.values()),
    }


def _per_query(scorer, jobs: list[Job], score: Callable, repeats: int) -> dict:
    """CPU seconds of each query in order (best of `repeats`, the cache emptied before each pass)."""
    best = [math.inf] * len(jobs)
    scores: list[list[float]] = []
    for _ in range(repeats):
        _clear_embedding_cache(scorer)
        scores = []
        for index, job in enumerate(jobs):
            start = time.process_time()
            scores.append(score(scorer, job))
            best[index] = min(best[index], time.process_time() - start)
    return {"seconds": best, "scores": scores}


def _max_diff(got: list[list[float]], expected: list[list[float]]) -> float:
    return max((abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e)), default=0.0)


def format_late_interaction_report(report: dict) -> str:
    shape = report["shape"]
    cache = report["cache"]
    lines = [
        f"late-interaction (real MiniLM-L6 weights + seeded 128-dim projection, CPU float32, "
        f"{report['torch_threads']} threads): {shape['docs_per_query']} documents per query",
        f"{'contender':<34}{'s/query':>10}{'CPU s/query':>13}",
        f"{'reference (MultiVectorEncoder)':<34}{report['reference_s_per_query']:>10.3f}"
        f"{report['reference_cpu_s_per_query']:>13.3f}",
        f"{'engine':<34}{report['engine_s_per_query']:>10.3f}{report['engine_cpu_s_per_query']:>13.3f}",
        f"engine over reference: {report['engine_over_reference']:.2f}x wall, "
        f"{report['engine_over_reference_cpu']:.2f}x CPU time",
        f"same documents, {len(cache['on'])} queries in turn (CPU s each): cache off "
        + " ".join(f"{s:.3f}" for s in cache["off"])
        + "; cache on "
        + " ".join(f"{s:.3f}" for s in cache["on"]),
        f"with the cache, a later query costs {report['later_over_first_with_cache']:.2f}x the first",
        "max |diff| vs reference: "
        + "; ".join(f"{k} {v:.1e}" for k, v in report["max_abs_diff_vs_reference"].items()),
    ]
    return "\n".join(lines)


def _clear_embedding_cache(scorer) -> None:
    """Every pass starts from an empty document cache (the kind's, where it keeps one)."""
    scorer.describe().kind.forget()
