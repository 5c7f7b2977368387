"""Shared fixtures: tiny random checkpoints on disk, built once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

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
