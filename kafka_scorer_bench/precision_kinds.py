"""The kinds the `bf16-floor` workload runs in both precisions: their jobs, models and contenders.

Each kind is the bench's existing workload for it, so the floor is read on the jobs its own report
measures: the cross-encoder's MiniLM jobs (`cross_encoder.py`), the rerank workload of a label scorer
(`workloads.py`, MIS on) and the late-interaction jobs of a ColBERT (`late_interaction.py`). A kind's
checkpoint is written once in float32; each precision loads it converted, as `dtype=bfloat16` serves a
float32 download, so both runs read the same weights. Contenders beside the engine are the libraries the
kind's own workload compares with, loaded in the same precision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from kafka_scorer.wire.protocol import Job
from kafka_scorer_bench.contenders import BaselineContender, Contender, EngineContender, window_for
from kafka_scorer_bench.models import ModelShape

Factories = dict[str, Callable[[], Contender]]
"""Contender name -> a fresh contender (each timed run starts from an empty queue)."""


@dataclass(frozen=True)
class PrecisionKind:
    name: str
    model: str
    """What serves it, in words, for the report."""
    jobs: list[Job]
    gemm_shape: tuple[int, int, int]
    """The model's MLP matmul, `[rows, hidden] @ [hidden, intermediate]`: the probe's shape."""
    load: Callable[[str], Factories]
    """Dtype name -> the kind's contenders loaded in it, the engine first."""
    reference: str
    """The contender every other's float32 scores are checked against."""
    window: int = 4

    @property
    def items(self) -> int:
        return sum(len(job.items) for job in self.jobs if isinstance(job.items, list))


def cross_encoder_kind(root: Path, *, quick: bool, seed: int, queries: int, budget: int) -> PrecisionKind:
    """Real MiniLM-L6 weights under a seeded head; the engine, `CrossEncoder.predict`, padded transformers."""
    from transformers import AutoTokenizer

    from kafka_scorer.checkpoints.real_models import build_minilm_cross_encoder
    from kafka_scorer_bench.cross_encoder import QUICK_SHAPE, CrossEncoderShape, build_cross_encoder_jobs

    path = root / "minilm-cross-encoder"
    if not (path / "config.json").exists():
        build_minilm_cross_encoder(path, num_labels=1, seed=seed)
    shape = QUICK_SHAPE if quick else CrossEncoderShape()
    jobs = build_cross_encoder_jobs(AutoTokenizer.from_pretrained(path), queries, seed=seed, shape=shape)

    def load(dtype: str) -> Factories:
        from sentence_transformers import CrossEncoder
        from transformers import AutoModelForSequenceClassification

        from kafka_scorer_bench.cross_encoder import CrossEncoderContender, PaddedContender

        scorer = _scorer(path, dtype, budget)
        library = CrossEncoder(str(path), device="cpu", activation_fn=torch.nn.Identity()).to(_torch(dtype))
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=_torch(dtype)).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        return {
            "engine": lambda: EngineContender(scorer, None),
            "CrossEncoder.predict": lambda: CrossEncoderContender(library),
            "transformers padded": lambda: PaddedContender(model, tokenizer),
        }

    return PrecisionKind(
        "cross-encoder", "real MiniLM-L6 weights", jobs, _minilm_gemm(quick), load, "CrossEncoder.predict"
    )


def rerank_kind(
    root: Path, shape: ModelShape, *, quick: bool, seed: int, jobs: int, budget: int
) -> PrecisionKind:
    """A random decoder of `shape` as a label scorer on the rerank workload, MIS on; the transformers
    baseline (padded pairs, `baseline.py`) beside it."""
    from kafka_scorer_bench.baseline import BaselineScorer
    from kafka_scorer_bench.models import build_shaped_model
    from kafka_scorer_bench.workloads import build_workload, with_multi_item, workload_spec

    path = root / f"{shape.name}-causal-float32"
    if not (path / "config.json").exists():
        build_shaped_model(path, shape, "causal", dtype="float32")
    spec = workload_spec("rerank", quick=quick, num_jobs=jobs)
    workload = build_workload(spec, shape.vocab_size, seed=seed)

    def load(dtype: str) -> Factories:
        scorer = _scorer(path, dtype, budget, prefix_cache_mb=0)  # repeats must not hit a cache
        baseline = BaselineScorer(str(path), dtype=_torch(dtype), device=torch.device("cpu"))
        return {
            "engine": lambda: EngineContender(scorer, None),
            "transformers": lambda: BaselineContender(baseline, budget),
        }

    return PrecisionKind(
        "rerank",
        f"random {shape.name} decoder, label scorer, MIS on",
        with_multi_item(workload.jobs, True),
        (512 if quick else 4096, shape.hidden_size, shape.intermediate_size),
        load,
        "transformers",
        window_for(workload, budget),
    )


def late_interaction_kind(root: Path, *, quick: bool, seed: int, queries: int, budget: int) -> PrecisionKind:
    """Real MiniLM-L6 weights under a seeded ColBERT projection; the engine (embedding cache off, so a
    repeat computes what the first did) and sentence-transformers' `MultiVectorEncoder`."""
    from transformers import AutoTokenizer

    from kafka_scorer.checkpoints.real_models import build_minilm_colbert
    from kafka_scorer_bench.late_interaction import QUICK_SHAPE, LateShape, build_late_jobs

    path = root / "minilm-colbert"
    if not (path / "modules.json").exists():
        build_minilm_colbert(path, seed=seed)
    shape = replace(QUICK_SHAPE if quick else LateShape(), queries=queries)
    jobs, _ = build_late_jobs(AutoTokenizer.from_pretrained(path), seed=seed, shape=shape)

    def load(dtype: str) -> Factories:
        from sentence_transformers import MultiVectorEncoder

        from kafka_scorer_bench.late_interaction import MultiVectorContender

        scorer = _scorer(path, dtype, budget, embedding_cache_mb=0)
        library = MultiVectorEncoder(str(path), device="cpu").to(_torch(dtype))
        return {
            "engine": lambda: EngineContender(scorer, None),
            "MultiVectorEncoder": lambda: MultiVectorContender(library),
        }

    return PrecisionKind(
        "late-interaction",
        "real MiniLM-L6 weights + seeded 128-dim projection",
        jobs,
        _minilm_gemm(quick),
        load,
        "MultiVectorEncoder",
    )


def _scorer(path: Path, dtype: str, budget: int, **settings):
    from kafka_scorer.engine.api import Scorer

    return Scorer(str(path), dtype=dtype, device="cpu", max_batch_tokens=budget, **settings)


def _torch(dtype: str) -> torch.dtype:
    return getattr(torch, dtype)


def _minilm_gemm(quick: bool) -> tuple[int, int, int]:
    """MiniLM-L6's MLP matmul (hidden 384, intermediate 1536)."""
    return (512 if quick else 4096, 384, 1536)
