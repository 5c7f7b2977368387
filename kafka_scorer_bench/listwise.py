"""The `listwise` workload: a jina-reranker-v3-layout model against transformers and against pointwise MIS.

Issue 48's question: what reading a job's documents in one causal sequence costs and gains. Random
weights in the published layout (`checkpoints/tiny_listwise.py`), a Qwen3 body of `--model-shape`'s
hidden size and depth; queries of 8 words against 32 documents of 10-60 words (log-normal, median 25),
words the tiny chat tokenizer knows whole (`templated.WORDS`). Contenders, CPU float32, the same jobs:
- `engine listwise`: this engine's listwise kind, jobs batched as the worker batches them (closed loop);
- `transformers reference`: the tests' independent reference (`listwise_reference.py`: transformers'
  `Qwen3Model` on one job's prompt at a time, the projector and the cosine in numpy), one job at a time,
  as the model's published `rerank` runs; every engine score is checked against it (within 1e-5);
- `engine pointwise MIS`: a pointwise reranker of the same body (`build_tiny_reranker`: Qwen3, the same
  hidden size, depth, heads and MLP width) under the `qwen3-reranker` template, MIS on, on the same
  queries and documents: what the job costs when each document is scored on its own against the query.
The prompts differ by design (one listwise prompt per job; the pointwise template's head once per job
plus each document's part), so each contender's tokens/s counts the tokens it ran, and items/s (documents
scored per second) is the figure the three share.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import msgspec

from kafka_scorer.wire.protocol import Job
from kafka_scorer_bench.contenders import Contender, EngineContender, OneJobAtATime, timed
from kafka_scorer_bench.listwise_reference import TOLERANCE
from kafka_scorer_bench.models import ModelShape
from kafka_scorer_bench.records import RunRecord
from kafka_scorer_bench.report_text import fmt_load
from kafka_scorer_bench.summary import max_abs_diff
from kafka_scorer_bench.templated import WORDS
from kafka_scorer_bench.workloads import passage_length, words_text


@dataclass(frozen=True)
class ListwiseShape:
    jobs: int = 4
    query_words: int = 8
    docs_per_job: int = 32
    doc_min: int = 10
    doc_max: int = 60
    doc_median: int = 25


QWEN3_POSITIONS = 40960
"""The pointwise reranker's context, as Qwen3-Reranker publishes it: a job's MIS-packed sequence fits."""

QUICK_SHAPE = ListwiseShape(jobs=3, query_words=4, docs_per_job=5, doc_min=3, doc_max=12, doc_median=6)
"""Seconds instead of minutes, for the tests."""


def build_listwise_jobs(shape: ListwiseShape, *, seed: int = 0) -> list[Job]:
    """Same shape and seed -> the same jobs, word for word."""
    rng = random.Random(f"listwise:{seed}")

    def document() -> str:
        return words_text(rng, WORDS, passage_length(rng, shape.doc_median, shape.doc_min, shape.doc_max))

    return [
        Job(
            id=f"lw-{j}",
            query=words_text(rng, WORDS, shape.query_words),
            items=[document() for _ in range(shape.docs_per_job)],
        )
        for j in range(shape.jobs)
    ]


def as_pointwise(jobs: list[Job]) -> list[Job]:
    """The same queries and documents for the pointwise reranker, MIS on (the whole job in one packed
    sequence, each document attending to the query and itself only)."""
    return [msgspec.structs.replace(job, multi_item=True) for job in jobs]


class ReferenceContender(OneJobAtATime):
    """The independent reference (`listwise_reference.Reference.scores`), one job at a time."""

    def __init__(self, reference) -> None:
        super().__init__()
        self.reference = reference
        self.reference.tokens_read = 0

    def score(self, job: Job) -> list[list[float]]:
        scores = self.reference.scores(str(job.query), list(job.items))  # type: ignore[arg-type]  # text jobs only
        self.forward_tokens = self.reference.tokens_read
        return [[score] for score in scores]


def build_checkpoints(root: Path, shape: ModelShape, seed: int) -> tuple[Path, Path]:
    """(listwise, pointwise) checkpoints of one body size, built once per `root`."""
    from kafka_scorer.checkpoints.tiny_listwise import build_tiny_listwise
    from kafka_scorer.checkpoints.tiny_models import build_tiny_reranker

    hidden, layers = shape.hidden_size, shape.num_layers
    listwise = root / f"listwise-{hidden}x{layers}"
    pointwise = root / f"pointwise-{hidden}x{layers}"
    if not (listwise / "config.json").exists():
        build_tiny_listwise(listwise, seed=seed, hidden_size=hidden, num_layers=layers)
    if not (pointwise / "config.json").exists():
        build_tiny_reranker(
            pointwise, seed=seed, hidden_size=hidden, num_layers=layers, max_positions=QWEN3_POSITIONS
        )
    return listwise, pointwise


def contenders(listwise: Path, pointwise: Path, budget: int) -> dict[str, Callable[[], Contender]]:
    from kafka_scorer.engine.api import Scorer
    from kafka_scorer_bench.listwise_reference import Reference

    options = dict(dtype="float32", device="cpu", max_batch_tokens=budget)
    engine = Scorer(str(listwise), **options)
    reference = Reference(listwise)
    mis = Scorer(str(pointwise), template="qwen3-reranker", prefix_cache_mb=0, **options)
    return {
        "engine listwise": lambda: EngineContender(engine, None),
        "transformers reference": lambda: ReferenceContender(reference),
        "engine pointwise MIS": lambda: EngineContender(mis, None),
    }


def run_listwise_bench(
    *,
    model_shape: ModelShape,
    jobs: int | None = None,
    seed: int = 0,
    model_dir: str | None = None,
    repeats: int = 2,
    repeat_budget_s: float = 30.0,
    max_batch_tokens: int = 8192,
    quick: bool = False,
    log: Callable = print,
) -> dict:
    import tempfile

    import torch

    from kafka_scorer_bench.probes import RunProbe

    shape = QUICK_SHAPE if quick else ListwiseShape()
    shape = replace(shape, jobs=jobs or shape.jobs)
    listwise_jobs = build_listwise_jobs(shape, seed=seed)
    pointwise_jobs = as_pointwise(listwise_jobs)
    with tempfile.TemporaryDirectory(prefix="kafka-scorer-listwise-") as scratch:
        root = Path(model_dir or scratch)
        root.mkdir(parents=True, exist_ok=True)
        makes = contenders(*build_checkpoints(root, model_shape, seed), max_batch_tokens)
    log(f"listwise: {shape.jobs} jobs x {shape.docs_per_job} documents")
    probe = RunProbe(torch.device("cpu"))
    runs: dict[str, RunRecord] = {}
    for name, make in makes.items():
        log(f"  {name} ...")
        sent = pointwise_jobs if name == "engine pointwise MIS" else listwise_jobs
        runs[name] = timed(make, sent, 4, probe, repeats, repeat_budget_s)
    return listwise_report(runs, shape, model_shape)


def listwise_report(runs: dict[str, RunRecord], shape: ListwiseShape, model_shape: ModelShape) -> dict:
    import torch

    items = shape.jobs * shape.docs_per_job
    reference = runs["transformers reference"].scores
    contenders: dict[str, dict] = {
        name: {
            "items_per_s": items / record.wall_s,
            "tokens_per_s": record.forward_tokens / record.wall_s,
            "tokens_per_job": record.forward_tokens / shape.jobs,
            "wall_s": record.wall_s,
            "score_rows": sum(len(scores) for scores in record.scores if scores is not None),
            "errors": sum(1 for error in record.errors if error),
            "first_error": next((error for error in record.errors if error), None),
            "foreign_cpu_load": record.foreign_cpu_load,
            "runs": record.runs,
        }
        for name, record in runs.items()
    }
    diff = max_abs_diff(runs["engine listwise"].scores, reference)
    engine = contenders["engine listwise"]["items_per_s"]
    return {
        "shape": asdict(shape),
        "body": {"hidden_size": model_shape.hidden_size, "num_layers": model_shape.num_layers},
        "items": items,
        "torch_threads": torch.get_num_threads(),
        "contenders": contenders,
        "max_abs_diff_vs_reference": diff,
        "ratios": {
            "listwise_over_reference": engine / contenders["transformers reference"]["items_per_s"],
            "listwise_over_pointwise_mis": engine / contenders["engine pointwise MIS"]["items_per_s"],
        },
        "ok": diff <= TOLERANCE
        and all(c["errors"] == 0 and c["score_rows"] == items for c in contenders.values()),
    }


def format_listwise_report(report: dict) -> str:
    shape, body = report["shape"], report["body"]
    lines = [
        f"listwise (random jina-reranker-v3 layout, Qwen3 body hidden {body['hidden_size']} x "
        f"{body['num_layers']} layers; pointwise: the same body under qwen3-reranker), CPU float32, "
        f"{report['torch_threads']} threads: {shape['jobs']} jobs x {shape['docs_per_job']} documents "
        f"of {shape['doc_min']}-{shape['doc_max']} words",
        "tok/s: the tokens each contender ran (its own prompts); items/s: documents scored per second",
        f"{'contender':<26}{'items/s':>10}{'tok/s':>10}{'tokens/job':>12}{'wall s':>9}{'others':>8}"
        f"{'runs':>6}",
    ]
    for name, c in report["contenders"].items():
        lines.append(
            f"{name:<26}{c['items_per_s']:>10,.1f}{c['tokens_per_s']:>10,.0f}{c['tokens_per_job']:>12,.0f}"
            f"{c['wall_s']:>9.2f}{fmt_load(c['foreign_cpu_load']):>8}{c['runs']:>6}"
        )
        if c["errors"]:
            lines.append(f"  {c['errors']} errors, first: {c['first_error']}")
    r = report["ratios"]
    lines += [
        f"ratios (items/s): listwise / transformers reference {r['listwise_over_reference']:.2f}; "
        f"listwise / pointwise MIS {r['listwise_over_pointwise_mis']:.2f}",
        f"engine listwise vs reference: max |diff| {report['max_abs_diff_vs_reference']:.1e} "
        f"(tolerance {TOLERANCE:.0e}): " + ("ok" if report["ok"] else "FAILED"),
    ]
    return "\n".join(lines)
