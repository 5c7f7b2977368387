"""The bf16 fidelity test: does a kind rank in bfloat16 as float32 ranks, as far as a user would notice?

Each kind scores generated queries of `DOCUMENTS` documents with the engine in bfloat16 on the CPU, and
an independent float32 reference scores the same pairs (plain transformers, or sentence-transformers'
ColBERT encoder; never the engine): per query the top-10 overlap and Kendall's tau of the two rankings
and the largest score difference, relative to the query's float32 score spread.

`BAR` is what a user would notice, set before measuring:
- top-10 overlap ≥ 0.9 on average and ≥ 0.8 for every query: a results page of ten changes by at most one
  document on average, two at worst (a near-tie at rank 10/11 trades places; more is a different page);
- Kendall's tau ≥ 0.95 on average: at most 2.5 % of document pairs swap, which near-ties explain;
- largest score difference ≤ 5 % of the query's float32 score spread: a user's score cut-off (a
  threshold on `relevance_score`) moves by less than one twentieth of the range it cuts.

`python -m tests.engine.fidelity [QUERIES]` prints docs/performance.md's table;
tests/engine/test_precision_fidelity.py holds `precision.BF16_RANKINGS_HOLD` to a smaller run.
"""

from __future__ import annotations

import random
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

import torch

from kafka_scorer.wire.protocol import Job
from tests.engine.passages import PASSAGES, QUERIES

DOCUMENTS = 100
TOP = 10
CAUSAL_LABELS = [5, 6]


@dataclass(frozen=True)
class FidelityBar:
    top_overlap_mean: float = 0.9
    top_overlap_worst: float = 0.8
    kendall_tau_mean: float = 0.95
    score_difference: float = 0.05
    """Of the query's float32 score spread (max - min)."""


BAR = FidelityBar()


@dataclass(frozen=True)
class QueryFidelity:
    top_overlap: float
    kendall_tau: float
    difference: float
    """Largest |bf16 - fp32| over the query's documents, divided by the fp32 spread."""
    absolute: float


@dataclass(frozen=True)
class Fidelity:
    kind: str
    queries: tuple[QueryFidelity, ...]

    def holds(self, bar: FidelityBar = BAR) -> bool:
        return (
            self.top_overlap_mean >= bar.top_overlap_mean
            and self.top_overlap_worst >= bar.top_overlap_worst
            and self.kendall_tau_mean >= bar.kendall_tau_mean
            and self.difference <= bar.score_difference
        )

    @property
    def top_overlap_mean(self) -> float:
        return fmean(q.top_overlap for q in self.queries)

    @property
    def top_overlap_worst(self) -> float:
        return min(q.top_overlap for q in self.queries)

    @property
    def kendall_tau_mean(self) -> float:
        return fmean(q.kendall_tau for q in self.queries)

    @property
    def kendall_tau_worst(self) -> float:
        return min(q.kendall_tau for q in self.queries)

    @property
    def difference(self) -> float:
        return max(q.difference for q in self.queries)

    @property
    def absolute(self) -> float:
        return max(q.absolute for q in self.queries)

    def row(self) -> str:
        return (
            f"| {self.kind} | {len(self.queries)} | {self.top_overlap_mean:.3f} "
            f"| {self.top_overlap_worst:.2f} "
            f"| {self.kendall_tau_mean:.4f} | {self.kendall_tau_worst:.4f} | {self.difference:.4f} "
            f"| {self.absolute:.2e} | {'bfloat16' if self.holds() else 'float32'} |"
        )


def kendall_tau(a: torch.Tensor, b: torch.Tensor) -> float:
    """Kendall's tau-a of two score vectors (pairs tied in either count as neither)."""
    sa = torch.sign(a[:, None] - a[None, :])
    sb = torch.sign(b[:, None] - b[None, :])
    n = a.numel()
    return float((sa * sb).sum()) / (n * (n - 1))


def compare(got: list[float], expected: list[float]) -> QueryFidelity:
    a = torch.tensor(got, dtype=torch.float64)
    b = torch.tensor(expected, dtype=torch.float64)
    top = min(TOP, a.numel())
    overlap = len(set(a.topk(top).indices.tolist()) & set(b.topk(top).indices.tolist())) / top
    absolute = float((a - b).abs().max())
    spread = float(b.max() - b.min()) or 1.0
    return QueryFidelity(overlap, kendall_tau(a, b), absolute / spread, absolute)


def text_workload(count: int, seed: int = 0) -> list[tuple[str, list[str]]]:
    """`count` queries of `DOCUMENTS` documents: real queries and passages, and word salads of their
    words (8-40 words) so that most documents are near-misses, as a first-stage retriever returns."""
    rng = random.Random(seed)
    words = " ".join(PASSAGES).split()
    out = []
    for i in range(count):
        query = QUERIES[i % len(QUERIES)]
        documents = list(PASSAGES)
        while len(documents) < DOCUMENTS:
            documents.append(" ".join(rng.choices(words, k=rng.randint(8, 40))))
        rng.shuffle(documents)
        out.append((query, documents))
    return out


