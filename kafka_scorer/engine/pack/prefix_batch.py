"""A forward's jobs against the prefix cache: the heads to compute first, and the forward that hits them.

A cached head is computed **alone, before the forward that uses it**, and every piece with a
cacheable head then runs as a hit, whether the head was in the cache or was computed just now. So a
job's first call and its repeats run the same shapes (the same hit forward, against the same stored
states) and give bit-identical scores in the default engine: a miss that computed its head inside the
full sequence and a hit that ran the rest against cached keys used matmuls of other row counts, and
differed in their last bits (docs/engine.md, "Prefix cache"). The price is one more forward per batch
with a new head (measured in docs/performance.md, "Prefix cache").

On the packing thread, for each forward of a batch (`build_all`):
1. Each piece with prefix marks (`engine/prepare/prefix_marks.py`) keeps the marks whose states fit in the
   cache (a head larger than the cache can never hit: that piece runs in full, as without the cache). It
   looks them up, longest first, among the heads this batch already plans and in the cache.
2. Every fitting mark longer than the one found is computed, shortest first, each from the one before
   it: the shortest from nothing (a *fill*: the head's tokens as a sequence of their own, its keys and
   values copied per layer), a longer one as an *extension* (its own tokens as a hit on the shorter
   head: that head's states, then its own). So a head is always cut at the same marks, whatever the
   cache held: a template's head, then the whole query. Stage `d` holds what extends stage `d - 1`'s
   heads; heads shared by several jobs of the batch are computed once. A head seen for the first time
   is computed the same way and kept only where the cache has room (`PrefixEntry.admitted`): on its
   second sighting it may evict others; either way a call that hits it gives the first one's scores.
3. The stages run first, one forward each (no scoring rows read), then the forward of the pieces: the
   pieces without a cacheable head in full (the front, through the configured backend) and the others
   cut after their longest head (the hits, `engine/attention/cached.py`), positions moved up by it.
The pieces' forward returns its group in that order; pieces of one job stay in item order, so the
device thread's row bookkeeping is unchanged. Entries join the cache after the forward that filled
them succeeded (`commit`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kafka_scorer.engine.attention.cached import HitSequence, PrefixedMetadata
from kafka_scorer.engine.attention.layout import AttentionLayout, host
from kafka_scorer.engine.attention.registry import prepare_attention
from kafka_scorer.engine.models.loaded import LoadedModel
from kafka_scorer.engine.pack.batch import ForwardBatch, build_forward_batch
from kafka_scorer.engine.pack.prefix_cache import (
    PrefixCache,
    PrefixEntry,
    PrefixKey,
    bytes_per_token,
    capacity_bytes,
)
from kafka_scorer.engine.prepare.inputs import PreparedJob

Group = list[tuple[int, PreparedJob]]
Forward = tuple[Group, ForwardBatch]


@dataclass
class CachedPiece(PreparedJob):
    """A piece whose first `cached` leading tokens (of the query, or of every pair) come from a prefix."""

    cached: int = 0
    source: int = 0
    """Index of the prefix in the forward's `PrefixedMetadata.entries`."""
    computed: int = 0
    """Of those tokens, the ones computed in this batch (its head, run alone first, for this job or a
    batch-mate): run through the model, not served from the cache, so not `cached_tokens`. A head a
    batch-mate's arrival computed (or stored) is no more a hit for this job than for the batch-mate."""

    @property
    def query_key(self) -> tuple[int, ...]:
        """Cut queries only share a sequence when their prefixes are the same too."""
        return (-1 - self.source, *self.query)


def cached_tokens(piece: PreparedJob) -> int:
    """A piece's prompt tokens served from a prefix: every pair's cached head counts; a packed piece's
    query once. A job cut into packed pieces counts the largest of its pieces' (`PieceScores`
    in `engine/kinds/kind.py`), as its `num_tokens` counts its query once however many pieces repeat
    it; so `prompt_tokens + cached_tokens` is what the job reports without the cache."""
    if not isinstance(piece, CachedPiece):
        return 0
    if piece.packed:
        return max(0, piece.cached - piece.computed)
    return piece.cached * len(piece.items) - piece.computed


