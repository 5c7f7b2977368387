"""Deterministic mode (engine/load/deterministic.py): a job's scores bit-identical whatever else ran.

Two kinds of check: the 48 situations of tests/engine/determinism.py (batch-mates, position in the
stream, a shared sequence, a small budget cutting the job, a scorer whose cache setting is on and has
seen every head) each give a job exactly its scores alone; and the mode's scores equal the independent
references (plain transformers, one pair at a time) the other engine tests use. The whole engine suite
also runs in the mode with KAFKA_SCORER_TEST_DETERMINISTIC=1 (tests/engine/conftest.py).
"""

from __future__ import annotations

import random

import pytest
import torch

from kafka_scorer.engine.attention.dense import DenseMetadata, dense_attention
from kafka_scorer.engine.attention.layout import AttentionLayout
from kafka_scorer.engine.attention.segmented import SegmentedMetadata, segmented_attention
from kafka_scorer.engine.attention.tiled import TiledMetadata, _attend_tiles, _tile_chunks, tiled_attention
from kafka_scorer.engine.layers.invariant import ROWS, fixed_linear
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.errors import SettingError
from kafka_scorer.wire.protocol import Job
from tests.engine.determinism import count_identical
from tests.engine.reference import reference_scores
from tests.engine.test_causal_scores import ITEMS, LABELS, QUERY, assert_close


@pytest.mark.parametrize("kind", ["causal", "classification"])
def test_48_of_48_scores_bit_identical_across_batches_positions_and_cache(tiny_models, kind):
    path = str(tiny_models.get("qwen3", kind))

    def make(**options) -> Scorer:
        return Scorer(path, dtype="float32", device="cpu", deterministic=True, prefix_cache_mb=64, **options)

    same, total, differed, cached = count_identical(make, causal=kind == "causal")
    assert (same, total) == (48, 48), differed
    assert cached >= 6  # the warm scorer's situations were served from the prefix cache


def test_48_of_48_for_a_templated_reranker_whose_head_every_job_hits(tmp_path):
    """The prefix cache's everyday case: a Qwen3-Reranker template, whose head every job shares, cut at
    its head and at its query. The default engine gives 8 of 48 bit-identical here (47 served from the
    cache); the mode 48 of 48, the cache still serving them."""
    from kafka_scorer.checkpoints.tiny_models import build_tiny_reranker

    path = str(build_tiny_reranker(tmp_path / "reranker"))

    def make(**options) -> Scorer:
        return Scorer(
            path,
            dtype="float32",
            device="cpu",
            template="qwen3-reranker",
            deterministic=True,
            prefix_cache_mb=64,
            **options,
        )

    same, total, differed, cached = count_identical(make, causal=True, templated=True)
    assert (same, total) == (48, 48), differed
    assert cached >= 40


def test_48_of_48_for_an_encoder_cross_encoder(tiny_encoder):
    """BERT, whose pooler is a matmul of one row per pair: 17 of 48 before the mode served encoders
    (RoBERTa 15, measured the same way; its padding position is checked against the stock model in
    test_encoder_families.py). ModernBERT (mean pooling, local windows) and ColBERT (its embedding cache
    on) are the GPU tier's, whose `cpu` variants run in CI (tests/cuda_tests/test_deterministic_cuda.py)."""
    path = str(tiny_encoder("bert", 2))

    def make(**options) -> Scorer:
        return Scorer(path, dtype="float32", device="cpu", deterministic=True, **options)

    same, total, differed, _ = count_identical(make, causal=False)
    assert (same, total) == (48, 48), differed


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama", "gemma2"])
@pytest.mark.parametrize("apply_softmax", [False, True])
@pytest.mark.parametrize("multi_item", [False, True])
def test_causal_scores_equal_the_reference(scorer_for, tiny_models, arch, apply_softmax, multi_item):
    scorer = scorer_for(arch, deterministic=True)
    result = scorer.score(
        QUERY, ITEMS, label_token_ids=LABELS, apply_softmax=apply_softmax, multi_item=multi_item
    )
    assert result.error is None
    assert_close(result.scores, reference_scores(tiny_models.get(arch), QUERY, ITEMS, LABELS, apply_softmax))


