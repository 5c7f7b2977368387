"""`kafka-scorer demo --model DIR` with a real cross-encoder (MiniLM's BERT weights under a seeded head):
a new user's first run with a reranker goes through the embedded broker and a worker and comes back
with the stock model's scores, not the demo's RANDOM fallback."""

from __future__ import annotations

import pytest
import torch

from kafka_scorer.checkpoints.real_models import MissingCheckpoint, build_minilm_cross_encoder
from kafka_scorer.cli.demo import _ITEMS, _QUERIES
from tests.cli.helpers import cli_env, run_cli
from tests.integration.test_demo import parse_table

pytestmark = pytest.mark.integration


def test_demo_serves_a_real_cross_encoder(tmp_path) -> None:
    try:
        path = build_minilm_cross_encoder(tmp_path / "minilm-cross-encoder", num_labels=1)
    except MissingCheckpoint as exc:
        pytest.fail(str(exc))
    done = run_cli(
        "demo",
        "--model",
        str(path),
        "--short",
        "--no-progress",
        "--dtype",
        "float32",
        env=cli_env(COLUMNS="120"),
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "RANDOM" not in out and "12/12 jobs answered (1 with an error reply)" in out
    rows = parse_table(out)
    assert " ".join(rows.pop("bad-job").cells).startswith("ERROR invalid_request")
    assert all(len(row.scores) == row.items for row in rows.values()), out

    # The first job: text, no softmax, the first query against the first two items (demo.sample_jobs).
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    with torch.inference_mode():
        want = [
            model(**tokenizer(_QUERIES[0], item, return_tensors="pt")).logits[0, 0].item()
            for item in _ITEMS[:2]
        ]
    got = [row[0] for row in rows["cls-00"].scores]
    assert got == pytest.approx(want, abs=6e-4), out  # the table prints 3 decimals
