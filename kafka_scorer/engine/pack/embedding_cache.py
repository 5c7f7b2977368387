"""Document token embeddings kept on the device across queries: a document re-ranked against many
queries is encoded once.

A ColBERT document's vectors depend on its token ids alone (the query is encoded on its own), so an
entry is keyed by the hash of those ids; the cache belongs to one loaded model, and its namespace (model
revision, dtype) is part of every key so an entry is never read for another checkpoint. Memory is bounded
by `capacity_bytes` (the `embedding_cache_mb` setting); the least recently used entries go first.

Looked up on the packing thread, filled on the device thread after a forward succeeds, so every method
takes the lock. A planned hit holds its tensor, so an eviction in between frees the memory afterwards.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from kafka_scorer.engine.pack.lru import ByteBoundedLru

EntryKey = tuple[tuple[str, ...], bytes]
"""(namespace: model revision, dtype; the hash of the input's token ids or pixels)."""

AUTO_MB = 256
"""`embedding_cache_mb=-1` (auto): about a million 128-dim bfloat16 token vectors."""


@dataclass(frozen=True)
class EmbeddingCacheStats:
    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int
    capacity_bytes: int


def embedding_capacity_bytes(setting_mb: int) -> int:
    """-1: auto; 0: off; else that many MiB."""
    return (AUTO_MB if setting_mb < 0 else setting_mb) << 20


class EmbeddingCache:
    def __init__(self, capacity_bytes: int, namespace: tuple[str, ...]) -> None:
        self.capacity_bytes = capacity_bytes
        self.namespace = namespace
        self._store: ByteBoundedLru[tuple[tuple[str, ...], bytes], torch.Tensor] = ByteBoundedLru(
            capacity_bytes
        )
        self._lock = threading.Lock()
        self._hits = self._misses = 0

    def get(self, key: bytes) -> torch.Tensor | None:
        found = self._store.get((self.namespace, key))
        with self._lock:
            if found is None:
                self._misses += 1
            else:
                self._hits += 1
        return found

    def put(self, key: bytes, vectors: torch.Tensor) -> None:
        """Keep `vectors` (a tensor of its own, not a view of a batch's) unless it alone is over the bound."""
        self._store.put((self.namespace, key), vectors, vectors.numel() * vectors.element_size())

    def clear(self) -> None:
        self._store.clear()

    def stats(self) -> EmbeddingCacheStats:
        usage = self._store.usage()
        with self._lock:
            hits, misses = self._hits, self._misses
        return EmbeddingCacheStats(
            hits, misses, usage.evictions, usage.entries, usage.bytes, self.capacity_bytes
        )