@dataclass
class _Stage:
    """One forward's plan: pieces run in full (`front`), then pieces cut after a prefix (`hits`)."""

    front: Group = field(default_factory=list)
    hits: Group = field(default_factory=list)
    entries: list[PrefixEntry] = field(default_factory=list)
    fillers: list[tuple[int, int]] = field(default_factory=list)
    """(entry index, position in `front` of the head sequence that fills it)."""
    extends: list[tuple[int, int, int]] = field(default_factory=list)
    """(entry index, index of the shorter entry it extends, position in `hits` of the head sequence
    whose tokens complete it)."""
    _index: dict[int, int] = field(default_factory=dict)

    def source(self, entry: PrefixEntry) -> int:
        """The forward's index of `entry` (added on first use)."""
        if id(entry) not in self._index:
            self._index[id(entry)] = len(self.entries)
            self.entries.append(entry)
        return self._index[id(entry)]


@dataclass
class _Head:
    """A prefix this batch attends to: from the cache (`stage` -1) or computed by stage `stage`."""

    entry: PrefixEntry
    stage: int
    base: int
    """Its leading tokens served from entries the cache held before this batch; the rest are computed
    in this batch, and count as run (`prompt_tokens`) for every job that uses them."""
    owner: int | None = None
    """The job it is computed for (None: from the cache)."""
    claimed: set[int] = field(default_factory=set)
    """The jobs whose pieces have counted its computed tokens (each job counts them once: a job's other
    pairs on the same head are served it, as they would be by the cache)."""


@dataclass(frozen=True)
class EntryShape:
    """What an entry of the served model holds (`PrefixEntry`)."""

    num_layers: int
    stateless: frozenset[int] = frozenset()
    """Layers without keys and values (a hybrid's Gated DeltaNet layers)."""
    recurrent: int = 0
    """Gated DeltaNet layers, whose state and window an entry keeps."""
    state_bytes: int = 0
    """Their size, whatever the prefix's length."""

    def entry(self, key: PrefixKey, admitted: bool) -> PrefixEntry:
        return PrefixEntry(
            key, self.num_layers, admitted=admitted, stateless=self.stateless, recurrent=self.recurrent
        )