@pytest.mark.parametrize(("arch", "num_labels"), [("qwen3", 2), ("llama", 12)])
@pytest.mark.parametrize("multi_item", [False, True])
def test_classification_scores_equal_the_reference(scorer_for, tiny_models, arch, num_labels, multi_item):
    scorer = scorer_for(arch, "classification", num_labels, deterministic=True)
    result = scorer.score(QUERY, ITEMS, apply_softmax=True, multi_item=multi_item)
    want = reference_scores(
        tiny_models.get(arch, "classification", num_labels), QUERY, ITEMS, apply_softmax=True
    )
    assert max(abs(g - w) for gr, wr in zip(result.scores, want) for g, w in zip(gr, wr)) <= 1e-5


def test_batched_jobs_equal_the_reference_and_hits_equal_misses_bit_for_bit(scorer_for, tiny_models):
    """On the CPU the mode keeps the prefix cache: the third round is served from it (each query seen
    twice is admitted, then hit) and gives the first round's scores bit for bit."""
    scorer = scorer_for(deterministic=True, prefix_cache_mb=64)
    assert scorer.describe().fields["deterministic"] == "true"
    assert scorer.describe().fields["prefix_cache_mb"] == "64"
    queries = [QUERY, QUERY + " Answer briefly.", "Which city is the capital?"]
    jobs = [Job(id=str(n), query=q, items=ITEMS[n:], label_token_ids=LABELS) for n, q in enumerate(queries)]
    rounds = [scorer.score_jobs(jobs) for _ in range(3)]
    assert all(result.cached_tokens == 0 for result in rounds[0])
    assert all(result.cached_tokens > 0 for result in rounds[2])
    for job, first, hit in zip(jobs, rounds[0], rounds[2]):
        assert hit.scores == first.scores
        assert_close(first.scores, reference_scores(tiny_models.get(), job.query, job.items, LABELS))


def _random_layout(rng: random.Random, mates: int) -> AttentionLayout:
    """A stream of `mates` random sequences (MIS or plain pairs) followed by one fixed MIS sequence."""
    shapes = []
    for _ in range(mates):
        if rng.random() < 0.5:
            shapes.append((rng.randint(1, 70), ()))
        else:
            shapes.append((rng.randint(1, 50), tuple(rng.randint(0, 40) for _ in range(rng.randint(1, 4)))))
    shapes.append((45, (7, 0, 33, 70)))
    starts, lens, total = [], [], 0
    for prefix, items in shapes:
        starts.append(total)
        lens.append(prefix + sum(items))
        total += lens[-1]
    return AttentionLayout(starts, lens, [p for p, _ in shapes], [i for _, i in shapes])


@pytest.mark.parametrize("backend", ["tiled", "segmented"])
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_attention_equals_dense_and_does_not_depend_on_the_sequence_s_place(softcap, backend):
    """Both of the mode's backends (the tiles on CUDA, a call per segment on the CPU)."""
    rng = random.Random(1)
    torch.manual_seed(0)
    tail = 45 + 7 + 33 + 70
    q_tail, k_tail, v_tail = (torch.randn(h, tail, 16) for h in (4, 2, 2))
    outs = []
    for mates in (0, 1, 3, 6):
        layout = _random_layout(rng, mates)
        front = layout.seq_starts[-1]
        q, k, v = (torch.cat([torch.randn(x.shape[0], front, 16), x], 1) for x in (q_tail, k_tail, v_tail))
        got = _attend(backend, q, k, v, layout, softcap)
        want = dense_attention(q, k, v, DenseMetadata.build(layout, False), 0.25, softcap)
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        outs.append(got[:, front:])
    assert all(torch.equal(out, outs[0]) for out in outs[1:])


