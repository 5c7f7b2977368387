"""The prefix cache: per-layer key/value states of recurring leading token runs, kept on the device.

A decoder's keys and values at positions 0..C-1 depend only on those C token ids (causal attention,
RoPE applied from the positions alone), so a prompt head that recurs across jobs (a template's rubric
with its instruction filled in, a query sent again with more items) can be computed once per worker
and attended to by every later job that starts with it: the job runs only its remaining tokens, at
positions C and on.

Entries are keyed by a namespace (model revision, dtype, template hash) and the exact token ids, so
an entry is never used for another model, dtype or template. Memory is bounded by `capacity_bytes`;
the least recently used entries go first. A prefix may evict others from its second sighting on (`Sightings`):
one seen once is kept only where there is room, so a unique query never evicts a template's rubric.

The cache is read and changed from two threads (the packing thread plans hits, the device thread
inserts filled entries after a forward), so every method takes the lock. A planned hit holds its
entry object, so an eviction between planning and the forward only frees the memory afterwards.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from kafka_scorer.engine.pack.lru import ByteBoundedLru

PrefixKey = tuple[tuple[str, ...], tuple[int, ...]]
"""(namespace: model revision, dtype, template hash; the prefix's token ids)."""


@dataclass(eq=False)
class PrefixEntry:
    """The states of one prefix: one [Hkv, C, d] key and value pair per attention layer and, for a
    hybrid model, each Gated DeltaNet layer's convolution window and recurrent state at its end.

    Created empty when a forward is planned to compute it (a fill), filled layer by layer by the
    attention function (and the stateful layers) during that forward, and inserted into the cache only
    after the forward succeeded (`complete`); one not `admitted` (seen for the first time) only where
    the cache has room for it (`PrefixCache.insert`)."""

    key: PrefixKey
    num_layers: int
    keys: list[torch.Tensor | None] = field(default_factory=list)
    values: list[torch.Tensor | None] = field(default_factory=list)
    admitted: bool = True
    stateless: frozenset[int] = frozenset()
    """Layers without keys and values: a hybrid's Gated DeltaNet layers (their state is `states`)."""
    recurrent: int = 0
    """Gated DeltaNet layers, in their order in the model (`recurrent/gated_delta.py`'s `slot`)."""
    states: list[torch.Tensor | None] = field(default_factory=list)
    """Per Gated DeltaNet layer: the recurrent state after the prefix's last token."""
    windows: list[torch.Tensor | None] = field(default_factory=list)
    """Per Gated DeltaNet layer: its convolution's inputs at the prefix's last tokens [W, C]."""

    def __post_init__(self) -> None:
        if not self.keys:
            self.keys = [None] * self.num_layers
            self.values = [None] * self.num_layers
        if not self.states:
            self.states = [None] * self.recurrent
            self.windows = [None] * self.recurrent

    @property
    def length(self) -> int:
        return len(self.key[1])

    @property
    def complete(self) -> bool:
        attention = [n for n in range(self.num_layers) if n not in self.stateless]
        kv = all(self.keys[n] is not None and self.values[n] is not None for n in attention)
        return kv and all(t is not None for t in (*self.states, *self.windows))

    @property
    def nbytes(self) -> int:
        tensors = (*self.keys, *self.values, *self.states, *self.windows)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def store(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Copies (a slice of a layer's [Hkv, T, d] would keep the whole batch's states alive)."""
        self.keys[layer] = keys.clone()
        self.values[layer] = values.clone()

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[index], self.values[index]
        if keys is None or values is None:
            raise RuntimeError(f"prefix entry of {self.length} tokens has no states for layer {index}")
        return keys, values

    def store_state(self, slot: int, state: torch.Tensor, window: torch.Tensor) -> None:
        """Gated DeltaNet layer `slot`'s state and convolution window at the prefix's end (copies)."""
        self.states[slot] = state.clone()
        self.windows[slot] = window.clone()

    def state(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(recurrent state, convolution window) of Gated DeltaNet layer `slot`."""
        state, window = self.states[slot], self.windows[slot]
        if state is None or window is None:
            raise RuntimeError(
                f"prefix entry of {self.length} tokens has no state for recurrent layer {slot}"
            )
        return state, window


@dataclass(frozen=True)
class PrefixCacheStats:
    """Plain counters for the worker's metrics (the worker imports no torch)."""

    hits: int
    """Job pieces that attended to a prefix already in the cache."""
    misses: int
    """Job pieces with a cacheable prefix that was not in the cache (computed, perhaps admitted)."""
    evictions: int
    entries: int
    bytes: int
    peak_bytes: int
    capacity_bytes: int


class Sightings:
    """Hashes of recently seen prefixes, bounded: a prefix is worth caching once it has come back."""

    def __init__(self, size: int = 4096) -> None:
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._size = size

    def sight(self, key: PrefixKey) -> bool:
        """Record `key`; True when it was seen before (a hash collision only admits a prefix early)."""
        digest = hash(key)
        again = digest in self._seen
        self._seen[digest] = None
        self._seen.move_to_end(digest)
        while len(self._seen) > self._size:
            self._seen.popitem(last=False)
        return again


class PrefixCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._store: ByteBoundedLru[PrefixKey, PrefixEntry] = ByteBoundedLru(capacity_bytes)
        self._sightings = Sightings()
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    def lookup(self, key: PrefixKey) -> PrefixEntry | None:
        """The entry for exactly `key`, marked most recently used; None when absent."""
        return self._store.get(key)

    def fits(self, tokens: int, per_token: int, fixed: int = 0) -> bool:
        """Whether a prefix of `tokens` could ever be kept: one larger than the whole cache never hits.
        `fixed`: the bytes of an entry whatever its length (a hybrid's recurrent states)."""
        return tokens * per_token + fixed <= self.capacity_bytes

    def sight(self, key: PrefixKey) -> bool:
        """Whether `key` has been seen before (and remember it now): admission on the second sighting."""
        with self._lock:
            return self._sightings.sight(key)

    def count(self, hits: int, misses: int) -> None:
        with self._lock:
            self._hits += hits
            self._misses += misses

    def insert(self, entry: PrefixEntry) -> None:
        """Keep a filled entry, evicting the least recently used ones to stay within the capacity.

        An entry larger than the whole capacity is dropped; a key already present (two forwards that
        both filled it) keeps the first copy. A prefix seen once (not `admitted`) is kept only where
        the cache has room for it: it never evicts another, so a stream of unique queries never pushes
        out a template's head; kept all the same, its job's next call hits what its first call used."""
        if entry.complete:
            self._store.put(entry.key, entry, entry.nbytes, evict=entry.admitted, replace=False)

    def stats(self) -> PrefixCacheStats:
        usage = self._store.usage()
        with self._lock:
            hits, misses = self._hits, self._misses
        return PrefixCacheStats(
            hits=hits,
            misses=misses,
            evictions=usage.evictions,
            entries=usage.entries,
            bytes=usage.bytes,
            peak_bytes=usage.peak_bytes,
            capacity_bytes=self.capacity_bytes,
        )

    def clear(self) -> None:
        self._store.clear()


AUTO_TOKENS = 8192
"""`prefix_cache_mb=-1` (auto) sizes the cache for this many prefix tokens of the served model..."""
AUTO_MAX_MB = 512
"""...but never more than this, so a large model on a small host keeps its memory for batches."""


def bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Keys and values of one token in every layer."""
    return 2 * num_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def capacity_bytes(setting_mb: int, per_token: int) -> int:
    """The cache's bound from the `prefix_cache_mb` setting: -1 auto, 0 off, else that many MiB."""
    if setting_mb < 0:
        return min(AUTO_TOKENS * per_token, AUTO_MAX_MB << 20)
    return setting_mb << 20
