"""The `cross-encoder` workload: a real MiniLM cross-encoder against the libraries CPU users rerank with.

The model is all-MiniLM-L6-v2's real BERT weights and WordPiece tokenizer under a seeded head
(`checkpoints/real_models.py`): the shape of the ms-marco-MiniLM cross-encoders. Each query is ~16 tokens
against 100 documents of 20–250 tokens, their lengths spread like web passages (log-normal, median
~80), cut into jobs of 10–100 documents. Documents are real vocabulary words, one WordPiece token each,
so their token lengths are the drawn ones.

Contenders, one run, the same jobs:
- `engine`: our `Scorer` (pairs of many jobs in one unpadded varlen forward), closed loop as in `contenders`;
- `cross-encoder`: sentence-transformers' `CrossEncoder.predict` (its default batch size, 32) per job; it
  sorts a call's pairs by length before batching, so its padding is already small;
- `padded`: plain transformers, `tokenizer(pairs, padding=True)` in batches of 32 per job, in job order;
- `worker`: the full worker through an embedded broker, on the engine's `Scorer`.
Every contender's scores are raw logits, compared with `CrossEncoder.predict`'s.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kafka_scorer.wire.protocol import Job
from kafka_scorer_bench.contenders import Contender, EngineContender, OneJobAtATime
from kafka_scorer_bench.contenders import timed as timed_run
from kafka_scorer_bench.matmul_peak import gemm_rate
from kafka_scorer_bench.probes import RunProbe
from kafka_scorer_bench.records import RunRecord
from kafka_scorer_bench.summary import max_abs_diff
from kafka_scorer_bench.workloads import passage_length, words_text

CROSS_ENCODER_BATCH = 32
"""`CrossEncoder.predict`'s default batch size, used by the padded contender too."""


@dataclass(frozen=True)
class CrossEncoderShape:
    query_tokens: int = 16
    docs_per_query: int = 100
    doc_min: int = 20
    doc_max: int = 250
    doc_median: int = 80
    job_min: int = 10
    job_max: int = 100


QUICK_SHAPE = CrossEncoderShape(
    query_tokens=8, docs_per_query=12, doc_min=4, doc_max=40, doc_median=12, job_min=3, job_max=8
)
"""Seconds instead of minutes, for the tests."""


def _vocabulary_words(tokenizer) -> list[str]:
    """Whole lower-case words of the vocabulary: each tokenizes to exactly one token."""
    return sorted(
        word for word in tokenizer.get_vocab() if word.isalpha() and word.islower() and len(word) > 2
    )


def build_cross_encoder_jobs(
    tokenizer, num_queries: int, *, seed: int = 0, shape=CrossEncoderShape()
) -> list[Job]:
    """Same tokenizer, count and seed -> the same jobs, word for word."""
    rng = random.Random(f"cross-encoder:{seed}")
    words = _vocabulary_words(tokenizer)

    def text(n: int) -> str:
        return words_text(rng, words, n)

    def doc_len() -> int:
        return passage_length(rng, shape.doc_median, shape.doc_min, shape.doc_max)

    jobs: list[Job] = []
    for q in range(num_queries):
        query = text(shape.query_tokens)
        docs = [text(doc_len()) for _ in range(shape.docs_per_query)]
        while docs:
            size = min(len(docs), rng.randint(shape.job_min, shape.job_max))
            jobs.append(Job(id=f"ce-{q}-{len(jobs)}", query=query, items=docs[:size]))
            docs = docs[size:]
    return jobs


class CrossEncoderContender(OneJobAtATime):
    """sentence-transformers' `CrossEncoder.predict`, default batch size, raw logits."""

    def __init__(self, cross_encoder) -> None:
        super().__init__()
        self.cross_encoder = cross_encoder

    def score(self, job: Job) -> list[list[float]]:
        pairs = [(job.query, item) for item in job.items]
        scores = self.cross_encoder.predict(
            pairs, batch_size=CROSS_ENCODER_BATCH, show_progress_bar=False, convert_to_tensor=True
        )
        return scores.float().reshape(len(pairs), -1).tolist()


class PaddedContender(OneJobAtATime):
    """Plain transformers: the job's pairs in batches of 32, each padded to its longest pair."""

    def __init__(self, model, tokenizer) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer

    @torch.inference_mode()
    def score(self, job: Job) -> list[list[float]]:
        rows: list[list[float]] = []
        for start in range(0, len(job.items), CROSS_ENCODER_BATCH):
            items = job.items[start : start + CROSS_ENCODER_BATCH]
            encoded = self.tokenizer([job.query] * len(items), items, padding=True, return_tensors="pt")
            self.forward_tokens += int(encoded["input_ids"].numel())
            rows.extend(self.model(**encoded).logits.float().tolist())
        return rows


