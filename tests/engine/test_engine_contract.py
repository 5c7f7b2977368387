"""The engine contract (tests/engine/contract.py) run against the worker's fake engine and a real
engine of every model kind, each on a tiny CPU checkpoint the suite already builds, in float32 and again
in bfloat16 (the `...Bf16` classes: what `dtype=auto` runs on a CPU that computes bf16 natively,
engine/load/precision.py), where deterministic mode, the prefix cache and the fault paths must keep the
same promises.

A real engine's faults go in at the model body, through torch's forward pre-hook: every kind's forward
runs its body once per forward with the forward's `input_ids` (the decoder runner, the encoder, the
late-interaction forward), so one seam serves them all and the rest is the real engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import msgspec
import pytest

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.kinds.choice import KINDS
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.engine.scoring_engine import ScoringEngine
from kafka_scorer.errors import SettingError
from kafka_scorer.wire.content import dec_hook
from kafka_scorer.wire.protocol import ErrorCode, Job
from kafka_scorer.worker.cache_metrics import EMBEDDING_CACHE, PREFIX_CACHE
from tests.engine.bi_encoder_kind import BiEncoderKind
from tests.engine.contract import POISON, EngineContract, run
from tests.engine.test_hybrid_models import _needs_family
from tests.engine.vision.images import picture
from tests.worker.conftest import FakeEngine, Fault

CAUSAL_LABELS: dict[str, Any] = {"label_token_ids": [5, 6]}


class TestFakeEngine(EngineContract):
    """The fake the worker's unit tests run on keeps the same promises."""

    @pytest.fixture
    def engine(self) -> FakeEngine:
        return FakeEngine()

    @pytest.fixture
    def deterministic_engine(self) -> FakeEngine:
        return FakeEngine()

    @pytest.fixture
    def cached_engine(self) -> FakeEngine:
        return FakeEngine()

    def max_items(self, engine: FakeEngine) -> int:
        return engine.max_items_per_job

    @contextmanager
    def breaking(self, engine: FakeEngine, fault: Fault) -> Iterator[list[int]]:
        sizes: list[int] = []

        def recorded(tokens) -> None:
            sizes.append(len(tokens))
            fault(tokens)

        engine.fault = recorded
        try:
            yield sizes
        finally:
            engine.fault = None


BF16_TOLERANCE = 2e-2
"""Batch-mates move a bf16 job's scores by rounding only: a few bf16 steps (2^-8 relative) of a score
below 1 (deterministic mode and the prefix cache stay bitwise: no tolerance)."""


class ScorerContract(EngineContract):
    """A real `Scorer`; subclasses say which checkpoint and `dtype`."""

    dtype: ClassVar[str] = "float32"

    def max_items(self, engine: ScoringEngine) -> int:
        return engine.describe().kind.preparer.limits.max_items_per_job

    @contextmanager
    def breaking(self, engine: ScoringEngine, fault: Fault) -> Iterator[list[int]]:
        sizes: list[int] = []

        def hook(module, args, kwargs) -> None:
            ids = kwargs["input_ids"]
            sizes.append(int(ids.numel()))
            fault(ids.flatten().tolist())

        handle = engine.describe().loaded.body.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            yield sizes
        finally:
            handle.remove()


def deterministic(make) -> ScoringEngine:
    """The kind's engine in deterministic mode, or a skip that says why the kind refuses it."""
    try:
        return make().engine
    except SettingError as exc:
        pytest.skip(f"refuses deterministic mode: {exc}")


class TestCausalLM(ScorerContract):
    labels = CAUSAL_LABELS

    @pytest.fixture
    def engine(self, scorer_for) -> ScoringEngine:
        return scorer_for("qwen3", "causal", dtype=self.dtype).engine

    @pytest.fixture
    def deterministic_engine(self, scorer_for) -> ScoringEngine:
        return deterministic(lambda: scorer_for("qwen3", "causal", deterministic=True, dtype=self.dtype))

    @pytest.fixture
    def cached_engine(self, scorer_for) -> ScoringEngine:
        return scorer_for("qwen3", "causal", prefix_cache_mb=-1, dtype=self.dtype).engine


class TestDecoderClassifier(ScorerContract):
    @pytest.fixture
    def engine(self, scorer_for) -> ScoringEngine:
        return scorer_for("qwen3", "classification", dtype=self.dtype).engine

    @pytest.fixture
    def deterministic_engine(self, scorer_for) -> ScoringEngine:
        return deterministic(
            lambda: scorer_for("qwen3", "classification", deterministic=True, dtype=self.dtype)
        )

    @pytest.fixture
    def cached_engine(self, scorer_for) -> ScoringEngine:
        return scorer_for("qwen3", "classification", prefix_cache_mb=-1, dtype=self.dtype).engine


@pytest.fixture(scope="module")
def cross_encoder(tiny_encoder):
    """A tiny BERT cross-encoder's scorer, plain or in deterministic mode, loaded once per mode."""
    scorers: dict[tuple[bool, str], Scorer] = {}

    def get(deterministic_mode: bool = False, dtype: str = "float32") -> Scorer:
        key = (deterministic_mode, dtype)
        if key not in scorers:
            path = str(tiny_encoder("bert", 2))
            scorers[key] = Scorer(path, dtype=dtype, device="cpu", deterministic=deterministic_mode)
        return scorers[key]

    return get


