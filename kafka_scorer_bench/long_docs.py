"""The `long-docs` workload: documents longer than a pair, scored whole with `chunking` (SPEC §9).

Documents of 300–3,000 tokens (log-uniform) against 16-token queries, 10 documents a job; every word is
one WordPiece token, so a document's token length is its drawn length and a window of tokens is a run of
words. Two runs, one report (contenders take turns, the fastest run of each is kept):

- cross-encoder: the real MiniLM cross-encoder (`checkpoints/real_models.py`), pair limit 512, CPU float32.
  `engine`: our `Scorer` with `chunking: {overlap, aggregate: max}`, jobs driven as in `contenders`.
  `cross-encoder`: what a user writes by hand with sentence-transformers: split each document's tokens
  into the same windows, `CrossEncoder.predict` on all of a job's windows in one call (its default batch
  size, 32; it sorts them by length), the max per document. Rows are compared.
- decoder: a random decoder of the bench's shapes (`models.py`) with the same windows as token ids,
  `multi_item: false` (each window a pair, the query repeated) against MIS (every window of a job an
  item behind one query); items/s of both and the token ratio (pair tokens / packed tokens).
"""

from __future__ import annotations

import math
import random
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec
import torch

from kafka_scorer.engine.api import window_ranges
from kafka_scorer.wire.protocol import Chunking, Job
from kafka_scorer_bench.contenders import Contender, EngineContender, drive, warmup_jobs
from kafka_scorer_bench.cross_encoder import CROSS_ENCODER_BATCH, _vocabulary_words
from kafka_scorer_bench.models import FIRST_REGULAR_ID
from kafka_scorer_bench.probes import RunProbe
from kafka_scorer_bench.records import RunRecord, fastest
from kafka_scorer_bench.summary import max_abs_diff


@dataclass(frozen=True)
class LongDocShape:
    query_tokens: int = 16
    docs: int = 30
    doc_min: int = 300
    doc_max: int = 3000
    docs_per_job: int = 10
    pair_limit: int = 512
    overlap: int = 32
    decoder_docs: int = 10
    decoder_shape: str = "cpu-small"


QUICK_SHAPE = LongDocShape(
    query_tokens=6,
    docs=4,
    doc_min=30,
    doc_max=120,
    docs_per_job=2,
    pair_limit=48,
    overlap=4,
    decoder_docs=4,
    decoder_shape="tiny",
)
"""Seconds instead of minutes, for the tests."""


def build_long_doc_jobs(tokenizer, shape: LongDocShape = LongDocShape(), *, seed: int = 0) -> list[Job]:
    """Text jobs with `chunking`; same tokenizer, shape and seed -> the same jobs, word for word."""
    rng = random.Random(f"long-docs:{seed}")
    words = _vocabulary_words(tokenizer)

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    def doc_len() -> int:
        return round(math.exp(rng.uniform(math.log(shape.doc_min), math.log(shape.doc_max))))

    query = text(shape.query_tokens)
    docs = [text(doc_len()) for _ in range(shape.docs)]
    chunking = Chunking(overlap=shape.overlap, aggregate="max")
    return [
        Job(
            id=f"long-{start}", query=query, items=docs[start : start + shape.docs_per_job], chunking=chunking
        )
        for start in range(0, len(docs), shape.docs_per_job)
    ]


class HandChunkedCrossEncoder(Contender):
    """`CrossEncoder.predict` on windows split by hand: one call per job, the max per document."""

    def __init__(self, cross_encoder, window: int, overlap: int) -> None:
        self.cross_encoder = cross_encoder
        self.window = window
        self.overlap = overlap
        self.queue: list[tuple[int, Job]] = []

    def submit(self, index: int, job: Job) -> None:
        self.queue.append((index, job))

    def step(self):
        index, job = self.queue.pop(0)
        pairs, owners = [], []
        for doc, item in enumerate(job.items):
            words = str(item).split(" ")
            for start, end in window_ranges(len(words), self.window, self.overlap):
                pairs.append((job.query, " ".join(words[start:end])))
                owners.append(doc)
        scores = self.cross_encoder.predict(pairs, batch_size=CROSS_ENCODER_BATCH, show_progress_bar=False)
        best: list[float] = [-math.inf] * len(job.items)
        for doc, score in zip(owners, torch.as_tensor(scores).reshape(-1).tolist()):
            best[doc] = max(best[doc], score)
        return [(index, [[score] for score in best], None)]