class PrefixPlanner:
    def __init__(
        self, cache: PrefixCache, namespace: tuple[str, ...], shape: EntryShape, per_token: int
    ) -> None:
        self.cache = cache
        self.namespace = namespace
        """What an entry is valid for beyond its tokens: model revision and dtype (template added)."""
        self.shape = shape
        self.per_token = per_token
        """Bytes of one token's keys and values: which heads could ever be kept."""

    def build_all(
        self,
        groups: Sequence[Group],
        *,
        device: torch.device,
        attention_backend: str,
        sliding_window: int | None,
        pad_to: Callable[[int], int | None] | None = None,
    ) -> list[Forward]:
        """Every forward of one batch: per group, its head stages (empty groups: no rows to read), then
        its pieces. A head one group computes is attended to by the later groups (they run after it).
        `pad_to` (a CUDA graph's bucket) applies to a forward with no prefix only: the hit sequences
        must be the stream's tail, and a prefixed batch has no graph."""
        heads: dict[PrefixKey, _Head] = {}
        forwards: list[Forward] = []
        options = _BatchOptions(device, attention_backend, sliding_window)
        for group in groups:
            stages, pieces = self._plan(group, heads)
            forwards.extend(([], _stage_batch(stage, options)) for stage in stages)
            ordered = pieces.front + pieces.hits
            batch = build_forward_batch(
                [piece for _, piece in ordered],
                device=device,
                attention_backend=attention_backend,
                sliding_window=sliding_window,
                pad_to=None if pieces.hits else pad_to,
            )
            if pieces.hits:
                batch = _with_prefixes(batch, pieces, attention_backend, device.type == "cuda")
            forwards.append((ordered, batch))
        return forwards

    def commit(self, batch: ForwardBatch) -> None:
        """After a forward succeeded: the prefixes it filled join the cache (`PrefixCache.insert`)."""
        if isinstance(batch.attention, PrefixedMetadata):
            for entry in batch.attention.filled:
                if not isinstance(entry, PrefixEntry):  # the attention stage knows entries by protocol only
                    raise TypeError(f"a prefix entry no planner made: {type(entry).__name__}")
                self.cache.insert(entry)

    def _keys(self, piece: PreparedJob) -> list[PrefixKey]:
        """The piece's cacheable heads, shortest first: its marks whose states fit in the cache."""
        leading = piece.query if piece.packed else piece.items[0]
        template = piece.template.hash if piece.template is not None else ""
        namespace = (*self.namespace, template)
        fixed = self.shape.state_bytes
        marks = sorted(m for m in piece.prefix_marks if self.cache.fits(m, self.per_token, fixed))
        return [(namespace, tuple(leading[:mark])) for mark in marks]

    def _plan(self, group: Group, heads: dict[PrefixKey, _Head]) -> tuple[list[_Stage], _Stage]:
        stages: list[_Stage] = []
        pieces = _Stage()
        hits = misses = 0
        for index, piece in group:
            keys = self._keys(piece)
            if not keys:
                pieces.front.append((index, piece))
                continue
            found = self._find(keys, heads)
            hits, misses = (hits + 1, misses) if found >= 0 else (hits, misses + 1)
            for rank in range(found + 1, len(keys)):
                shorter = heads[keys[rank - 1]] if rank else None
                heads[keys[rank]] = self._compute(keys[rank], shorter, index, piece, stages)
            head = heads[keys[-1]]
            computed = 0
            if head.owner is not None and (piece.packed or index not in head.claimed):
                computed = head.entry.length - head.base
                head.claimed.add(index)
            source = pieces.source(head.entry)
            pieces.hits.append((index, _cut(piece, head.entry.length, source, computed)))
        self.cache.count(hits, misses)
        return stages, pieces

    def _find(self, keys: list[PrefixKey], heads: dict[PrefixKey, _Head]) -> int:
        """The rank in `keys` of the longest head this batch already has or the cache holds; -1: none.
        A head this batch computes but has not admitted is sighted again (a batch-mate with the same
        head is its second sighting)."""
        for rank in range(len(keys) - 1, -1, -1):
            key = keys[rank]
            head = heads.get(key)
            if head is not None:
                if not head.entry.admitted:
                    head.entry.admitted = self.cache.sight(key)
                return rank
            entry = self.cache.lookup(key)
            if entry is not None:
                heads[key] = _Head(entry, stage=-1, base=entry.length)
                return rank
        return -1

    def _compute(
        self, key: PrefixKey, shorter: _Head | None, index: int, piece: PreparedJob, stages: list[_Stage]
    ) -> _Head:
        """Plan the head `key` for job `index`: a fill of its tokens, or an extension of `shorter`."""
        entry = self.shape.entry(key, admitted=self.cache.sight(key))
        stage_number = 0 if shorter is None else shorter.stage + 1
        while len(stages) <= stage_number:
            stages.append(_Stage())
        stage = stages[stage_number]
        tokens = _head_piece(piece, list(key[1]))
        if shorter is None:
            stage.fillers.append((stage.source(entry), len(stage.front)))
            stage.front.append((index, tokens))
            return _Head(entry, stage_number, base=0, owner=index)
        source = stage.source(shorter.entry)
        stage.hits.append((index, _cut(tokens, shorter.entry.length, source)))
        stage.extends.append((stage.source(entry), source, len(stage.hits) - 1))
        return _Head(entry, stage_number, base=shorter.base, owner=index)


def _head_piece(piece: PreparedJob, tokens: list[int]) -> PreparedJob:
    """A head's tokens as a plain pair of their own (its one scoring row is never read)."""
    return dataclasses.replace(
        piece, query=[], items=[tokens], packed=False, num_tokens=len(tokens), token_types=None, chunks=None
    )


def _cut(piece: PreparedJob, length: int, source: int, computed: int = 0) -> CachedPiece:
    """`piece` without its first `length` leading tokens (of the query, or of each pair)."""
    values = {f.name: getattr(piece, f.name) for f in dataclasses.fields(PreparedJob) if f.init}
    if piece.packed:
        values["query"] = piece.query[length:]
    else:
        values["items"] = [item[length:] for item in piece.items]
    return CachedPiece(**values, cached=length, source=source, computed=computed)


@dataclass(frozen=True)
class _BatchOptions:
    """What every forward of one batch is built with (`build_forward_batch`'s settings)."""

    device: torch.device
    attention_backend: str
    sliding_window: int | None


def _stage_batch(stage: _Stage, options: _BatchOptions) -> ForwardBatch:
    """The forward that computes one stage's heads (fills in front, extensions as hits)."""
    batch = build_forward_batch(
        [piece for _, piece in stage.front + stage.hits],
        device=options.device,
        attention_backend=options.attention_backend,
        sliding_window=options.sliding_window,
    )
    return _with_prefixes(batch, stage, options.attention_backend, options.device.type == "cuda")


