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
from collections import OrderedDict
from dataclasses import dataclass

import torch

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
        self._entries: OrderedDict[tuple[tuple[str, ...], bytes], torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self._size = self._hits = self._misses = self._evictions = 0

    def get(self, key: bytes) -> torch.Tensor | None:
        with self._lock:
            found = self._entries.get((self.namespace, key))
            if found is None:
                self._misses += 1
                return None
            self._entries.move_to_end((self.namespace, key))
            self._hits += 1
            return found

    def put(self, key: bytes, vectors: torch.Tensor) -> None:
        """Keep `vectors` (a tensor of its own, not a view of a batch's) unless it alone is over the bound."""
        size = vectors.numel() * vectors.element_size()
        if size > self.capacity_bytes:
            return
        with self._lock:
            full_key = (self.namespace, key)
            old = self._entries.pop(full_key, None)
            if old is not None:
                self._size -= old.numel() * old.element_size()
            while self._entries and self._size + size > self.capacity_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._size -= evicted.numel() * evicted.element_size()
                self._evictions += 1
            self._entries[full_key] = vectors
            self._size += size

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._size = 0

    def stats(self) -> EmbeddingCacheStats:
        with self._lock:
            return EmbeddingCacheStats(
                self._hits, self._misses, self._evictions, len(self._entries), self._size, self.capacity_bytes
            )