def _attend(backend: str, q, k, v, layout: AttentionLayout, softcap=None, window=None) -> torch.Tensor:
    if backend == "tiled":
        return tiled_attention(q, k, v, TiledMetadata.build(layout, False), 0.25, softcap, window)
    return segmented_attention(q, k, v, SegmentedMetadata.build(layout), 0.25, softcap, window)


def test_tiled_attention_by_fixed_tile_chunks_as_on_cuda_gives_the_same_bits():
    """CUDA runs the tiles by padded chunks of a fixed count; on the CPU both ways agree bit for bit."""
    torch.manual_seed(0)
    layout = _random_layout(random.Random(2), 12)
    tokens = layout.total_tokens
    q, k, v = (torch.randn(h, tokens, 16) for h in (4, 2, 2))
    metadata = TiledMetadata.build(layout, False)
    whole, chunked = (
        torch.cat(
            [
                _attend_tiles(q, k, v, chunk, 0.25, None, None, True)
                for chunk in _tile_chunks(metadata, fixed)
            ],
            2,
        )
        for fixed in (False, True)
    )
    assert chunked.shape[2] > whole.shape[2]  # padded to whole chunks
    valid = metadata.real.reshape(-1)  # padded rows (they see no key) are dropped
    assert torch.equal(chunked[:, :, : whole.shape[2]][:, :, valid], whole[:, :, valid])


@pytest.mark.parametrize("backend", ["tiled", "segmented"])
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_attention_windows_plain_pairs_as_dense_does(backend, softcap):
    torch.manual_seed(0)
    layout = AttentionLayout([0, 50], [50, 90], [50, 90], [(), ()])
    q, k, v = (torch.randn(h, 140, 16) for h in (4, 4, 4))
    got = _attend(backend, q, k, v, layout, softcap, 20)
    want = dense_attention(q, k, v, DenseMetadata.build(layout, False), 0.25, softcap, 20)
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("outputs", [96, 2, 1])  # 1: a one-label classifier took another CPU kernel
@pytest.mark.parametrize("with_bias", [False, True])
def test_fixed_linear_rows_do_not_depend_on_their_neighbours(outputs, with_bias):
    torch.manual_seed(0)
    weight, row = torch.randn(outputs, 80), torch.randn(80)
    bias = torch.randn(outputs) if with_bias else None
    outs = []
    for tokens, place in [(ROWS, 0), (ROWS, ROWS - 1), (4 * ROWS, 300), (2 * ROWS, 17), (3 * ROWS, 5)]:
        x = torch.randn(tokens, 80)
        x[place] = row
        out = fixed_linear(x, weight, bias)
        assert torch.allclose(out, torch.nn.functional.linear(x, weight, bias), atol=1e-5)
        outs.append(out[place])
    assert all(torch.equal(out, outs[0]) for out in outs[1:])


def test_the_setting_reaches_the_engine(tiny_models, monkeypatch):
    from kafka_scorer.config import EngineSettings

    monkeypatch.setenv("KAFKA_SCORER_DETERMINISTIC", "true")
    config = EngineSettings(model=str(tiny_models.get()), dtype="float32", device="cpu").engine_config()
    scorer = Scorer.from_config(config)
    assert (
        scorer.describe().kind.served.config.deterministic
        and scorer.describe().attention_backend == "segmented"
    )  # the CPU's


def test_the_mode_s_attention_on_each_device(monkeypatch):
    """The CPU's segment calls; on CUDA the span kernel over aligned spans for decoders where triton runs,
    the tiles for encoders and where it does not (triton is not imported here: the CLI tests watch
    for it in this process)."""
    from kafka_scorer.engine.load import deterministic

    cuda = torch.device("cuda")
    assert deterministic.mode_backend(torch.device("cpu")) == "segmented"
    monkeypatch.setattr(deterministic, "triton_runs_on", lambda device: device.type == "cuda")
    assert deterministic.mode_backend(cuda) == "deterministic-spans"
    assert deterministic.mode_backend(cuda, encoder=True) == "deterministic"
    monkeypatch.setattr(deterministic, "triton_runs_on", lambda device: False)
    assert deterministic.mode_backend(cuda) == "deterministic"