def run_long_docs_bench(
    *,
    seed: int = 0,
    model_dir: str | None = None,
    repeats: int = 2,
    repeat_budget_s: float = 30.0,
    max_batch_tokens: int = 8192,
    quick: bool = False,
    log: Callable = print,
) -> dict:
    shape = QUICK_SHAPE if quick else LongDocShape()
    with tempfile.TemporaryDirectory(prefix="kafka-scorer-long-") as scratch:
        root = Path(model_dir or scratch)
        report = {"shape": asdict(shape), "torch_threads": torch.get_num_threads()}
        report["cross_encoder"] = _cross_encoder_run(
            root, shape, seed, repeats, repeat_budget_s, max_batch_tokens, log
        )
        report["decoder"] = _decoder_run(root, shape, seed, repeats, repeat_budget_s, max_batch_tokens, log)
    report["ok"] = report["cross_encoder"]["ok"] and report["decoder"]["ok"]
    return report


def _cross_encoder_run(root, shape, seed, repeats, budget, max_batch_tokens, log) -> dict:
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer

    from kafka_scorer.checkpoints.real_models import build_minilm_cross_encoder
    from kafka_scorer.engine.api import Scorer

    path = root / "minilm-cross-encoder"
    if not (path / "config.json").exists():
        build_minilm_cross_encoder(path, num_labels=1, seed=seed)
    scorer = Scorer(
        str(path),
        dtype="float32",
        device="cpu",
        max_batch_tokens=max_batch_tokens,
        max_pair_tokens=shape.pair_limit,
    )
    cross_encoder = CrossEncoder(str(path), device="cpu", activation_fn=torch.nn.Identity())
    tokenizer = AutoTokenizer.from_pretrained(path)
    jobs = build_long_doc_jobs(tokenizer, shape, seed=seed)
    window = shape.pair_limit - shape.query_tokens - 3  # [CLS] query [SEP] window [SEP]
    lengths = [len(str(item).split(" ")) for job in jobs for item in job.items]
    windows = sum(len(window_ranges(n, window, shape.overlap)) for n in lengths)
    items = len(lengths)
    log(
        f"long-docs cross-encoder: {len(jobs)} jobs, {items} documents of {min(lengths)}-{max(lengths)} "
        f"tokens, {windows} windows"
    )
    makers = {
        "cross-encoder": lambda: HandChunkedCrossEncoder(cross_encoder, window, shape.overlap),
        "engine": lambda: EngineContender(scorer, None),
    }
    runs = _interleaved({name: (make, jobs) for name, make in makers.items()}, repeats, budget)
    contenders = _contenders(runs, items, reference="cross-encoder")
    return {
        "jobs": len(jobs),
        "items": items,
        "windows": windows,
        "doc_tokens": sum(lengths),
        "contenders": contenders,
        "engine_over_cross_encoder": contenders["engine"]["items_per_s"]
        / contenders["cross-encoder"]["items_per_s"],
        "ok": all(c["errors"] == 0 and c["max_abs_diff"] <= 1e-4 for c in contenders.values()),
    }


def _decoder_run(root, shape, seed, repeats, budget, max_batch_tokens, log) -> dict:
    from kafka_scorer.engine.api import Scorer
    from kafka_scorer_bench.models import SHAPES, build_shaped_model

    path = root / f"decoder-{shape.decoder_shape}"
    if not (path / "config.json").exists():
        build_shaped_model(path, shape.decoder_shape, "causal")
    scorer = Scorer(
        str(path),
        dtype="float32",
        device="cpu",
        max_batch_tokens=max_batch_tokens,
        max_pair_tokens=shape.pair_limit,
    )
    vocab = SHAPES[shape.decoder_shape].vocab_size
    rng = random.Random(f"long-docs-decoder:{seed}")

    def ids(n: int) -> list[int]:
        return [rng.randrange(FIRST_REGULAR_ID, vocab) for _ in range(n)]

    query = ids(shape.query_tokens * 4)  # a decoder reranker's prompt head is longer than a bare query
    lengths = [
        round(math.exp(rng.uniform(math.log(shape.doc_min), math.log(shape.doc_max))))
        for _ in range(shape.decoder_docs)
    ]
    chunking = Chunking(overlap=shape.overlap, aggregate="max")
    base = [
        Job(
            id=f"dec-{s}",
            query=query,
            items=[ids(n) for n in lengths[s : s + shape.docs_per_job]],
            label_token_ids=[FIRST_REGULAR_ID, FIRST_REGULAR_ID + 1],
            chunking=chunking,
        )
        for s in range(0, len(lengths), shape.docs_per_job)
    ]
    log(
        f"long-docs decoder ({shape.decoder_shape}): {len(base)} jobs, {len(lengths)} documents, "
        f"query {len(query)} tokens"
    )
    variants = {
        name: [msgspec.structs.replace(job, multi_item=mi) for job in base]
        for name, mi in (("pairs", False), ("mis", None))
    }
    tokens = {
        name: sum(scorer.engine.prepare(job, job.id or "").num_tokens for job in jobs)
        for name, jobs in variants.items()
    }
    runs = _interleaved(
        {name: (lambda: EngineContender(scorer, None), jobs) for name, jobs in variants.items()},
        repeats,
        budget,
    )
    contenders = _contenders(runs, len(lengths), reference="pairs")
    token_ratio = tokens["pairs"] / tokens["mis"]
    speedup = contenders["mis"]["items_per_s"] / contenders["pairs"]["items_per_s"]
    return {
        "model_shape": shape.decoder_shape,
        "jobs": len(base),
        "items": len(lengths),
        "query_tokens": len(query),
        "tokens": tokens,
        "token_ratio": token_ratio,
        "mis_over_pairs": speedup,
        "share_of_token_ratio": speedup / token_ratio,
        "contenders": contenders,
        "ok": all(c["errors"] == 0 and c["max_abs_diff"] <= 1e-4 for c in contenders.values()),
    }


