"""MaxSim scores of the late-interaction kind against sentence-transformers' own ColBERT encoder.

The reference encodes with `MultiVectorEncoder` (the library that reads PyLate checkpoints) and scores
with a plain-torch MaxSim, one (query, document) pair at a time, and with the library's own
`similarity`; the engine packs queries and documents of many jobs into one unpadded forward."""

from __future__ import annotations

import pytest
import torch

from kafka_scorer.engine.kinds.late_interaction import LateInteractionKind
from kafka_scorer.wire.protocol import Job
from tests.engine.passages import PASSAGES, QUERIES

TOLERANCE = 1e-4
VARIANTS = [
    {},
    {"attend_to_expansion_tokens": True},
    {"do_query_expansion": False, "projection_bias": True},
    {"arch": "roberta"},
    {"arch": "modernbert", "attend_to_expansion_tokens": True},
    {"arch": "modernbert"},
]


def reference_scores(encoder, query: str, documents: list[str]) -> list[float]:
    query_vectors = encoder.encode_query([query])[0]
    out = []
    for document in documents:
        doc_vectors = encoder.encode_document([document])[0]
        out.append(float((query_vectors @ doc_vectors.T).max(dim=1).values.sum()))
    return out


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize(
    "checkpoint",
    VARIANTS,
    ids=[
        "hidden-expansion",
        "attended-expansion",
        "no-expansion",
        "roberta",
        "modernbert",
        "modernbert-hidden",
    ],
)
def test_scores_equal_the_reference(colbert_scorer, reference_encoder, checkpoint, deterministic):
    scorer = colbert_scorer(checkpoint, deterministic=deterministic)
    assert isinstance(scorer.describe().kind, LateInteractionKind)
    encoder = reference_encoder(**checkpoint)
    for query in QUERIES[:2]:
        result = scorer.score(query, PASSAGES)
        assert result.error is None
        got = [row[0] for row in result.scores]
        assert got == pytest.approx(reference_scores(encoder, query, PASSAGES), abs=TOLERANCE)
        library = encoder.similarity(encoder.encode_query([query]), encoder.encode_document(PASSAGES))
        assert got == pytest.approx(library[0].tolist(), abs=TOLERANCE)


def test_long_documents_are_cut_like_the_checkpoint(colbert_scorer, reference_encoder):
    scorer = colbert_scorer()
    long = " ".join(PASSAGES)
    short = "Sacramento is the capital."
    result = scorer.score(QUERIES[0], [short, long])
    assert result.truncated_items == [1]
    expected = reference_scores(reference_encoder(), QUERIES[0], [short, long])
    assert [row[0] for row in result.scores] == pytest.approx(expected, abs=TOLERANCE)


def test_a_batch_of_jobs_scores_as_each_job_alone(colbert_scorer):
    """Jobs of different queries sharing documents, in one batch cut into several forwards by a small
    token budget, against each job scored alone."""
    batched = colbert_scorer(max_batch_tokens=96)
    alone = colbert_scorer()
    jobs = [
        Job(id=str(i), query=QUERIES[i % len(QUERIES)], items=PASSAGES[i : i + 4] + PASSAGES[8:10], top_n=3)
        for i in range(5)
    ]
    results = batched.score_jobs(jobs)
    for job, result in zip(jobs, results):
        single = alone.score_jobs([job])[0]
        assert result.id == job.id and result.error is None
        assert [r[0] for r in result.scores] == pytest.approx([r[0] for r in single.scores], abs=1e-5)
        assert [entry.index for entry in result.ranking] == [entry.index for entry in single.ranking]


def test_token_id_jobs_get_the_same_markers_as_text(colbert_scorer):
    scorer = colbert_scorer()
    tokenizer = scorer.describe().loaded.tokenizer

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    text = scorer.score(QUERIES[1], PASSAGES[:3])
    tokens = scorer.score(ids(QUERIES[1]), [ids(p) for p in PASSAGES[:3]])
    assert [r[0] for r in tokens.scores] == pytest.approx([r[0] for r in text.scores], abs=1e-6)


def test_maxsim_is_the_plain_loop():
    from kafka_scorer.engine.late_interaction.maxsim import maxsim

    generator = torch.Generator().manual_seed(3)
    query = torch.randn(5, 8, generator=generator)
    documents = [torch.randn(n, 8, generator=generator) for n in (1, 7, 3)]
    expected = [sum(max(float(q @ t) for t in doc) for q in query) for doc in documents]
    assert maxsim(query, documents).tolist() == pytest.approx(expected, abs=1e-5)