def run_cross_encoder_bench(
    *,
    num_queries: int = 2,
    seed: int = 0,
    model_dir: str | None = None,
    skip_worker: bool = False,
    repeats: int = 2,
    repeat_budget_s: float = 30.0,
    max_batch_tokens: int = 8192,
    quick: bool = False,
    log: Callable = print,
) -> dict:
    """CPU, float32: the configuration CrossEncoder users run."""
    import tempfile

    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from kafka_scorer.checkpoints.real_models import build_minilm_cross_encoder
    from kafka_scorer.engine.api import Scorer
    from kafka_scorer_bench.worker_contender import run_worker_contender

    with tempfile.TemporaryDirectory(prefix="kafka-scorer-ce-") as scratch:
        path = Path(model_dir or scratch) / "minilm-cross-encoder"
        if not (path / "config.json").exists():
            build_minilm_cross_encoder(path, num_labels=1, seed=seed)
        scorer = Scorer(str(path), dtype="float32", device="cpu", max_batch_tokens=max_batch_tokens)
        cross_encoder = CrossEncoder(str(path), device="cpu", activation_fn=torch.nn.Identity())
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        shape = QUICK_SHAPE if quick else CrossEncoderShape()
        jobs = build_cross_encoder_jobs(tokenizer, num_queries, seed=seed, shape=shape)
        items = sum(len(job.items) for job in jobs)
        lengths = [[len(tokenizer(job.query, item)["input_ids"]) for item in job.items] for job in jobs]
        pair_tokens = sum(map(sum, lengths))
        log(f"cross-encoder: {len(jobs)} jobs, {items} pairs, {pair_tokens} tokens")
        probe = RunProbe(torch.device("cpu"))
        window = 4

        def timed(make: Callable[[], Contender]) -> RunRecord:
            return timed_run(make, jobs, window, probe, repeats, repeat_budget_s)

        runs: dict[str, RunRecord] = {}
        log("  CrossEncoder.predict ...")
        runs["cross-encoder"] = timed(lambda: CrossEncoderContender(cross_encoder))
        log("  transformers padded ...")
        runs["padded"] = timed(lambda: PaddedContender(model, tokenizer))
        log(f"  engine [{scorer.describe().attention_backend}] ...")
        runs["engine"] = timed(lambda: EngineContender(scorer, None))
        if not skip_worker:
            log("  worker via broker ...")
            runs["worker"] = run_worker_contender(
                scorer, jobs, window, probe, repeats, repeat_budget_s, quick=quick
            )

    config = model.config
    # Matmul FLOPs of the real tokens (projections and MLP, plus QKᵀ and PV over each pair), at the best
    # rate this CPU reaches on the model's own matmul shape: the time no contender can beat.
    dense = (
        2
        * config.num_hidden_layers
        * (4 * config.hidden_size**2 + 2 * config.hidden_size * config.intermediate_size)
    )
    attention = sum(4 * config.num_hidden_layers * config.hidden_size * n * n for job in lengths for n in job)
    floor_s = (dense * pair_tokens + attention) / gemm_rate(
        (4096, config.hidden_size, config.intermediate_size), torch.device("cpu"), torch.float32, 5, warm=0
    )
    reference = runs["cross-encoder"].scores
    contenders = {
        key: {
            "items_per_s": items / record.wall_s,
            "tokens_per_s": pair_tokens / record.wall_s,
            "wall_s": record.wall_s,
            "floor_fraction": floor_s / record.wall_s,
            "peak_memory_bytes": record.peak_bytes,
            "max_abs_diff_vs_cross_encoder": max_abs_diff(record.scores, reference),
            "errors": sum(1 for error in record.errors if error),
            "foreign_cpu_load": record.foreign_cpu_load,
            "runs": record.runs,
        }
        for key, record in runs.items()
    }
    engine = contenders["engine"]["items_per_s"]
    ratios = {
        "engine_over_cross_encoder": engine / contenders["cross-encoder"]["items_per_s"],
        "engine_over_padded": engine / contenders["padded"]["items_per_s"],
    }
    if "worker" in contenders:
        ratios["worker_over_engine"] = contenders["worker"]["items_per_s"] / engine
    return {
        "shape": asdict(shape),
        "compute_floor_s": floor_s,
        "jobs": len(jobs),
        "items": items,
        "pair_tokens": pair_tokens,
        "padded_tokens": runs["padded"].forward_tokens,
        "cross_encoder_tokens": sum(_length_sorted_padding(job_lengths) for job_lengths in lengths),
        "torch_threads": torch.get_num_threads(),
        "contenders": contenders,
        "ratios": ratios,
        "ok": all(
            c["errors"] == 0 and c["max_abs_diff_vs_cross_encoder"] <= 1e-4 for c in contenders.values()
        ),
    }


def _length_sorted_padding(lengths: list[int], batch: int = CROSS_ENCODER_BATCH) -> int:
    """Tokens `CrossEncoder.predict` runs for one call: pairs sorted by length, each batch padded."""
    ordered = sorted(lengths, reverse=True)
    return sum(
        ordered[start] * len(ordered[start : start + batch]) for start in range(0, len(ordered), batch)
    )


def format_cross_encoder_report(report: dict) -> str:
    lines = [
        f"cross-encoder (real MiniLM-L6 weights, CPU float32, {report['torch_threads']} threads): "
        f"{report['jobs']} jobs, {report['items']} pairs, {report['pair_tokens']} tokens "
        f"(padded: {report['cross_encoder_tokens']} in CrossEncoder's length-sorted batches of "
        f"{CROSS_ENCODER_BATCH}, {report['padded_tokens']} in job order)",
        f"compute floor: {report['compute_floor_s']:.2f} s (real tokens at the best matmul rate); "
        "floor: that / wall",
        f"{'contender':<16}{'items/s':>10}{'tok/s':>10}{'wall s':>9}{'peak mem':>11}{'floor':>7}"
        f"{'max|diff|':>11}{'others':>8}{'runs':>6}",
    ]
    for key, c in report["contenders"].items():
        load = "?" if c["foreign_cpu_load"] is None else f"{c['foreign_cpu_load']:.0%}"
        lines.append(
            f"{key:<16}{c['items_per_s']:>10,.1f}{c['tokens_per_s']:>10,.0f}{c['wall_s']:>9.2f}"
            f"{c['peak_memory_bytes'] / 2**20:>7,.0f} MiB{c['floor_fraction']:>7.2f}"
            f"{c['max_abs_diff_vs_cross_encoder']:>11.1e}"
            f"{load:>8}{c['runs']:>6}"
        )
    lines.append("ratios (items/s): " + "; ".join(f"{k} {v:.2f}" for k, v in report["ratios"].items()))
    return "\n".join(lines)