def test_what_the_mode_cannot_serve_is_refused_naming_the_setting(tiny_models):
    with pytest.raises(SettingError, match="attention-backend") as raised:
        Scorer(
            str(tiny_models.get()),
            dtype="float32",
            device="cpu",
            deterministic=True,
            attention_backend="flex",
        )
    assert raised.value.setting == "deterministic"
    with pytest.raises(SettingError, match="KAFKA_SCORER_DETERMINISTIC"):
        Scorer(
            str(tiny_models.get()),
            dtype="float32",
            device="cpu",
            deterministic=True,
            decoder_forward="transformers",
        )


@pytest.mark.parametrize("backend", ["tiled", "segmented"])
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (9, None), (None, 30.0), (100, None)])
def test_attention_hides_bidirectional_hidden_keys_as_dense_does(window, softcap, backend):
    """A ColBERT query whose expansion tokens are no keys (an "item" of a bidirectional sequence): they
    see the query's other tokens only, and nobody sees them; beside plain encoder pairs. Windows count
    positions in the sequence (ModernBERT's local layers); a hidden token a window keeps from every key
    gets zeros, as in the dense path."""
    torch.manual_seed(0)
    layout = AttentionLayout([0, 30, 50], [30, 20, 40], [30, 12, 25], [(), (8,), (15,)], causal=False)
    q, k, v = (torch.randn(h, 90, 16) for h in (4, 2, 2))
    got = _attend(backend, q, k, v, layout, softcap, window)
    want = dense_attention(q, k, v, DenseMetadata.build(layout, False), 0.25, softcap, window)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


@pytest.mark.parametrize("window", [None, 30])
def test_segmented_cuts_keep_a_head_s_rows_independent_of_what_follows_it(window):
    """What the prefix cache relies on in the mode: a query cut at its marks computes its head's rows
    exactly as the head alone does (bit for bit), whatever follows; and still equals the dense path.
    The window bites the plain pair only (a packed sequence is never longer than one)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(h, 160, 16) for h in (4, 2, 2))
    packed = AttentionLayout([0], [100], [70], [(10, 20)], cuts=[(25, 40)])
    pair = AttentionLayout([0, 100], [100, 60], [100, 60], [(), ()], cuts=[(25, 40), (40,)])
    head = AttentionLayout([0], [40], [40], [()], cuts=[(25,)])
    alone = _attend("segmented", *(x[:, :40] for x in (q, k, v)), head)
    for layout, win in ((packed, None), (pair, window)):
        qs, ks, vs = (x[:, : layout.total_tokens] for x in (q, k, v))
        got = _attend("segmented", qs, ks, vs, layout, None, win)
        want = dense_attention(qs, ks, vs, DenseMetadata.build(layout, False), 0.25, None, win)
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        if win is None:
            assert torch.equal(got[:, :40], alone)


def test_segmented_attention_off_the_cpu_s_flash_kernel_equals_dense():
    """Where the CPU's flash kernel cannot run (CUDA, when the backend is named there), every call is an
    explicit masked SDPA call: the same attention (checked here on the CPU by asking for that path)."""
    from kafka_scorer.engine.attention.segmented import attend_calls

    torch.manual_seed(0)
    layout = _random_layout(random.Random(3), 5)
    layout = AttentionLayout(
        layout.seq_starts, layout.seq_lens, layout.prefix_lens, layout.item_lens, cuts=[(3,)] * 6
    )
    q, k, v = (torch.randn(h, layout.total_tokens, 16) for h in (4, 2, 2))
    calls = SegmentedMetadata.build(layout).calls
    got = attend_calls(q, k, v, calls, True, 0.25, fused=False)
    want = dense_attention(q, k, v, DenseMetadata.build(layout, False), 0.25)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
