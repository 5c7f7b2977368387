"""One late-interaction forward: queries and documents of many jobs in one unpadded encoder pass.

Built on the packing thread: every piece's query is a sequence, every document not found in the
embedding cache is a sequence (a document that recurs in the forward runs once), each attending to all
of itself (block-diagonal bidirectional attention, the cascade backend's pair groups). A query whose
expansion tokens are hidden from attention (`attend_to_expansion_tokens: false`) gets a key mask over
those tokens; they still attend to the rest and are still query vectors. Documents found in the cache
only hold their tensor.

Run on the device thread: the encoder over the stream, the projection and L2 normalisation over just
the rows that are vectors (every query token, every kept document token), new document vectors into
the cache, then MaxSim one job at a time (`maxsim.py`).

In deterministic mode (`engine/load/deterministic.py`) the attention is the mode's backend, built from the
same layout, and MaxSim runs one document at a time: a document's vectors and score then depend on
nothing but its own tokens and its query, so a cached copy equals a fresh one bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from kafka_scorer.engine.attention.dense import DenseMetadata
from kafka_scorer.engine.attention.layout import AttentionLayout, bucket_by_length, host
from kafka_scorer.engine.attention.pairs import PairGroup, PairMetadata
from kafka_scorer.engine.attention.registry import METADATA_KWARG, AttentionMetadata, prepare_attention
from kafka_scorer.engine.late_interaction.maxsim import maxsim, maxsim_each
from kafka_scorer.engine.late_interaction.preparer import LateJob
from kafka_scorer.engine.late_interaction.spec import LateModel
from kafka_scorer.engine.pack.embedding_cache import EmbeddingCache


@dataclass
class _Stream:
    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    hidden_keys: list[int] = field(default_factory=list)
    """Per sequence: how many leading tokens are keys (its length when all are)."""
    vector_rows: list[int] = field(default_factory=list)
    """Flat stream rows that become vectors, in the order their vectors are laid out."""

    def add(self, ids: list[int], positions: list[int], visible: int, rows: Iterable[int]) -> tuple[int, int]:
        """Append a sequence; returns the [start, end) of its vectors among all vectors."""
        start = len(self.ids)
        self.spans.append((start, len(ids)))
        self.hidden_keys.append(visible)
        self.ids.extend(ids)
        self.positions.extend(positions)
        first = len(self.vector_rows)
        self.vector_rows.extend(start + r for r in rows)
        return first, len(self.vector_rows)


@dataclass
class LateForward:
    group: list[tuple[int, LateJob]]
    input_ids: torch.Tensor
    positions: torch.Tensor
    attention: AttentionMetadata
    vector_rows: torch.Tensor
    queries: list[tuple[int, int]]
    """Each piece's query vectors among the forward's vectors."""
    documents: list[list[tuple[int, int] | torch.Tensor]]
    """Each piece's documents: a span of the forward's vectors, or the cached vectors themselves."""
    fills: list[tuple[bytes, int, int]]
    """Documents computed here, to be cached after the forward: key and span."""
    cached_tokens: list[int]
    """Each piece's document tokens served from the cache."""
    per_document: bool = False
    """MaxSim one document at a time (`maxsim_each`): deterministic mode's forwards."""


def build_late_forward(
    group: list[tuple[int, LateJob]],
    model: LateModel,
    cache: EmbeddingCache | None,
    deterministic_backend: str | None = None,
) -> LateForward:
    """`deterministic_backend`: deterministic mode's attention backend (None: the pair groups)."""
    encoder = model.encoder
    assert encoder is not None
    stream = _Stream()
    computed: dict[bytes, tuple[int, int]] = {}
    queries, documents, fills, cached = [], [], [], []
    for _, job in group:
        queries.append(
            stream.add(job.query, encoder.position_ids(job.query), job.query_visible, range(len(job.query)))
        )
        docs: list[tuple[int, int] | torch.Tensor] = []
        hit_tokens = 0
        for ids, key, keep in zip(job.items, job.doc_keys, job.doc_keep):
            span = computed.get(key)
            hit = cache.get(key) if cache is not None and span is None else None
            if hit is not None:
                docs.append(hit)
                hit_tokens += len(ids)
                continue
            if span is None:
                span = computed[key] = stream.add(ids, encoder.position_ids(ids), len(ids), keep)
                fills.append((key, *span))
            docs.append(span)
        documents.append(docs)
        cached.append(hit_tokens)
    pin = model.device.type == "cuda"
    return LateForward(
        group=group,
        input_ids=host(torch.tensor(stream.ids, dtype=torch.long), pin),
        positions=host(torch.tensor(stream.positions, dtype=torch.long), pin),
        attention=_metadata(stream, pin, deterministic_backend),
        vector_rows=host(torch.tensor(stream.vector_rows, dtype=torch.long), pin),
        queries=queries,
        documents=documents,
        fills=fills,
        cached_tokens=cached,
        per_document=deterministic_backend is not None,
    )