class TestCrossEncoder(ScorerContract):
    """BERT, the encoder family's reference."""

    @pytest.fixture
    def engine(self, cross_encoder) -> ScoringEngine:
        return cross_encoder(dtype=self.dtype).engine

    @pytest.fixture
    def deterministic_engine(self, cross_encoder) -> ScoringEngine:
        return deterministic(lambda: cross_encoder(True, self.dtype))


class TestLateInteraction(ScorerContract):
    """ColBERT (its embedding cache off: `colbert_scorer`)."""

    @pytest.fixture
    def engine(self, colbert_scorer) -> ScoringEngine:
        return colbert_scorer(dtype=self.dtype).engine

    @pytest.fixture
    def deterministic_engine(self, colbert_scorer) -> ScoringEngine:
        return deterministic(lambda: colbert_scorer(deterministic=True, dtype=self.dtype))


class TestHybrid(ScorerContract):
    """Qwen3.5: Gated DeltaNet state carried along the stream (tests/engine/test_hybrid_models.py)."""

    labels = CAUSAL_LABELS

    @pytest.fixture
    def engine(self, scorer_for) -> ScoringEngine:
        _needs_family("qwen3_5")
        return scorer_for("qwen3_5", "causal", decoder_forward="transformers", dtype=self.dtype).engine

    @pytest.fixture
    def deterministic_engine(self, scorer_for) -> ScoringEngine:
        _needs_family("qwen3_5")
        return deterministic(lambda: scorer_for("qwen3_5", "causal", deterministic=True, dtype=self.dtype))

    @pytest.fixture
    def cached_engine(self, scorer_for) -> ScoringEngine:
        """Its prefix cache keeps the Gated DeltaNet layers' states too."""
        _needs_family("qwen3_5")
        return scorer_for(
            "qwen3_5", "causal", decoder_forward="transformers", prefix_cache_mb=-1, dtype=self.dtype
        ).engine


class TestVision(ScorerContract):
    """Qwen3-VL: its jobs are text, every other one with an image (the kind refuses token ids); its
    forward embeds the ids itself, so faults go in at the input embedding, keyed on a word only the
    poison job holds."""

    labels = CAUSAL_LABELS
    marker = " zqxv"

    @pytest.fixture
    def engine(self, vision_scorer) -> ScoringEngine:
        return vision_scorer(embedding_cache_mb=0, dtype=self.dtype).engine

    @pytest.fixture
    def deterministic_engine(self, vision_scorer) -> ScoringEngine:
        return deterministic(lambda: vision_scorer(deterministic=True, dtype=self.dtype))

    def job(self, job_id: str, seed: int = 0, **fields: Any) -> Job:
        image = {"content": [{"type": "image", "image": picture(seed=seed)}, {"type": "text", "text": "x"}]}
        words = ["first", "a second one", "the third item"][: 2 + seed % 2]
        shape: dict[str, Any] = {
            "query": f"query {seed}",
            "items": [*words, image] if seed % 2 else words,
        }
        return msgspec.convert({"id": job_id, **shape, **self.labels, **fields}, Job, dec_hook=dec_hook)

    def poisoned(self) -> Job:
        return self.job("poison", query=f"query{self.marker}")

    def invalid(self, engine: ScoringEngine) -> dict[str, tuple[Job, ErrorCode]]:
        too_many = 1 + self.max_items(engine)
        return {
            "other-model": (
                self.job("other-model", model="not-" + engine.served.name),
                ErrorCode.MODEL_MISMATCH,
            ),
            "too-many": (self.job("too-many", items=["x"] * too_many), ErrorCode.TOO_LONG),
        }

    @contextmanager
    def breaking(self, engine: ScoringEngine, fault: Fault) -> Iterator[list[int]]:
        marker = engine.describe().loaded.tokenizer(self.marker, add_special_tokens=False)["input_ids"]
        sizes: list[int] = []

        def hook(module, args) -> None:
            ids = args[0].flatten().tolist()
            sizes.append(len(ids))
            held = any(ids[i : i + len(marker)] == marker for i in range(len(ids)))
            fault([POISON] if held else [-1])

        handle = engine.describe().loaded.body.get_input_embeddings().register_forward_pre_hook(hook)
        try:
            yield sizes
        finally:
            handle.remove()


class Bf16:
    """The same kind in bfloat16 on the CPU."""

    dtype: ClassVar[str] = "bfloat16"
    tolerance: ClassVar[float] = BF16_TOLERANCE


class TestCausalLMBf16(Bf16, TestCausalLM):
    pass


class TestDecoderClassifierBf16(Bf16, TestDecoderClassifier):
    pass


class TestCrossEncoderBf16(Bf16, TestCrossEncoder):
    pass


class TestLateInteractionBf16(Bf16, TestLateInteraction):
    pass


