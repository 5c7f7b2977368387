"""Gemma 2 logit soft-capping and alternating sliding-window layers, scored like plain transformers.

The caps are set far below Gemma 2's defaults (50 / 30): with random weights the defaults are never
reached, so a test at the defaults would pass with the caps ignored. `test_each_cap_changes_the_reference`
shows that every cap (and the per-layer window) moves the reference by much more than the tolerance,
so the comparisons below would fail if the engine dropped one.
"""

from __future__ import annotations

import json
import math
import shutil
from functools import cache
from pathlib import Path

import pytest
import torch

from kafka_scorer.engine.attention.registry import (
    BACKENDS,
    METADATA_KWARG,
    prepare_attention,
    scorer_attention,
)
from tests.engine.reference import reference_scores
from tests.engine.test_attention import layout_of, naive_attention, run_backend

ATTN_CAP, FINAL_CAP = 5.0, 3.0
WINDOW = 40  # above the packed MIS jobs below, below LONG_QUERY + an item
QUERY = "Rank the passages by relevance"
ITEMS = ["mountains", "", "rivers and oceans"]
LONG_QUERY = "The quick brown fox jumps over the lazy dog 0123456789. Kafka topics, partitions, offsets"
LONG_ITEMS = ["consumers", "producers, brokers and transactions"]
LABELS = [3, 44, 120]
TOLERANCE = 1e-4

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def max_diff(a, b, log: bool = False) -> float:
    """Largest difference; `log` compares log-probabilities (full-vocabulary probabilities are ~1e-3
    here, where an absolute tolerance would hide a 10% error)."""
    f = math.log if log else float
    return max(abs(f(x) - f(y)) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


class Gemma2Models:
    """Capped tiny Gemma 2 checkpoints, plus same-weight variants with one config field changed."""

    def __init__(self, root: Path) -> None:
        from kafka_scorer.checkpoints.tiny_models import build_tiny_model

        config = {
            "attn_logit_softcapping": ATTN_CAP,
            "final_logit_softcapping": FINAL_CAP,
            "sliding_window": WINDOW,
            # 1/sqrt(head_dim), as in Gemma 2 2B/9B; the default 256 would shrink the tiny model's
            # attention scores to where no cap bends them.
            "query_pre_attn_scalar": 16,
        }
        self.root = root
        self.capped = {
            kind: build_tiny_model(root / kind, "gemma2", kind, overrides=config)
            for kind in ("causal", "classification")
        }

    def variant(self, kind: str, name: str, **fields) -> Path:
        """The capped checkpoint with some config fields replaced (same weights)."""
        path = self.root / f"{kind}-{name}"
        if not path.exists():
            shutil.copytree(self.capped[kind], path)
            config = json.loads((path / "config.json").read_text())
            config.update(fields)
            (path / "config.json").write_text(json.dumps(config))
        return path


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory: pytest.TempPathFactory) -> Gemma2Models:
    return Gemma2Models(tmp_path_factory.mktemp("gemma2"))


@cache
def _reference(path: Path, query: str, items: tuple[str, ...], labels, apply_softmax: bool):
    return reference_scores(path, query, list(items), list(labels) if labels else None, apply_softmax)


def reference(path: Path, query: str, items: list[str], labels, apply_softmax: bool):
    return _reference(path, query, tuple(items), tuple(labels) if labels else None, apply_softmax)


@pytest.fixture(scope="module")
def scorer_for(gemma2: Gemma2Models):
    from kafka_scorer.engine.scorer import Scorer

    cache: dict[tuple[str, str], Scorer] = {}

    def get(kind: str, backend: str) -> Scorer:
        if (kind, backend) not in cache:
            path = str(gemma2.capped[kind])
            cache[kind, backend] = Scorer(path, dtype="float32", device="cpu", attention_backend=backend)
        return cache[kind, backend]

    return get


# ---------------------------------------------------------------- the reference really depends on it


@pytest.mark.parametrize("apply_softmax", [False, True])
def test_each_cap_changes_the_reference(gemma2: Gemma2Models, apply_softmax: bool) -> None:
    causal = reference(gemma2.capped["causal"], QUERY, ITEMS, LABELS, apply_softmax)
    for field in ("attn_logit_softcapping", "final_logit_softcapping"):
        variant = gemma2.variant("causal", f"no-{field}", **{field: None})
        uncapped = reference(variant, QUERY, ITEMS, LABELS, apply_softmax)
        assert max_diff(causal, uncapped, log=not apply_softmax) > 100 * TOLERANCE, field
    classification = reference(gemma2.capped["classification"], QUERY, ITEMS, None, apply_softmax)
    variant = gemma2.variant("classification", "no-attn-cap", attn_logit_softcapping=None)
    uncapped = reference(variant, QUERY, ITEMS, None, apply_softmax)
    assert max_diff(classification, uncapped) > 100 * TOLERANCE


def test_full_layers_between_windowed_ones_change_the_reference(gemma2: Gemma2Models) -> None:
    """Gemma 2 alternates windowed and full layers; for a pair longer than the window each matters."""
    want = reference(gemma2.capped["causal"], LONG_QUERY, LONG_ITEMS, LABELS, False)
    all_windowed = gemma2.variant("causal", "all-windowed", layer_types=["sliding_attention"] * 2)
    no_window = gemma2.variant("causal", "no-window", sliding_window=4096)
    for other in (all_windowed, no_window):
        changed = reference(other, LONG_QUERY, LONG_ITEMS, LABELS, False)
        assert max_diff(want, changed, log=True) > 100 * TOLERANCE


