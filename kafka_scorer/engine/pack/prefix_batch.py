"""A forward's jobs against the prefix cache: which pieces hit, which fill, and the batch that runs them.

On the packing thread, before the batch is built:
1. Each piece with prefix marks (`engine/prepare/prefix_marks.py`) looks its marks up, longest first, in this
   forward's prefixes and then in the cache: a hit runs only its tokens after the prefix.
2. A piece that misses sights its marks; a mark seen before is admitted: this piece fills it (runs in
   full, its sequence's first C states are kept per layer) and every later piece of the forward with
   the same prefix hits it. A pair job that fills runs its first pair in full and its other pairs as
   hits, so even one job computes its shared head once. A piece that hits still sights its marks
   longer than the hit; one seen before is admitted and *extended* from the hit (the shorter prefix's
   states, then the piece's own first tokens'), so a query that comes back is kept whole once its
   template's head is cached, without running the head again.
3. The batch is built by `build_forward_batch` over the front pieces (in full) then the hit pieces
   (cut), so the hit sequences are the stream's tail; their positions are moved up by their prefix
   length and the attention metadata wraps the backend's (for the front) with the hits'
   (`engine/attention/cached.py`).
The forward's group is returned in that order; pieces of one job stay in item order, so the device
thread's row bookkeeping is unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kafka_scorer.engine.attention.cached import HitSequence, PrefixedMetadata
from kafka_scorer.engine.attention.layout import AttentionLayout, host
from kafka_scorer.engine.attention.registry import prepare_attention
from kafka_scorer.engine.load.loaded_model import LoadedModel
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


@dataclass
class CachedPiece(PreparedJob):
    """A piece whose first `cached` leading tokens (of the query, or of every pair) come from a prefix."""

    cached: int = 0
    source: int = 0
    """Index of the prefix in the forward's `PrefixedMetadata.entries`."""

    @property
    def query_key(self) -> tuple[int, ...]:
        """Cut queries only share a sequence when their prefixes are the same too."""
        return (-1 - self.source, *self.query)


def cached_tokens(so_far: int, piece: PreparedJob) -> int:
    """A job's prompt tokens served from a prefix, `so_far` plus `piece`'s: every pair's cached head
    counts, but a packed job's once, as its `num_tokens` counts its query once however many pieces
    repeat it. So `prompt_tokens + cached_tokens` is what the job reports without the cache."""
    if not isinstance(piece, CachedPiece):
        return so_far
    return max(so_far, piece.cached) if piece.packed else so_far + piece.cached * len(piece.items)


@dataclass
class _Plan:
    front: Group
    hits: Group
    entries: list[PrefixEntry]
    fillers: list[tuple[int, int]]
    """(entry index, position in `front` of the piece that fills it)."""
    extends: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    """(entry index, index of the shorter entry it extends, position in `hits` of the piece whose
    first tokens complete it)."""


