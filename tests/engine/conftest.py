from __future__ import annotations

import os

import pytest

from kafka_scorer.engine.scorer import Scorer


@pytest.fixture(scope="session")
def scorer_for(tiny_models):
    """One Scorer per (arch, kind, num_labels, options), float32 on the CPU (unless `dtype` is named),
    loaded like a real checkpoint.

    The prefix cache is off unless a test names `prefix_cache_mb`: a hit is exact to rounding, not
    bitwise, and changes `prompt_tokens`, which other tests compare across calls with the same query
    (tests/engine/test_prefix_cache.py runs it on). KAFKA_SCORER_TEST_DETERMINISTIC=1 runs every decoder
    test in deterministic mode (engine/load/deterministic.py), against the same references."""
    cache: dict[tuple, Scorer] = {}
    deterministic = os.environ.get("KAFKA_SCORER_TEST_DETERMINISTIC") == "1"

    def get(arch: str = "qwen3", kind: str = "causal", num_labels: int = 2, **options) -> Scorer:
        options.setdefault("prefix_cache_mb", 0)
        if deterministic and options.get("decoder_forward") != "transformers":
            options.pop("attention_backend", None)  # the mode brings its own
            options.setdefault("deterministic", True)
        key = (arch, kind, num_labels, tuple(sorted(options.items())))
        if key not in cache:
            path = tiny_models.get(arch, kind, num_labels)
            cache[key] = Scorer(str(path), device="cpu", **{"dtype": "float32", **options})
        return cache[key]

    return get


@pytest.fixture(scope="session")
def minilm_cross_encoder(tmp_path_factory):
    """Directory of the real-weight MiniLM cross-encoder per label count (see checkpoints/real_models.py).

    A missing checkpoint package fails the test instead of skipping it: CI must not pass without the
    real-weight comparisons.
    """
    from kafka_scorer.checkpoints.real_models import MissingCheckpoint, build_minilm_cross_encoder

    cache: dict[int, object] = {}

    def get(num_labels: int = 1):
        if num_labels not in cache:
            try:
                directory = tmp_path_factory.mktemp(f"minilm-cross-encoder-{num_labels}")
                cache[num_labels] = build_minilm_cross_encoder(directory, num_labels=num_labels)
            except MissingCheckpoint as exc:
                pytest.fail(f"real-weight cross-encoder tests cannot run: {exc}")
        return cache[num_labels]

    return get


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory):
    """Tiny random encoder cross-encoders (checkpoints/tiny_models.py), one per (arch, labels, overrides)."""
    from kafka_scorer.checkpoints.tiny_models import build_tiny_encoder

    cache: dict[tuple, object] = {}

    def get(arch: str = "bert", num_labels: int = 2, **overrides):
        key = (arch, num_labels, tuple(sorted(overrides.items())))
        if key not in cache:
            directory = tmp_path_factory.mktemp(f"tiny-{arch}-{num_labels}")
            cache[key] = build_tiny_encoder(directory, arch, num_labels=num_labels, overrides=overrides)  # type: ignore[arg-type]
        return cache[key]

    return get


@pytest.fixture(scope="session")
def bi_encoder_checkpoint(tiny_encoder, tmp_path_factory):
    """A tiny BERT directory marked for the bi-encoder test kind (tests/engine/bi_encoder_kind.py)."""
    import shutil

    from tests.engine.bi_encoder_kind import MARKER

    directory = tmp_path_factory.mktemp("tiny-bi-encoder") / "model"
    shutil.copytree(tiny_encoder("bert", 2), directory)
    (directory / MARKER).write_text("{}")
    return directory


@pytest.fixture(scope="session")
def tiny_colbert(tmp_path_factory):
    """Tiny random ColBERT checkpoints in PyLate's layout (checkpoints/tiny_colbert.py), one per options."""
    from kafka_scorer.checkpoints.tiny_colbert import build_tiny_colbert

    cache: dict[tuple, object] = {}

    def get(**options):
        key = tuple(sorted(options.items()))
        if key not in cache:
            cache[key] = build_tiny_colbert(tmp_path_factory.mktemp("tiny-colbert"), **options)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def colbert_scorer(tiny_colbert):
    """One float32 CPU scorer per (checkpoint options, scorer options); the embedding cache is off unless
    a test names `embedding_cache_mb`."""
    cache: dict[tuple, Scorer] = {}

    def get(checkpoint: dict | None = None, **options) -> Scorer:
        options.setdefault("embedding_cache_mb", 0)
        key = (tuple(sorted((checkpoint or {}).items())), tuple(sorted(options.items())))
        if key not in cache:
            path = tiny_colbert(**(checkpoint or {}))
            cache[key] = Scorer(str(path), device="cpu", **{"dtype": "float32", **options})
        return cache[key]

    return get


@pytest.fixture(scope="session")
def tiny_vl(tmp_path_factory):
    """A tiny random Qwen3-VL reranker on disk (checkpoints/tiny_vision.py), built once per session."""
    from kafka_scorer.checkpoints.tiny_vision import build_tiny_vl_reranker

    return build_tiny_vl_reranker(tmp_path_factory.mktemp("tiny-vl"))


@pytest.fixture(scope="session")
def vision_scorer(tiny_vl):
    """One float32 CPU scorer per options, opened the way the worker opens any checkpoint."""
    from kafka_scorer.engine.scorer import Scorer

    cache: dict[tuple, object] = {}

    def get(**options):
        key = tuple(sorted(options.items()))
        if key not in cache:
            cache[key] = Scorer(str(tiny_vl), device="cpu", **{"dtype": "float32", **options})
        return cache[key]

    return get


@pytest.fixture(scope="session")
def tiny_listwise(tmp_path_factory):
    """A tiny random jina-reranker-v3 on disk (checkpoints/tiny_listwise.py), built once per session."""
    from kafka_scorer.checkpoints.tiny_listwise import build_tiny_listwise

    return build_tiny_listwise(tmp_path_factory.mktemp("tiny-listwise"))


@pytest.fixture(scope="session")
def listwise_scorer(tiny_listwise):
    """One float32 CPU scorer per options, opened the way the worker opens any checkpoint."""
    cache: dict[tuple, Scorer] = {}

    def get(**options):
        key = tuple(sorted(options.items()))
        if key not in cache:
            cache[key] = Scorer(str(tiny_listwise), device="cpu", **{"dtype": "float32", **options})
        return cache[key]

    return get