def _sequence_owners(pieces: list[PreparedJob]) -> tuple[list[int], list[int]]:
    """The piece that opens each sequence of the stream, in stream order, and each piece's first
    sequence: the grouping rule of `engine/pack/batch.py` (packed pieces with equal `query_key` share one
    sequence; a pair is a sequence of its own)."""
    owners: list[int] = []
    first: list[int] = []
    opened: dict[tuple[int, ...], int] = {}
    for position, piece in enumerate(pieces):
        if piece.packed:
            if piece.query_key not in opened:
                opened[piece.query_key] = len(owners)
                owners.append(position)
            first.append(opened[piece.query_key])
        else:
            first.append(len(owners))
            owners.extend([position] * len(piece.items))
    return owners, first


def _with_prefixes(batch: ForwardBatch, plan: _Stage, backend: str, pin: bool) -> ForwardBatch:
    layout = batch.layout
    owners, first_seq = _sequence_owners([piece for _, piece in plan.front + plan.hits])
    if len(owners) != len(layout.seq_starts):
        raise RuntimeError("prefix cache: the batch's sequences are not those the plan expected")
    count = sum(1 for owner in owners if owner < len(plan.front))
    front_tokens = layout.seq_starts[count] if count < len(owners) else layout.total_tokens
    positions = batch.positions.clone()
    sequences = []
    for seq in range(count, len(owners)):
        piece = plan.hits[owners[seq] - len(plan.front)][1]
        assert isinstance(piece, CachedPiece)
        start, length = layout.seq_starts[seq], layout.seq_lens[seq]
        positions[start : start + length] += piece.cached
        cuts = layout.cuts[seq] if layout.cuts is not None else ()
        sequences.append(
            HitSequence(start, layout.prefix_lens[seq], layout.item_lens[seq], piece.source, cuts)
        )
    front_layout = AttentionLayout(
        seq_starts=layout.seq_starts[:count],
        seq_lens=layout.seq_lens[:count],
        prefix_lens=layout.prefix_lens[:count],
        item_lens=layout.item_lens[:count],
        sliding_window=layout.sliding_window,
        cuts=layout.cuts[:count] if layout.cuts is not None else None,
    )
    fills = [(source, layout.seq_starts[first_seq[position]]) for source, position in plan.fillers]
    hit_start = [
        layout.seq_starts[first_seq[len(plan.front) + position]] for position in range(len(plan.hits))
    ]
    extends = tuple((entry, shorter, hit_start[position]) for entry, shorter, position in plan.extends)
    attention = PrefixedMetadata.build(
        layout,
        prepare_attention(front_layout, backend, pin) if count else None,
        front_tokens,
        plan.entries,
        fills,
        sequences,
        pin,
        extends,
        backend,
    )
    return dataclasses.replace(batch, positions=host(positions, pin), attention=attention)


def prefix_planner(model: LoadedModel, setting_mb: int, revision: str) -> PrefixPlanner | None:
    """The served model's prefix cache, or None where it is off or cannot be exact.

    Off for models with a sliding window (a cached key may fall out of a later token's window) and for
    models whose layers are not plain causal attention (`mis_block_reason`: an encoder's is always set,
    `engine/load/encoder.py`). A hybrid decoder's entry keeps its
    attention layers' keys and values and each Gated DeltaNet layer's state and convolution window at
    the prefix's end (`engine/recurrent/`): a fixed size per entry beside the keys and values per token."""
    if setting_mb == 0 or model.sliding_window is not None:
        return None
    if model.mis_block_reason is not None:
        return None
    config = model.model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    layers = int(config.num_hidden_layers)
    shape = EntryShape(layers)
    if model.recurrent is not None:
        types = list(getattr(config, "layer_types", None) or ())
        stateless = frozenset(n for n, kind in enumerate(types) if kind == "linear_attention")
        shape = EntryShape(layers, stateless, model.recurrent.layers, model.recurrent.state_bytes)
    namespace = (revision, str(model.dtype).removeprefix("torch."))
    per_token = bytes_per_token(layers - len(shape.stateless), kv_heads, head_dim, model.dtype)
    cache = PrefixCache(capacity_bytes(setting_mb, per_token))
    return PrefixPlanner(cache, namespace, shape, per_token)