# ---------------------------------------------------------------- the engine against the reference


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("apply_softmax", [False, True])
def test_causal_scores_match_transformers(gemma2, scorer_for, backend: str, apply_softmax: bool) -> None:
    scorer = scorer_for("causal", backend)
    assert scorer.describe().loaded.final_logit_softcap == FINAL_CAP
    want = reference(gemma2.capped["causal"], QUERY, ITEMS, LABELS, apply_softmax)
    packed = scorer.score(QUERY, ITEMS, label_token_ids=LABELS, apply_softmax=apply_softmax, multi_item=True)
    single = scorer.score(QUERY, ITEMS, label_token_ids=LABELS, apply_softmax=apply_softmax, multi_item=False)
    assert packed.error is None and single.error is None
    assert packed.prompt_tokens < single.prompt_tokens  # MIS really packed the items behind one query
    assert max_diff(packed.scores, want, log=not apply_softmax) <= TOLERANCE
    assert max_diff(single.scores, want, log=not apply_softmax) <= TOLERANCE


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("apply_softmax", [False, True])
def test_classification_scores_match_transformers(
    gemma2, scorer_for, backend: str, apply_softmax: bool
) -> None:
    scorer = scorer_for("classification", backend)
    # transformers' Gemma2ForSequenceClassification does not cap its score head, so neither do we.
    assert scorer.describe().loaded.final_logit_softcap is None
    want = reference(gemma2.capped["classification"], QUERY, ITEMS, None, apply_softmax)
    packed = scorer.score(QUERY, ITEMS, apply_softmax=apply_softmax, multi_item=True)
    single = scorer.score(QUERY, ITEMS, apply_softmax=apply_softmax, multi_item=False)
    assert packed.error is None and single.error is None
    assert packed.prompt_tokens < single.prompt_tokens
    assert max_diff(packed.scores, want) <= TOLERANCE
    assert max_diff(single.scores, want) <= TOLERANCE


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_pairs_longer_than_the_window_see_windowed_and_full_layers(gemma2, scorer_for, backend: str) -> None:
    scorer = scorer_for("causal", backend)
    want = reference(gemma2.capped["causal"], LONG_QUERY, LONG_ITEMS, LABELS, False)
    got = scorer.score(LONG_QUERY, LONG_ITEMS, label_token_ids=LABELS)
    assert got.error is None
    assert got.prompt_tokens > 2 * WINDOW  # both pairs run past the window, in one batch
    assert max_diff(got.scores, want, log=True) <= TOLERANCE
    refused = scorer.score(LONG_QUERY, LONG_ITEMS, label_token_ids=LABELS, multi_item=True)
    assert refused.error is not None and "sliding window" in refused.error.message


# ---------------------------------------------------------------- the backends on their own


SEQS = [(3, ()), (6, (2, 2, 5)), (1, ()), (9, ()), (2, (1,)), (0, (4, 0, 1))]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2)])
@pytest.mark.parametrize("window", [None, 4])
def test_backend_soft_caps_like_naive_attention(backend, heads, kv_heads, window) -> None:
    # A window only applies to plain pairs (packed sequences never exceed one), as in the engine.
    seqs = SEQS if window is None else [(p, ()) for p, items in SEQS if not items]
    layout = layout_of(seqs)
    torch.manual_seed(0)
    total, dim, scale, cap = layout.total_tokens, 8, 0.3, 1.5
    q = torch.randn(heads, total, dim) * 3  # scores of several units: well into the cap's bend
    k, v = torch.randn(kv_heads, total, dim), torch.randn(kv_heads, total, dim)
    got = run_backend(backend, q, k, v, layout, scale, cap, window)
    want = naive_attention(q, k, v, seqs, scale, cap, window)
    uncapped = naive_attention(q, k, v, seqs, scale, None, window)
    assert (want - uncapped).abs().max() > 0.1
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)


def test_each_layer_call_brings_its_own_cap_and_window() -> None:
    """One layout serves every layer; a full layer's `sliding_window=None` overrides the model's window."""
    torch.manual_seed(1)
    seqs = [(12, ())]
    metadata = {METADATA_KWARG: prepare_attention(layout_of(seqs, sliding_window=4), "dense")}
    q, k, v = torch.randn(1, 4, 12, 8) * 3, torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 8)
    module = torch.nn.Module()
    for softcap, window in [(2.0, None), (None, 4), (2.0, 4)]:
        out, _ = scorer_attention(
            module, q, k, v, None, scaling=0.3, softcap=softcap, sliding_window=window, **metadata
        )
        want = naive_attention(q[0], k[0], v[0], seqs, 0.3, softcap, window)
        torch.testing.assert_close(out[0].transpose(0, 1).double(), want, rtol=0, atol=1e-5)
    # A layer that does not name a window (Llama-style code) gets the model's.
    out, _ = scorer_attention(module, q, k, v, None, scaling=0.3, **metadata)
    want = naive_attention(q[0], k[0], v[0], seqs, 0.3, None, 4)
    torch.testing.assert_close(out[0].transpose(0, 1).double(), want, rtol=0, atol=1e-5)
    with pytest.raises(NotImplementedError, match="s_aux"):
        scorer_attention(module, q, k, v, None, s_aux=torch.zeros(4), **metadata)