class TestHybridBf16(Bf16, TestHybrid):
    pass


class TestVisionBf16(Bf16, TestVision):
    pass


@pytest.mark.parametrize("kind", ["prefix_cache", "embedding_cache"])
def test_a_real_engines_stats_name_what_the_worker_exports(kind, scorer_for, colbert_scorer) -> None:
    """`Engine.stats()` carries each cache's counters under the names /metrics reads them by
    (worker/cache_metrics.py), so a renamed field fails here, not at a scrape."""
    if kind == "prefix_cache":
        engine, series = scorer_for("qwen3", "causal", prefix_cache_mb=16).engine, PREFIX_CACHE
    else:
        engine, series = colbert_scorer(embedding_cache_mb=16).engine, EMBEDDING_CACHE
    run(engine, [Job(id="a", query=[3, 4, 5], items=[[7], [8]], label_token_ids=[5, 6])])
    part = series.part(engine.stats())
    assert part is not None
    assert {name for name, _ in (*series.counters, *series.gauges)} <= set(part)
    assert all(isinstance(value, int) for value in part.values())


class TestListwise(ScorerContract):
    """jina-reranker-v3 (`JinaForRanking`, tests/engine/test_listwise.py). Where the kind legitimately
    differs, the contract is adapted here, not weakened: its jobs are text (it refuses token ids: the
    model's prompt is tokenized whole), so faults are keyed on a word only the poison job's query holds,
    found in each prompt of the forward; a job's items are read together by design, so "the same
    result whatever its batch-mates" is about other jobs, as the contract states it, never about the
    job's own items. Deterministic mode is refused at start (skipped with its reason)."""

    marker = " zqxv"

    @pytest.fixture
    def engine(self, listwise_scorer) -> ScoringEngine:
        return listwise_scorer().engine

    @pytest.fixture
    def deterministic_engine(self, listwise_scorer) -> ScoringEngine:
        return deterministic(lambda: listwise_scorer(deterministic=True))

    def job(self, job_id: str, seed: int = 0, **fields: Any) -> Job:
        words = ["first", "a second one", "the third item", "fourth"][: 2 + seed % 3]
        return Job(id=job_id, **{"query": f"query {seed}", "items": words, **fields})

    def poisoned(self) -> Job:
        return self.job("poison", query=f"query{self.marker}")

    def invalid(self, engine: ScoringEngine) -> dict[str, tuple[Job, ErrorCode]]:
        too_many = 1 + self.max_items(engine)
        return {
            "other-model": (
                self.job("other-model", model="not-" + engine.served.name),
                ErrorCode.MODEL_MISMATCH,
            ),
            "too-many": (self.job("too-many", items=["x"] * too_many), ErrorCode.TOO_LONG),
        }

    @contextmanager
    def breaking(self, engine: ScoringEngine, fault: Fault) -> Iterator[list[int]]:
        marker = engine.describe().loaded.tokenizer(self.marker, add_special_tokens=False)["input_ids"]
        sizes: list[int] = []

        def hook(module, args, kwargs) -> None:
            rows = kwargs["input_ids"].tolist()
            sizes.append(sum(len(row) for row in rows))
            held = any(row[i : i + len(marker)] == marker for row in rows for i in range(len(row)))
            fault([POISON] if held else [-1])

        handle = engine.describe().loaded.body.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            yield sizes
        finally:
            handle.remove()

    def test_token_id_jobs_are_refused_typed(self, engine) -> None:
        """The contract's default job shape (token ids) is the one this kind refuses: `unsupported`."""
        job = Job(id="ids", query=[3, 4, 5], items=[[7], [8, 9]])
        (result,) = run(engine, [job])
        assert result.error is not None and result.error.code is ErrorCode.UNSUPPORTED


@pytest.fixture(scope="module")
def bi_encoder(bi_encoder_checkpoint):
    """The test kind of tests/engine/bi_encoder_kind.py, given to the engine by one selector line."""
    engines: dict[tuple[str, bool], ScoringEngine] = {}

    def get(dtype: str = "float32", deterministic_mode: bool = False) -> ScoringEngine:
        key = (dtype, deterministic_mode)
        if key not in engines:
            config = EngineConfig(
                model=str(bi_encoder_checkpoint), dtype=dtype, device="cpu", deterministic=deterministic_mode
            )
            engines[key] = ScoringEngine(config, kinds=(BiEncoderKind, *KINDS))
        return engines[key]

    return get


class TestBiEncoder(ScorerContract):
    """A kind added by a file and a line (tests/engine/bi_encoder_kind.py) keeps the same promises."""

    @pytest.fixture
    def engine(self, bi_encoder) -> ScoringEngine:
        return bi_encoder(self.dtype)

    @pytest.fixture
    def deterministic_engine(self, bi_encoder) -> ScoringEngine:
        try:
            return bi_encoder(self.dtype, deterministic_mode=True)
        except SettingError as exc:
            pytest.skip(f"refuses deterministic mode: {exc}")


class TestBiEncoderBf16(Bf16, TestBiEncoder):
    pass