def id_workload(count: int, vocab: int, seed: int = 0) -> list[tuple[list[int], list[list[int]]]]:
    """Token-id queries (8-20 ids) of `DOCUMENTS` items (5-30 ids), for the random tiny decoders."""
    rng = random.Random(seed)

    def ids(low: int, high: int) -> list[int]:
        return [rng.randrange(10, vocab) for _ in range(rng.randint(low, high))]

    return [(ids(8, 20), [ids(5, 30) for _ in range(DOCUMENTS)]) for _ in range(count)]


def text_jobs(workload: list[tuple[str, list[str]]]) -> list[Job]:
    return [Job(id=str(i), query=q, items=list[Any](d)) for i, (q, d) in enumerate(workload)]


def engine_scores(scorer, jobs: list[Job]) -> list[list[float]]:
    """Each job's ranking column (the last: a label scorer's last label) from the engine."""
    from tests.engine.contract import run

    rows = []
    for result in run(scorer.engine, jobs):
        assert result.error is None and result.scores is not None, result.error
        rows.append([row[-1] for row in result.scores])
    return rows


def measure(kind: str, pairs: list[tuple[list[float], list[float]]]) -> Fidelity:
    return Fidelity(kind, tuple(compare(got, expected) for got, expected in pairs))


def cross_encoder(path: Path, count: int) -> Fidelity:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from kafka_scorer.engine.scorer import Scorer

    workload = text_workload(count)
    scorer = Scorer(str(path), dtype="bfloat16", device="cpu")
    got = engine_scores(scorer, text_jobs(workload))
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    expected = []
    with torch.no_grad():
        for query, documents in workload:
            batch = tokenizer([query] * len(documents), documents, padding=True, return_tensors="pt")
            expected.append(model(**batch).logits[:, -1].tolist())
    return measure("cross_encoder", list(zip(got, expected, strict=True)))


def late_interaction(path: Path, count: int) -> Fidelity:
    from sentence_transformers import MultiVectorEncoder

    from kafka_scorer.engine.scorer import Scorer

    workload = text_workload(count)
    scorer = Scorer(str(path), dtype="bfloat16", device="cpu", embedding_cache_mb=0)
    got = engine_scores(scorer, text_jobs(workload))
    encoder = MultiVectorEncoder(str(path), device="cpu")
    expected = []
    for query, documents in workload:
        (query_vectors,) = encoder.encode_query([query])
        docs = encoder.encode_document(documents)
        expected.append([float((query_vectors @ d.T).max(dim=1).values.sum()) for d in docs])
    return measure("late_interaction", list(zip(got, expected, strict=True)))


def decoder(kind: str, path: Path, count: int, **options) -> Fidelity:
    """A tiny decoder (label scorer, classifier, hybrid) on token ids against transformers one pair at
    a time (tests/engine/reference.py)."""
    from kafka_scorer.engine.scorer import Scorer
    from tests.engine.reference import reference_scores

    scorer = Scorer(str(path), dtype="bfloat16", device="cpu", prefix_cache_mb=0, **options)
    causal = kind != "classifier"
    labels = {"label_token_ids": CAUSAL_LABELS} if causal else {}
    workload = id_workload(count, scorer.describe().loaded.input_vocab_size)
    jobs = [Job(id=str(i), query=q, items=d, **labels) for i, (q, d) in enumerate(workload)]  # type: ignore[arg-type]
    got = engine_scores(scorer, jobs)
    expected = [
        [row[-1] for row in reference_scores(path, q, d, CAUSAL_LABELS if causal else None)]
        for q, d in workload
    ]
    return measure(kind, list(zip(got, expected, strict=True)))


def checkpoints(root: Path) -> dict[str, Callable[[int], Fidelity]]:
    """Every measured kind's run, its checkpoint built under `root` when first asked for."""
    from kafka_scorer.checkpoints.real_models import build_minilm_colbert, build_minilm_cross_encoder
    from kafka_scorer.checkpoints.tiny_models import build_tiny_model

    def tiny(arch: str, kind: str) -> Path:
        return build_tiny_model(root / f"{arch}-{kind}", arch, kind)  # type: ignore[arg-type]

    return {
        "cross_encoder": lambda n: cross_encoder(build_minilm_cross_encoder(root / "minilm-ce"), n),
        "late_interaction": lambda n: late_interaction(build_minilm_colbert(root / "minilm-colbert"), n),
        "label_scorer": lambda n: decoder("label_scorer", tiny("qwen3", "causal"), n),
        "classifier": lambda n: decoder("classifier", tiny("qwen3", "classification"), n),
        "hybrid": lambda n: decoder("hybrid", tiny("qwen3_5", "causal"), n, decoder_forward="transformers"),
    }


HEADER = (
    "| kind | queries | top-10 overlap (mean) | top-10 overlap (worst) | Kendall's tau (mean) "
    "| Kendall's tau (worst) | largest difference / spread | largest difference | auto on a bf16 CPU |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
)


def main(argv: list[str]) -> None:
    count = int(argv[0]) if argv else 50
    kinds = argv[1:]
    with tempfile.TemporaryDirectory() as root:
        runs = checkpoints(Path(root))
        print(HEADER)
        for kind, measured in runs.items():
            if not kinds or kind in kinds:
                print(measured(count).row(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