def test_a_documents_maxsim_does_not_depend_on_its_place_in_the_job():
    """One document's score, bit for bit, whatever its column and however many documents beside it
    (issue 40): torch's sum over the outer dimension of the [query, documents] maxima vectorises across
    documents and rounds the last columns otherwise (with 7 copies here: 4 scores, then 3 others)."""
    from kafka_scorer.engine.late_interaction.maxsim import maxsim

    generator = torch.Generator().manual_seed(0)

    def vectors(rows: int) -> torch.Tensor:
        return torch.nn.functional.normalize(torch.randn(rows, 128, generator=generator), dim=-1)

    query, document = vectors(32), vectors(12)
    others = [vectors(n) for n in (3, 20, 7)]
    alone = maxsim(query, [document])
    assert alone.tolist() == pytest.approx([float((query @ document.T).max(dim=1).values.sum())], abs=1e-5)
    for count in range(2, 40):
        assert torch.equal(maxsim(query, [document] * count), alone.expand(count)), count
        mixed = maxsim(query, [*others[: count % 4], document, *others[: count % 3], document])
        assert mixed[count % 4] == alone and mixed[-1] == alone, count


@pytest.fixture(scope="session")
def minilm_colbert(tmp_path_factory):
    """MiniLM's real weights under a seeded projection, in PyLate's layout (checkpoints/real_models.py)."""
    from kafka_scorer.checkpoints.real_models import MissingCheckpoint, build_minilm_colbert

    try:
        return build_minilm_colbert(tmp_path_factory.mktemp("minilm-colbert"))
    except MissingCheckpoint as exc:
        pytest.fail(f"real-weight ColBERT tests cannot run: {exc}")


def test_real_weights_score_as_the_reference(minilm_colbert):
    from sentence_transformers import MultiVectorEncoder

    from kafka_scorer.engine.scorer import Scorer

    scorer = Scorer(str(minilm_colbert), dtype="float32", device="cpu", embedding_cache_mb=0)
    encoder = MultiVectorEncoder(str(minilm_colbert), device="cpu")
    results = scorer.score_jobs([Job(query=q, items=PASSAGES) for q in QUERIES[:2]])
    for query, result in zip(QUERIES[:2], results):
        got = [row[0] for row in result.scores]
        assert got == pytest.approx(reference_scores(encoder, query, PASSAGES), abs=TOLERANCE)


def reference_order(scores: list[float]) -> list[int]:
    """Highest first, ties by the lower index (docs/message-schema.md's rule, written out here)."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


SAME = PASSAGES[0]


@pytest.mark.parametrize(
    ("budget", "documents"),
    [(None, [SAME] * 7), (128, [SAME] * 7 + PASSAGES[1:5] + [SAME, PASSAGES[5], SAME])],
    ids=["one-forward", "several-forwards"],
)
def test_equal_documents_get_bit_equal_scores_and_rank_by_index(minilm_colbert, budget, documents):
    """Copies of one text, sent in the rerank shape (issue 40: three copies came back 16.8860149,
    16.8860149, 16.8860168). In one forward their MaxSim sums used to round by their column in the job
    (seven copies of this passage: four scores, then three others); with a token budget that cuts the
    job into several forwards, copies in different forwards were also encoded beside different
    batch-mates. The reference encodes each document alone, so its copies tie exactly and its order is
    the one to match."""
    from sentence_transformers import MultiVectorEncoder

    from kafka_scorer.engine.scorer import Scorer

    options = {} if budget is None else {"max_batch_tokens": budget}
    scorer = Scorer(str(minilm_colbert), dtype="float32", device="cpu", embedding_cache_mb=0, **options)
    copies = [i for i, document in enumerate(documents) if document == SAME]
    top_n = len(documents) - 1
    (result,) = scorer.score_jobs([Job(query=QUERIES[0], documents=documents, top_n=top_n)])
    assert result.error is None
    got = [row[0] for row in result.scores]
    assert len({got[i] for i in copies}) == 1, [got[i] for i in copies]
    expected = reference_scores(MultiVectorEncoder(str(minilm_colbert), device="cpu"), QUERIES[0], documents)
    assert got == pytest.approx(expected, abs=TOLERANCE)
    ranked = [entry.index for entry in result.results]
    assert ranked == reference_order(expected)[:top_n]
    ranked_copies = [i for i in ranked if i in copies]
    assert ranked_copies == sorted(ranked_copies)
