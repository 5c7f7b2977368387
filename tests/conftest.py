"""Shared fixtures: tiny random checkpoints on disk, built once per test session; Apache Kafka's jars."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# asyncio tests time out with pytest-timeout's thread method: a SIGALRM can be swallowed by the event loop
pytest_plugins = ["tests.async_timeouts"]

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# `pytest --hypothesis-profile=long ...`: property tests that keep CI short run thousands of examples.
settings.register_profile("long", max_examples=5000, deadline=None)


class TinyModels:
    """Builds each (arch, kind, num_labels) checkpoint once and hands out its directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._paths: dict[tuple[str, str, int], Path] = {}

    def get(self, arch: str = "qwen3", kind: str = "causal", num_labels: int = 2) -> Path:
        from kafka_scorer.checkpoints.tiny_models import build_tiny_model

        key = (arch, kind, num_labels if kind == "classification" else 0)
        if key not in self._paths:
            name = f"{arch}-{kind}-{key[2]}"
            self._paths[key] = build_tiny_model(self.root / name, arch, kind, num_labels=num_labels)  # type: ignore[arg-type]
        return self._paths[key]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("tiny-models"))


REQUIRE_APACHE_KAFKA = "KAFKA_SCORER_REQUIRE_APACHE_KAFKA"


@pytest.fixture(scope="session")
def apache_kafka_distribution():
    """Apache Kafka's jars (devtools/kafka_distribution.py), resolved once per machine; the tests marked
    `apache_kafka` skip, saying what is missing, where Java or Maven is not installed, and fail instead
    where `KAFKA_SCORER_REQUIRE_APACHE_KAFKA=1` (CI sets it: there a skip would hide a lost tier)."""
    from devtools.kafka_distribution import ApacheKafkaUnavailable, KafkaDistribution, java_command

    try:
        java_command()
        return KafkaDistribution.default().resolve()
    except ApacheKafkaUnavailable as exc:
        if os.environ.get(REQUIRE_APACHE_KAFKA) == "1":
            pytest.fail(f"{REQUIRE_APACHE_KAFKA}=1 but Apache Kafka is unavailable: {exc}", pytrace=False)
        pytest.skip(f"Apache Kafka is unavailable ({exc}); {REQUIRE_APACHE_KAFKA}=1 makes this a failure")