def _metadata(stream: _Stream, pin: bool, deterministic_backend: str | None) -> AttentionMetadata:
    """Pair groups by length for sequences whose every token is a key; one group per (length, keys)
    for queries whose expansion tokens are hidden, with a key mask. Deterministic mode: its backend's."""
    starts = [start for start, _ in stream.spans]
    lens = [length for _, length in stream.spans]
    # a hidden query's expansion tokens are an "item" of its sequence: the dense path (windowed
    # layers, `attention/dense.py`'s `sequence_mask`) and deterministic mode's backends then hide them
    # as keys too
    prefixes = list(stream.hidden_keys)
    items: list[tuple[int, ...]] = [(n - k,) if k < n else () for n, k in zip(lens, prefixes)]
    layout = AttentionLayout(starts, lens, prefixes, items, causal=False)
    if deterministic_backend is not None:
        return prepare_attention(layout, deterministic_backend, pin)
    plain = [(s, n) for (s, n), k in zip(stream.spans, stream.hidden_keys) if k == n]
    masked: dict[tuple[int, int], list[int]] = {}
    for (s, n), k in zip(stream.spans, stream.hidden_keys):
        if k != n:
            masked.setdefault((n, k), []).append(s)
    groups = [_group(spans, None, pin) for spans in bucket_by_length(plain)] if plain else []
    groups += [_group([(s, n) for s in seq_starts], k, pin) for (n, k), seq_starts in masked.items()]
    return PairMetadata(DenseMetadata.build(layout, pin), groups)


def _group(spans: list[tuple[int, int]], keys: int | None, pin: bool) -> PairGroup:
    longest = max(length for _, length in spans)
    offsets = torch.arange(longest)
    lengths = torch.tensor([length for _, length in spans])
    starts = torch.tensor([start for start, _ in spans])
    gather = starts[:, None] + torch.minimum(offsets[None, :], lengths[:, None] - 1)
    real = offsets[None, :] < lengths[:, None]
    key_mask = real if keys is None else real & (offsets[None, :] < keys)
    flat_real = real.reshape(-1)
    return PairGroup(
        gather=host(gather.reshape(-1), pin),
        size=len(spans),
        length=longest,
        keys=None if bool(key_mask.all()) else host(key_mask[:, None, None, :], pin),
        valid=host(flat_real.nonzero().squeeze(1), pin),
        positions=host(gather.reshape(-1)[flat_real], pin),
    )


@torch.inference_mode()
def run_late_forward(
    forward: LateForward, model: LateModel, cache: EmbeddingCache | None
) -> list[list[float]]:
    """Each piece's MaxSim scores, one per document, in the group's order."""
    device = model.device
    vectors = _vectors(forward, model) if forward.input_ids.numel() else None
    if cache is not None and vectors is not None:
        for key, start, end in forward.fills:
            cache.put(key, vectors[start:end].clone())
    scores = []
    score = maxsim_each if forward.per_document else maxsim
    for (qs, qe), docs in zip(forward.queries, forward.documents):
        assert vectors is not None
        parts = [vectors[d[0] : d[1]] if isinstance(d, tuple) else d.to(device) for d in docs]
        scores.append(score(vectors[qs:qe], parts))
    return [piece.tolist() for piece in scores]


def _vectors(forward: LateForward, model: LateModel) -> torch.Tensor:
    device = model.device
    ids = forward.input_ids.to(device, non_blocking=True)[None]
    inputs = {
        "input_ids": ids,
        "position_ids": forward.positions.to(device, non_blocking=True)[None],
        METADATA_KWARG: forward.attention.to(device),
    }
    if model.late.takes_token_types:
        inputs["token_type_ids"] = torch.zeros_like(ids)
    hidden = model.body(**inputs)[0][0]
    rows = hidden.index_select(0, forward.vector_rows.to(device, non_blocking=True))
    return torch.nn.functional.normalize(model.late.projection(rows), p=2, dim=-1)