def _interleaved(
    contenders: dict[str, tuple[Callable[[], Contender], list[Job]]], repeats: int, budget: float
) -> dict[str, RunRecord]:
    """Rounds of one run per contender, alternating, the fastest run of each kept.

    Other work on a shared machine comes in bursts; running the contenders in turn spreads a burst
    over both instead of charging it to whichever ran all its repeats then (the ratio is the figure).
    """
    probe = RunProbe(torch.device("cpu"))
    for make, jobs in contenders.values():
        drive(make(), warmup_jobs(jobs, max_items=1), 2, probe)
    records: dict[str, list[RunRecord]] = {name: [] for name in contenders}
    while True:
        for name, (make, jobs) in contenders.items():
            records[name].append(drive(make(), jobs, 2, probe))
        spent = sum(r.wall_s for runs in records.values() for r in runs)
        if len(next(iter(records.values()))) >= repeats or spent >= budget * len(contenders):
            return {name: fastest(runs) for name, runs in records.items()}


def _contenders(runs: dict[str, RunRecord], items: int, *, reference: str) -> dict:
    return {
        key: {
            "items_per_s": items / record.wall_s,
            "wall_s": record.wall_s,
            "forward_tokens": record.forward_tokens,
            "max_abs_diff": max_abs_diff(record.scores, runs[reference].scores),
            "errors": sum(1 for error in record.errors if error),
            "foreign_cpu_load": record.foreign_cpu_load,
            "runs": record.runs,
        }
        for key, record in runs.items()
    }


def format_long_docs_report(report: dict) -> str:
    ce, dec = report["cross_encoder"], report["decoder"]
    lines = [
        f"long-docs, cross-encoder (real MiniLM-L6 weights, CPU float32, {report['torch_threads']} threads): "
        f"{ce['jobs']} jobs, {ce['items']} documents, {ce['doc_tokens']} tokens in {ce['windows']} windows "
        f"(pair limit {report['shape']['pair_limit']}, overlap {report['shape']['overlap']}, max)",
        f"{'contender':<16}{'items/s':>10}{'wall s':>9}{'max|diff|':>11}{'others':>8}{'runs':>6}",
    ]
    lines += [_row(key, c) for key, c in ce["contenders"].items()]
    lines.append(
        f"ratio (items/s): engine / hand-chunked CrossEncoder.predict {ce['engine_over_cross_encoder']:.2f}"
    )
    lines.append(
        f"long-docs, decoder ({dec['model_shape']}, query {dec['query_tokens']} tokens): {dec['jobs']} jobs, "
        f"{dec['items']} documents; tokens run: pairs {dec['tokens']['pairs']}, MIS {dec['tokens']['mis']} "
        f"(token ratio {dec['token_ratio']:.2f})"
    )
    lines += [_row(key, c) for key, c in dec["contenders"].items()]
    lines.append(
        f"ratio (items/s): MIS / pairs {dec['mis_over_pairs']:.2f}, "
        f"{dec['share_of_token_ratio']:.2f} of the token ratio"
    )
    return "\n".join(lines)


def _row(key: str, c: dict) -> str:
    load = "?" if c["foreign_cpu_load"] is None else f"{c['foreign_cpu_load']:.0%}"
    figures = f"{c['items_per_s']:>10,.2f}{c['wall_s']:>9.2f}{c['max_abs_diff']:>11.1e}"
    return f"{key:<16}{figures}{load:>8}{c['runs']:>6}"