class PrefixPlanner:
    def __init__(self, cache: PrefixCache, namespace: tuple[str, ...], num_layers: int) -> None:
        self.cache = cache
        self.namespace = namespace
        """What an entry is valid for beyond its tokens: model revision and dtype (template added)."""
        self.num_layers = num_layers

    def build(
        self,
        group: Group,
        *,
        device: torch.device,
        attention_backend: str,
        sliding_window: int | None,
        pad_to: Callable[[int], int | None] | None = None,
    ) -> tuple[Group, ForwardBatch]:
        """`pad_to` (a CUDA graph's bucket) applies to a forward with no prefix hit or fill only: the
        hit sequences must be the stream's tail, and a prefixed batch has no graph."""
        plan = self._plan(group)
        ordered = plan.front + plan.hits
        plain = not plan.hits and not plan.fillers
        batch = build_forward_batch(
            [piece for _, piece in ordered],
            device=device,
            attention_backend=attention_backend,
            sliding_window=sliding_window,
            pad_to=pad_to if plain else None,
        )
        if plain:
            return ordered, batch
        return ordered, _with_prefixes(batch, plan, attention_backend, device.type == "cuda")

    def commit(self, batch: ForwardBatch) -> None:
        """After a forward succeeded: the prefixes it filled join the cache."""
        if isinstance(batch.attention, PrefixedMetadata):
            for entry in batch.attention.filled:
                self.cache.insert(entry)

    def _key(self, piece: PreparedJob, length: int) -> PrefixKey:
        leading = piece.query if piece.packed else piece.items[0]
        template = piece.template.hash if piece.template is not None else ""
        return (*self.namespace, template), tuple(leading[:length])

    def _plan(self, group: Group) -> _Plan:
        plan = _Plan([], [], [], [])
        known: dict[PrefixKey, int] = {}
        hits = misses = 0
        for index, piece in group:
            if not piece.prefix_marks:
                plan.front.append((index, piece))
                continue
            keys = [self._key(piece, mark) for mark in piece.prefix_marks]
            found = self._find(keys, known)
            # Keys longer than the one found are still sighted: a template's head in the cache must not
            # keep the whole query (the same query again) from being admitted in its turn.
            longer = keys if found is None else keys[: found[0]]
            admitted = [key for key in longer if self.cache.sight(key)]
            if found is not None:
                hits += 1
                rank, entry = found
                source = self._use(keys[rank], entry, known, plan.entries)
                plan.hits.append((index, _cut(piece, plan.entries[source].length, source)))
                if admitted:  # the hit's first tokens complete the longer cut: it extends the found one
                    known[admitted[0]] = len(plan.entries)
                    plan.extends.append((len(plan.entries), source, len(plan.hits) - 1))
                    plan.entries.append(PrefixEntry(admitted[0], self.num_layers))
                continue
            misses += 1
            if not admitted:
                plan.front.append((index, piece))
                continue
            source = known[admitted[0]] = len(plan.entries)
            plan.entries.append(PrefixEntry(admitted[0], self.num_layers))
            first = piece if piece.packed or len(piece.items) == 1 else piece.piece(0, 1, piece.num_tokens)
            plan.fillers.append((source, len(plan.front)))
            plan.front.append((index, first))
            if first is not piece:
                rest = piece.piece(1, len(piece.items), piece.num_tokens)
                plan.hits.append((index, _cut(rest, len(admitted[0][1]), source)))
        self.cache.count(hits, misses)
        return plan

    def _find(
        self, keys: list[PrefixKey], known: dict[PrefixKey, int]
    ) -> tuple[int, PrefixEntry | None] | None:
        """The rank in `keys` of the longest one this forward already uses (entry None) or the cache
        holds (its entry); None when no key is either."""
        for rank, key in enumerate(keys):
            if key in known:
                return rank, None
            entry = self.cache.lookup(key)
            if entry is not None:
                return rank, entry
        return None

    @staticmethod
    def _use(
        key: PrefixKey, entry: PrefixEntry | None, known: dict[PrefixKey, int], entries: list[PrefixEntry]
    ) -> int:
        """The forward's index of the prefix `key` (a cached `entry` joins the forward's entries)."""
        if entry is not None:
            known[key] = len(entries)
            entries.append(entry)
        return known[key]


def _cut(piece: PreparedJob, length: int, source: int) -> CachedPiece:
    """`piece` without its first `length` leading tokens (of the query, or of each pair)."""
    values = {f.name: getattr(piece, f.name) for f in dataclasses.fields(PreparedJob) if f.init}
    if piece.packed:
        values["query"] = piece.query[length:]
    else:
        values["items"] = [item[length:] for item in piece.items]
    return CachedPiece(**values, cached=length, source=source)


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


def _with_prefixes(batch: ForwardBatch, plan: _Plan, backend: str, pin: bool) -> ForwardBatch:
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

    Off for encoders (bidirectional: a prefix's states depend on what follows it), for models with a
    sliding window (a cached key may fall out of a later token's window) and for models whose layers
    are not plain causal attention (`mis_block_reason`) or carry state along the sequence (hybrid
    decoders: the cache keeps attention keys and values, not a Gated DeltaNet layer's state at the
    prefix's end)."""
    if setting_mb == 0 or model.encoder is not None or model.sliding_window is not None:
        return None
    if model.mis_block_reason is not None or model.recurrent is not None:
        return None
    config = model.model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    layers = int(config.num_hidden_layers)
    capacity = capacity_bytes(setting_mb, bytes_per_token(layers, kv_heads, head_dim, model.dtype))
    namespace = (revision, str(model.dtype).removeprefix("torch."))
    return PrefixPlanner(PrefixCache(capacity), namespace, layers)
